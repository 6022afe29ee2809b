"""A trigger on a command's result (savepoint, stop, cancel).

The runner answers a command between batches (streamkeeper.lineage.commands); this
trigger waits for that answer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from streamkeeper_airflow.secrets import redact_value
from streamkeeper_airflow.triggers.base import Check, ControlPlaneTrigger

if TYPE_CHECKING:
    from streamkeeper_airflow.hooks.streamkeeper import StreamkeeperHook


class CommandResultTrigger(ControlPlaneTrigger):
    """Succeeds with the result once the job answered `command_id` ok; errors if it failed.

    Args:
        command_id: the command's id (deterministic per task instance: a retry re-sends it).
        kind: savepoint | stop | cancel, for the messages.
    """

    def __init__(self, *, command_id: str, kind: str = "command", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.command_id = command_id
        self.kind = kind

    def _kwargs(self) -> dict[str, Any]:
        return {**self._base_kwargs(), "command_id": self.command_id, "kind": self.kind}

    def check(self, hook: StreamkeeperHook, now: float) -> Check:
        result = hook.command_result(self.job, self.command_id)
        if result is None:
            return Check.waiting(f"{self.kind} {self.command_id} not answered yet")
        result = redact_value(result)
        facts = {"command_id": self.command_id, "result": result}
        if result.get("state") == "ok":
            saved = result.get("savepoint_id")
            return Check.success(
                f"{self.kind} {self.command_id} done" + (f": savepoint {saved}" if saved else ""),
                savepoint_id=saved,
                **facts,
            )
        return Check.error(
            f"{self.kind} {self.command_id} failed: {result.get('error')}: {result.get('reason')}",
            **facts,
        )
