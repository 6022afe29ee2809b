"""A sensor on a command's result: e.g. a savepoint sent earlier completed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from streamkeeper_airflow.sensors.base import ControlPlaneSensor

if TYPE_CHECKING:
    from airflow.sdk import Context

    from streamkeeper_airflow.triggers.base import ControlPlaneTrigger


class CommandResultSensor(ControlPlaneSensor):
    """Wait for the job's answer to `command_id`; fail if the command failed.

    Args:
        command_id: the command's id (e.g. the XCom of a SavepointOperator run elsewhere).
        kind: savepoint | stop | cancel, for the messages.
    """

    template_fields: Sequence[str] = (*ControlPlaneSensor.template_fields, "command_id")

    def __init__(self, *, command_id: str, kind: str = "savepoint", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.command_id = command_id
        self.kind = kind

    def make_trigger(self, context: Context, deadline: float) -> ControlPlaneTrigger:
        from streamkeeper_airflow.triggers.commands import CommandResultTrigger

        return CommandResultTrigger(
            **self._common(deadline), command_id=self.command_id, kind=self.kind
        )
