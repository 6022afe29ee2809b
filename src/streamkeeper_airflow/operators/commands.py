"""Commands to a running job over the control plane: savepoint, stop, cancel.

Thin on purpose: the command API (`jobs/{job}/commands/{id}.json`, answered with
`{id}.result.json` by the runner between batches) comes with the savepoint work; these
operators send one command and defer until its result. The command id is derived from
the task instance, so a retried task re-sends the same command, which the job executes
once.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from streamkeeper_airflow.hooks.streamkeeper import DEFAULT_CONN_ID, StreamkeeperHook
from streamkeeper_airflow.links import JOB_LINKS
from streamkeeper_airflow.operators.params import flag

if TYPE_CHECKING:
    from airflow.sdk import Context

FORMATS = ("native", "canonical")


def command_id_for(kind: str, dag_id: str, run_id: str, task_id: str, map_index: int) -> str:
    """One id per task instance and kind, valid for the command API ([A-Za-z0-9_-])."""
    from streamkeeper_airflow.starts import run_token_for

    return f"{kind}-{run_token_for(dag_id, run_id, task_id, map_index)}"


class _CommandOperator(BaseOperator):
    """Send `kind` to the job and wait (deferred) for its result."""

    kind: ClassVar[str]
    template_fields: Sequence[str] = ("job", "conn_id", "root", "result_timeout")
    operator_extra_links = JOB_LINKS

    def __init__(
        self,
        *,
        job: str,
        conn_id: str = DEFAULT_CONN_ID,
        root: str | None = None,
        result_timeout: float | str = 900.0,
        poll_interval: float = 2.0,
        quick_wait: float = 20.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.job = job
        self.conn_id = conn_id
        self.root = root
        self.result_timeout = result_timeout
        self.poll_interval = poll_interval
        self.quick_wait = quick_wait
        self._result: dict[str, Any] | None = None  # the command's answer, for OpenLineage

    @cached_property
    def hook(self) -> StreamkeeperHook:
        return StreamkeeperHook(self.conn_id, root=self.root)

    def command_options(self) -> dict[str, Any]:
        return {}

    def execute(self, context: Context) -> dict[str, Any] | None:
        from streamkeeper_airflow.triggers.commands import CommandResultTrigger

        ti = context["ti"]
        command_id = command_id_for(self.kind, ti.dag_id, ti.run_id, ti.task_id, ti.map_index)
        options = self.command_options()
        self.check_running(command_id)
        sent = self.hook.send_command(self.job, self.kind, command_id=command_id, **options)
        self.log.info("sent %s command %s to job %s", self.kind, sent, self.job)
        timeout = float(self.result_timeout)
        trigger = CommandResultTrigger(
            conn_id=self.conn_id,
            job=self.job,
            root=self.root,
            poll_interval=self.poll_interval,
            deadline=time.time() + timeout,
            command_id=sent,
            kind=self.kind,
        )
        # A running job answers between batches, usually within seconds: wait that long
        # here, and hand only a longer wait to the triggerer.
        quick_until = time.monotonic() + min(float(self.quick_wait), timeout)
        while True:
            verdict = trigger.check(self.hook, time.time())
            if verdict.done:
                return self.execute_complete(context, {"job": self.job, **verdict.payload})
            if time.monotonic() >= quick_until:
                break
            time.sleep(0.5)
        self.defer(
            trigger=trigger,
            method_name="execute_complete",
            timeout=timedelta(seconds=timeout + 60),
        )

    def check_running(self, command_id: str) -> None:
        """A command is executed by the running job: refuse to queue one for nobody (it
        would wait for its timeout), unless this task sent it before (a retry waits for, or
        reads, the answer the job gives).

        Raises:
            AirflowFailException: the job is unknown or not running, naming its state.
        """
        from streamkeeper.errors import StreamkeeperError
        from streamkeeper_airflow.starts import runner_live

        try:
            with self.hook._hidden():
                if self.hook.client.command_sent(self.job, command_id):
                    return
            status = self.hook.status(self.job, settled=True)
        except StreamkeeperError as error:
            raise AirflowFailException(str(error)) from None
        if not runner_live(status):
            assert status is not None
            raise AirflowFailException(
                f"job {self.job!r} is not running ({status.state}: {status.reason}); a "
                f"{self.kind} command is executed by its running job: start it first (the "
                f"{self.job}.start DAG)"
            )

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        self._result = event
        if event.get("status") != "success":
            raise AirflowException(event.get("message", f"{self.kind} failed"))
        self.log.info("%s", event.get("message"))
        return event

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """The savepoint the command took, as a run facet (lineage.py; None without the
        openlineage provider)."""
        from streamkeeper_airflow import lineage

        facets = lineage.savepoint_facet(self.job, self.kind, self._result)
        return lineage.job_lineage(None, run_facets=facets)


def _savepoint_options(format: str, self_contained: Any) -> dict[str, Any]:
    if format not in FORMATS:
        raise AirflowFailException(
            f"savepoint format {format!r} is not one of {', '.join(FORMATS)}"
        )
    return {"format": format, "self_contained": flag("self_contained", self_contained)}


class SavepointOperator(_CommandOperator):
    """Take a savepoint of the running job; returns the result (with `savepoint_id`).

    Args:
        format: native (Spark's files) or canonical (state as Delta tables, by operator uid).
        self_contained: copy the savepoint's files into its folder (portable).
    """

    kind = "savepoint"
    template_fields: Sequence[str] = (
        *_CommandOperator.template_fields,
        "format",
        "self_contained",
    )

    def __init__(self, *, format: str = "native", self_contained: bool = False, **kwargs: Any):
        super().__init__(**kwargs)
        self.format = format
        self.self_contained = self_contained

    def command_options(self) -> dict[str, Any]:
        return _savepoint_options(self.format, self.self_contained)


class StopJobOperator(_CommandOperator):
    """Stop the running job: with a savepoint (default), without one, or cancel it now.

    Args:
        mode: stop (drain at a batch boundary) or cancel (now, no savepoint).
        savepoint: stop only: take a savepoint first.
        format, self_contained: of that savepoint.
    """

    template_fields: Sequence[str] = (
        *_CommandOperator.template_fields,
        "mode",
        "savepoint",
        "format",
        "self_contained",
    )

    def __init__(
        self,
        *,
        mode: str = "stop",
        savepoint: bool = True,
        format: str = "native",
        self_contained: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.mode = mode
        self.savepoint = savepoint
        self.format = format
        self.self_contained = self_contained

    @property
    def kind(self) -> str:  # type: ignore[override]
        if self.mode not in ("stop", "cancel"):
            raise AirflowFailException(f"stop mode {self.mode!r} is not one of stop, cancel")
        return self.mode

    def command_options(self) -> dict[str, Any]:
        if self.mode == "cancel":
            return {}
        return {
            "savepoint": flag("savepoint", self.savepoint),
            **_savepoint_options(self.format, self.self_contained),
        }
