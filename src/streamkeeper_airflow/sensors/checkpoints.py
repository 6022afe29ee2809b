"""Sensors on a job's checkpoints: progress since a baseline, health through a probation."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from streamkeeper_airflow.sensors.base import ControlPlaneSensor

if TYPE_CHECKING:
    from airflow.sdk import Context

    from streamkeeper_airflow.triggers.base import ControlPlaneTrigger


class CheckpointProgressSensor(ControlPlaneSensor):
    """Wait until the job is RUNNING and committed `new_checkpoints` after `baseline`.

    Args:
        new_checkpoints: how many new committed checkpoints (0: RUNNING only).
        baseline: the checkpoint id to count from; None: the job's head when the task starts.
        run_token: follow only the runner started with this token.
    """

    template_fields: Sequence[str] = (
        *ControlPlaneSensor.template_fields,
        "new_checkpoints",
        "baseline",
        "run_token",
    )

    def __init__(
        self,
        *,
        new_checkpoints: int | str = 1,
        baseline: int | str | None = None,
        run_token: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.new_checkpoints = new_checkpoints
        self.baseline = baseline
        self.run_token = run_token

    def make_trigger(self, context: Context, deadline: float) -> ControlPlaneTrigger:
        from streamkeeper_airflow.triggers.checkpoints import CheckpointProgressTrigger

        baseline = self.hook.head_seq(self.job) if self.baseline is None else int(self.baseline)
        return CheckpointProgressTrigger(
            **self._common(deadline),
            baseline_seq=baseline,
            new_checkpoints=int(self.new_checkpoints),
            run_token=self.run_token or None,
        )


class JobHealthySensor(ControlPlaneSensor):
    """Wait until the job stayed healthy on one runner for `probation` seconds; fail at
    the first unhealthy observation (what a blue-green upgrade's green side must pass).

    Args:
        probation: seconds of uninterrupted health.
        tolerate_degraded: DEGRADED (slow, not failing) does not end the probation.
    """

    template_fields: Sequence[str] = (*ControlPlaneSensor.template_fields, "probation")

    def __init__(
        self, *, probation: float | str = 120.0, tolerate_degraded: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.probation = probation
        self.tolerate_degraded = tolerate_degraded

    def make_trigger(self, context: Context, deadline: float) -> ControlPlaneTrigger:
        from streamkeeper_airflow.triggers.checkpoints import JobHealthyTrigger

        report = self.hook.status(self.job)
        epoch = None if report is None or report.runner is None else report.runner.epoch
        return JobHealthyTrigger(
            **self._common(max(deadline, time.time() + float(self.probation) + 60)),
            started_at=time.time(),
            probation=float(self.probation),
            epoch=epoch,
            tolerate_degraded=self.tolerate_degraded,
        )
