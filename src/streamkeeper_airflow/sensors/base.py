"""What the streamkeeper sensors share: defer to a trigger, or poke with its `check`.

`deferrable` defaults to `[operators] default_deferrable`, as every Airflow provider's
sensors do (Airflow's own default is false: set it to true, or pass deferrable=True, to
free the worker slot while waiting; the DAGs the factory generates wait in operators,
which always defer). With deferrable=False the sensor pokes in its worker with the very
check the trigger runs; the arguments computed at the start (baseline, start time) are
computed once per task try.

Reschedule mode is refused: each reschedule runs `execute` again, so a baseline taken
"when the task starts" would move to the job's head every time and the wait would never
end (Airflow clears a task's XComs on every reschedule, so nothing carries it over).
Deferral frees the worker slot as reschedule does.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowException

from streamkeeper_airflow.hooks.streamkeeper import DEFAULT_CONN_ID, StreamkeeperHook

if TYPE_CHECKING:
    from airflow.sdk import Context

    from streamkeeper_airflow.triggers.base import ControlPlaneTrigger


def default_deferrable() -> bool:
    """`[operators] default_deferrable` (false unless the deployment sets it)."""
    from airflow.sdk import conf

    return conf.getboolean("operators", "default_deferrable", fallback=False)


class ControlPlaneSensor(BaseSensorOperator):
    """Base of the sensors: subclasses build their trigger in `make_trigger`."""

    template_fields: Sequence[str] = ("job", "conn_id", "root")

    def __init__(
        self,
        *,
        job: str,
        conn_id: str = DEFAULT_CONN_ID,
        root: str | None = None,
        deferrable: bool | None = None,
        poke_interval: float = 5.0,
        timeout: float = 900.0,
        **kwargs: Any,
    ) -> None:
        if deferrable is None:
            deferrable = default_deferrable()
        if kwargs.get("mode") == "reschedule" and not deferrable:
            raise ValueError(
                f"{type(self).__name__} {kwargs.get('task_id')!r}: mode='reschedule' is not "
                "supported (every reschedule would start counting again from the job's "
                "current head); use deferrable=True, which frees the worker slot too, or "
                "mode='poke'"
            )
        super().__init__(poke_interval=poke_interval, timeout=timeout, **kwargs)
        self.job = job
        self.conn_id = conn_id
        self.root = root
        self.deferrable = deferrable
        self._trigger: ControlPlaneTrigger | None = None

    @cached_property
    def hook(self) -> StreamkeeperHook:
        return StreamkeeperHook(self.conn_id, root=self.root)

    def make_trigger(self, context: Context, deadline: float) -> ControlPlaneTrigger:
        raise NotImplementedError

    def _common(self, deadline: float) -> dict[str, Any]:
        return {
            "conn_id": self.conn_id,
            "job": self.job,
            "root": self.root,
            "poll_interval": self.poke_interval,
            "deadline": deadline,
        }

    def execute(self, context: Context) -> Any:
        deadline = time.time() + float(self.timeout)
        self._trigger = self.make_trigger(context, deadline)
        if not self.deferrable:
            return super().execute(context)
        self.defer(
            trigger=self._trigger,
            method_name="execute_complete",
            timeout=timedelta(seconds=float(self.timeout) + 60),
        )

    def poke(self, context: Context) -> Any:
        assert self._trigger is not None
        verdict = self._trigger.check(self.hook, time.time())
        if not verdict.done:
            self.log.info("%s", verdict.payload.get("message"))
            return False
        event = self.execute_complete(context, {"job": self.job, **verdict.payload})
        return PokeReturnValue(is_done=True, xcom_value=event)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        if event.get("status") != "success":
            raise AirflowException(event.get("message", "failed"))
        self.log.info("%s", event.get("message"))
        return event
