"""The orchestrator faults of a lifecycle chaos run, each made once when its moment comes.

The harness calls `tick` about twice a second with the upgrade run's task instances and
the upgrade record's phase:

- `kill_handover_task`: the handover task runs and green is handing over (the record is
  `handover_requested`, `handing_over` or `live`): SIGKILL the task's process (the task
  runner, `airflow worker -- {ti id}`). Its supervisor reports it failed; Airflow retries
  it, and the retry must resume the wait, not request a second handover or strand it.
- `kill_triggerer_in_probation`: probation is deferred and its trigger is assigned to a
  triggerer: SIGKILL the triggerer's process group and start a new one. The trigger must
  move to it and end the probation.
- `restart_scheduler`: the validate task runs in a worker slot: stop the scheduler as a
  service manager would (SIGTERM to its group, SIGKILL after 10 s; its LocalExecutor
  workers and task processes go with it) and start a new one.
- `kill_scheduler`: the handover task runs and green is handing over: SIGKILL the
  scheduler's group (the scheduler, its LocalExecutor worker and the task process: a
  crashed host) and start a new one. Nobody reports the task's end: the new scheduler
  finds it without a heartbeat and fails it for a retry
  (`[scheduler] task_instance_heartbeat_timeout`, 60 s here).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

from infra.components.airflow import AirflowServices
from tests.support.lifecycle_chaos.airflow_control import TaskState, task_processes, trigger_owner

HANDING_OVER = ("handover_requested", "handing_over", "live")


class OrchestratorFaults:
    """Makes each of `actions` once, when its moment comes; `done` says what was done."""

    def __init__(
        self, actions: tuple[str, ...], services: AirflowServices, say: Callable[[str], None]
    ) -> None:
        self.pending = list(actions)
        self.services = services
        self.say = say
        self.done: dict[str, dict[str, Any]] = {}

    def tick(self, tasks: dict[str, TaskState], phase: str | None) -> None:
        for action in list(self.pending):
            made = getattr(self, f"_{action}")(tasks, phase)
            if made is not None:
                self.pending.remove(action)
                self.done[action] = {**made, "phase": phase, "at": time.time()}
                self.say(f"fault {action}: {made}")

    def _kill_handover_task(
        self, tasks: dict[str, TaskState], phase: str | None
    ) -> dict[str, Any] | None:
        task = tasks.get("handover")
        if task is None or task.state != "running" or phase not in HANDING_OVER:
            return None
        processes = task_processes(task.ti_id)
        if not processes:
            return None  # not forked yet: the next tick
        for process in processes:
            os.kill(process.pid, signal.SIGKILL)
        return {"task": str(task), "pids": [p.pid for p in processes]}

    def _kill_triggerer_in_probation(
        self, tasks: dict[str, TaskState], phase: str | None
    ) -> dict[str, Any] | None:
        task = tasks.get("probation")
        if task is None or task.state != "deferred" or task.trigger_id is None:
            return None
        owner = trigger_owner(task.trigger_id)
        if owner is None:
            return None  # not picked up yet: kill it once it runs there
        old = self.services.component("triggerer").pid
        new = self.services.restart("triggerer", grace=0)
        return {"task": str(task), "trigger": task.trigger_id, "killed": old, "new": new.pid}

    def _restart_scheduler(
        self, tasks: dict[str, TaskState], phase: str | None
    ) -> dict[str, Any] | None:
        task = tasks.get("validate")
        if task is None or task.state != "running":
            return None
        old = self.services.component("scheduler").pid
        new = self.services.restart("scheduler", grace=10.0)
        return {"task": str(task), "stopped": old, "new": new.pid}

    def _kill_scheduler(
        self, tasks: dict[str, TaskState], phase: str | None
    ) -> dict[str, Any] | None:
        task = tasks.get("handover")
        if task is None or task.state != "running" or phase not in HANDING_OVER:
            return None
        if not task_processes(task.ti_id):
            return None  # not forked yet: kill it with the scheduler once it runs
        old = self.services.component("scheduler").pid
        new = self.services.restart("scheduler", grace=0)
        return {"task": str(task), "killed": old, "new": new.pid}
