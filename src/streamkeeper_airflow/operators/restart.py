"""Restart a FAILED job from its latest checkpoint, with exponential back-off and a limit.

The monitor DAG runs it after its health check. It restarts only a FAILED job (a
DEGRADED or FAILING one still runs), the way the job was last launched (spec, overrides,
master, launcher: from `jobs/{job}/launch.json`), and counts the attempt in
`jobs/{job}/restarts.json` before launching (see `restarts.py`). A retried restart task
attaches to its own driver and is not counted twice.

The launch record lives in storage, where anything that may write under the root could
have edited it: it is held to the same rules as a trigger's Params (launch_policy.py:
its spec under the jobs folder and of this job, its overrides allowed by that spec and
the provider's config, its master allowed) before anything is counted or launched, and
refused whole otherwise. The working directory is never taken from it: it is the DAG's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from streamkeeper_airflow.operators.start import StartJobOperator

if TYPE_CHECKING:
    from airflow.sdk import Context


class RestartJobOperator(StartJobOperator):
    """Restart the job if it is FAILED and the back-off allows; skip otherwise.

    Args:
        enabled: restart at all (False: skip, saying how to turn it on).
        max_attempts: restarts allowed until the job is healthy again.
        backoff: seconds before the second attempt; doubles for each one after.
        max_backoff: the longest wait between attempts.
        reuse_last_launch: launch as the job was last launched by Airflow.
        (the rest as StartJobOperator; start_from defaults to latest_checkpoint and
        new_checkpoints to 0: a restart succeeds once the job runs again)
    """

    template_fields: Sequence[str] = (
        *StartJobOperator.template_fields,
        "enabled",
        "max_attempts",
        "backoff",
        "max_backoff",
    )
    ui_color = "#fdf0d5"

    def __init__(
        self,
        *,
        enabled: bool = True,
        max_attempts: int | str = 3,
        backoff: float | str = 60.0,
        max_backoff: float | str = 1800.0,
        reuse_last_launch: bool = True,
        start_from: str = "latest_checkpoint",
        new_checkpoints: int | str = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(start_from=start_from, new_checkpoints=new_checkpoints, **kwargs)
        self.enabled = enabled
        self.max_attempts = max_attempts
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.reuse_last_launch = reuse_last_launch

    def execute(self, context: Context) -> Any:
        from streamkeeper_airflow.restarts import RestartLedger, RestartPolicy, decide_restart
        from streamkeeper_airflow.starts import run_token_for

        report = self.hook.status(self.job, missing_ok=True)
        state = "UNKNOWN (never ran)" if report is None else report.state
        if report is None or report.state != "FAILED":
            raise AirflowSkipException(f"nothing to restart: job {self.job!r} is {state}")
        if not _true(self.enabled):
            raise AirflowSkipException(
                f"job {self.job!r} FAILED but restarts are off; set the DAG's restart param "
                "or the spec's airflow.restart.enabled"
            )
        policy = RestartPolicy(int(self.max_attempts), float(self.backoff), float(self.max_backoff))
        ledger = RestartLedger(self.hook.store, self.job)
        record, version = ledger.read()
        ti = context["ti"]
        token = run_token_for(ti.dag_id, ti.run_id, ti.task_id, ti.map_index)
        decision = decide_restart(record, policy, token=token, now=time.time())
        self.log.info("job %s FAILED (%s): %s", self.job, report.reason, decision.reason)
        if decision.action == "wait":
            raise AirflowSkipException(decision.reason)
        if decision.action == "give_up":  # the failure callback sends the alert
            raise AirflowFailException(
                f"job {self.job!r} stays FAILED ({report.reason}): {decision.reason}; fix the "
                "cause, then run its start DAG"
            )
        self._reuse_last_launch()  # checked before the attempt is counted
        if decision.action == "restart" and not ledger.record_attempt(
            record, version, token=token, reason=report.reason
        ):
            raise AirflowSkipException("another monitor run is restarting the job")
        return super().execute(context)

    def _reuse_last_launch(self) -> None:
        """Take the spec, overrides, master and launcher of the job's last launch, once
        they pass the checks a trigger's Params pass.

        Raises:
            AirflowFailException: the record asks for what the DAGs do not allow.
        """
        from pathlib import Path

        from streamkeeper.errors import StreamkeeperError
        from streamkeeper_airflow import settings
        from streamkeeper_airflow.starts import latest_launch, launch_key

        record = latest_launch(self.hook.store, self.job) if self.reuse_last_launch else None
        if record is None:
            return
        launched = record.request
        self.spec_path = self._launched_spec(launched)
        self.overrides = {**(launched.get("overrides") or {}), **(self.overrides or {})}
        self.spark_master = self.spark_master or launched.get("master")
        self.launcher = record.launcher or self.launcher
        workdir = str(Path(self.workdir or settings.workdir()).resolve())
        try:
            self.checked_launch(workdir)
        except StreamkeeperError as error:
            raise AirflowFailException(
                f"launch record {launch_key(self.job)} refused: {error}. A restart launches "
                "only what a start may: the record was edited in storage, or the rules "
                f"changed since; run {self.job}.start to launch the job afresh"
            ) from None
        self.log.info("restarting as launched by %s", record.origin or "an earlier start")

    def _launched_spec(self, launched: dict[str, Any]) -> str:
        """The last launch's spec on this worker: by its place in the jobs folder (the
        DAG bundle, whose path differs between workers and bundle versions), else by its
        recorded path; either way confined to the spec folders afterwards."""
        from pathlib import Path, PurePosixPath

        relative = launched.get("spec_in_jobs_folder")
        if isinstance(relative, str) and self.jobs_folder:
            inside = PurePosixPath(relative)
            if not inside.is_absolute() and ".." not in inside.parts:
                return str(Path(self.jobs_folder) / inside)
        return launched.get("spec_path") or self.spec_path


def _true(value: Any) -> bool:
    return value is True or str(value).lower() in ("true", "1", "yes")
