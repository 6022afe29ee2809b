"""The monitor's check: fail, with the reason, when a job is DEGRADED, FAILING or FAILED.

Used with `on_failure_callback=StreamkeeperAlertNotifier(...)`: the failure's message is
the alert. A healthy RUNNING job with a checkpoint since its last restart also resets
the restart back-off (see `restarts.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from streamkeeper_airflow.hooks.streamkeeper import DEFAULT_CONN_ID, StreamkeeperHook
from streamkeeper_airflow.links import JOB_LINKS
from streamkeeper_airflow.payloads import status_payload

if TYPE_CHECKING:
    from airflow.sdk import Context

    from streamkeeper.client import StatusReport


class JobHealthOperator(BaseOperator):
    """Return the job's status payload if it is healthy (RUNNING or STOPPED), else fail.

    Args:
        job: the job's name.
        conn_id: the storage root's connection.
        root: the storage root, overriding the connection's.
    """

    template_fields: Sequence[str] = ("job", "conn_id", "root")
    ui_color = "#e6eef9"
    operator_extra_links = JOB_LINKS

    def __init__(
        self, *, job: str, conn_id: str = DEFAULT_CONN_ID, root: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.job = job
        self.conn_id = conn_id
        self.root = root

    @cached_property
    def hook(self) -> StreamkeeperHook:
        return StreamkeeperHook(self.conn_id, root=self.root)

    def execute(self, context: Context) -> dict[str, Any]:
        report = self.hook.status(self.job, missing_ok=True)
        if report is None:
            raise AirflowSkipException(
                f"job {self.job!r} never ran under {self.hook.root}; start it with its start DAG"
            )
        self._reset_backoff(report)
        payload = status_payload(report)
        self.log.info("job %s is %s: %s", self.job, report.state, report.reason)
        if not report.healthy:
            why = report.rewind_advice or report.reason
            raise AirflowFailException(f"job {self.job!r} is {report.state}: {why}")
        return payload

    def _reset_backoff(self, report: StatusReport) -> None:
        from streamkeeper_airflow.restarts import RestartLedger, healthy_again

        ledger = RestartLedger(self.hook.store, self.job)
        record, version = ledger.read()
        if healthy_again(record, report) and ledger.reset(record, version):
            self.log.info(
                "job %s is healthy again after %d restart(s): restart back-off reset",
                self.job,
                record.attempts,
            )
