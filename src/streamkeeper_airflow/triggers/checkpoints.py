"""Triggers on a job's checkpoints: N new ones completed, healthy through a probation window.

`CheckpointProgressTrigger` follows one runner: the one whose heartbeat carries
`run_token` (any runner if None) at an epoch above `after_epoch`, so the heartbeat of
the run before (FAILED, say) is never mistaken for the new one's. While that runner has
not beaten yet, its driver's own beat (lineage/driver_beat.py) tells whether it is still
booting: a driver that exited or stopped beating, wherever it ran, fails the wait at
once, naming its log. A runner whose heartbeat was lost only lately (a storage outage
cuts it off for a while) is waited for, up to LOST_HEARTBEAT_GRACE past the limit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from streamkeeper_airflow import settings
from streamkeeper_airflow.payloads import status_payload
from streamkeeper_airflow.triggers.base import Check, ControlPlaneTrigger

if TYPE_CHECKING:
    from streamkeeper.client import StatusReport
    from streamkeeper_airflow.hooks.streamkeeper import StreamkeeperHook

_ENDED = ("STOPPED", "FINISHED", "FAILED")


class CheckpointProgressTrigger(ControlPlaneTrigger):
    """Succeeds once the followed runner is RUNNING and `new_checkpoints` were committed
    after `baseline_seq`; errors if it fails, stops, or its driver dies first.

    Args:
        baseline_seq: the lineage's head before (-1: none); progress counts after it.
        new_checkpoints: how many new committed checkpoints to wait for (0: RUNNING only).
        run_token: follow the runner started with this token (None: any live runner).
        after_epoch: only a runner of a higher epoch is followed.
        driver: {"host", "log", "launched_at", ...} of the launch (for messages and the
            first-beat grace; never to decide by pid or host).
    """

    def __init__(
        self,
        *,
        baseline_seq: int = -1,
        new_checkpoints: int = 1,
        run_token: str | None = None,
        after_epoch: int = 0,
        driver: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.baseline_seq = int(baseline_seq)
        self.new_checkpoints = int(new_checkpoints)
        self.run_token = run_token
        self.after_epoch = int(after_epoch)
        self.driver = dict(driver) if driver else None

    def _kwargs(self) -> dict[str, Any]:
        return {
            **self._base_kwargs(),
            "baseline_seq": self.baseline_seq,
            "new_checkpoints": self.new_checkpoints,
            "run_token": self.run_token,
            "after_epoch": self.after_epoch,
            "driver": self.driver,
        }

    def check(self, hook: StreamkeeperHook, now: float) -> Check:
        report = hook.status(self.job, missing_ok=True)
        if not self._followed(report):
            return self._not_beaten_yet(hook, report, now)
        assert report is not None and report.runner is not None
        facts = {"status_report": status_payload(report), "run_token": report.runner.run_token}
        if report.lost_lately(now):  # cut off from storage, perhaps: it may beat again
            return Check.waiting(f"{report.runner.state}, {report.reason}", **facts)
        if report.state == "FAILED" or report.runner.state in _ENDED:
            return Check.error(
                f"job {self.job!r} is {report.state} before {self.new_checkpoints} new "
                f"checkpoint(s): {report.reason}",
                **facts,
            )
        new = hook.checkpoints_after(self.job, self.baseline_seq) if self.new_checkpoints else []
        progress = f"{len(new)}/{self.new_checkpoints} new checkpoint(s) after {self.baseline_seq}"
        if report.runner.state == "RUNNING" and len(new) >= self.new_checkpoints:
            return Check.success(
                f"job {self.job!r} is RUNNING (epoch {report.runner.epoch}); {progress}",
                new_checkpoints=new,
                **facts,
            )
        return Check.waiting(f"{report.runner.state}, {progress}", **facts)

    def _followed(self, report: StatusReport | None) -> bool:
        runner = None if report is None else report.runner
        if runner is None or int(runner.epoch or 0) <= self.after_epoch:
            return False
        return self.run_token is None or runner.run_token == self.run_token

    def _not_beaten_yet(
        self, hook: StreamkeeperHook, report: StatusReport | None, now: float
    ) -> Check:
        """Before the runner beats as the job, its driver's own beat says whether it is
        still booting (the control plane only: the driver may run on another host)."""
        driver = self.driver or {}
        if self.run_token is not None:
            beat = hook.driver_beat(self.run_token, now)
            launched_at = driver.get("launched_at")
            gone = None
            if beat.ended:
                gone = beat.describe()
            elif beat.state == "none" and launched_at is not None:
                waited = now - float(launched_at)
                if waited > settings.first_beat_grace():
                    gone = f"its driver never beat in the {waited:.0f}s since its launch"
            if gone is not None:
                return Check.error(
                    f"the driver of job {self.job!r} (run token {self.run_token}) ended "
                    f"before its first heartbeat: {gone}; see its log {driver.get('log')}",
                    status_report=status_payload(report, self.job),
                )
        return Check.waiting(
            f"waiting for the first heartbeat of the runner started with token "
            f"{self.run_token} (after epoch {self.after_epoch})"
        )


class JobHealthyTrigger(ControlPlaneTrigger):
    """Succeeds once the job stayed healthy (RUNNING) from `started_at` for `probation`
    seconds, on one runner; errors at the first unhealthy poll or a change of runner.

    Args:
        started_at: when the probation began (seconds since the epoch).
        probation: how long the job must stay healthy.
        epoch: the runner epoch that must hold throughout (None: the first one seen).
        tolerate_degraded: DEGRADED (slow, not failing) does not end the probation.
    """

    def __init__(
        self,
        *,
        started_at: float,
        probation: float,
        epoch: int | None = None,
        tolerate_degraded: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.started_at = float(started_at)
        self.probation = float(probation)
        self.epoch = epoch
        self.tolerate_degraded = bool(tolerate_degraded)

    def _kwargs(self) -> dict[str, Any]:
        return {
            **self._base_kwargs(),
            "started_at": self.started_at,
            "probation": self.probation,
            "epoch": self.epoch,
            "tolerate_degraded": self.tolerate_degraded,
        }

    def check(self, hook: StreamkeeperHook, now: float) -> Check:
        report = hook.status(self.job)
        assert report is not None
        facts = {"status_report": status_payload(report)}
        epoch = None if report.runner is None else report.runner.epoch
        if self.epoch is not None and epoch != self.epoch:
            return Check.error(
                f"job {self.job!r} changed runner during probation (epoch {self.epoch} -> "
                f"{epoch}): it restarted; {report.state}: {report.reason}",
                **facts,
            )
        fine = ("RUNNING", "DEGRADED") if self.tolerate_degraded else ("RUNNING",)
        if report.state not in fine:
            return Check.error(
                f"job {self.job!r} is {report.state} during probation: {report.reason}", **facts
            )
        healthy_for = now - self.started_at
        if healthy_for >= self.probation:
            return Check.success(
                f"job {self.job!r} stayed healthy for {healthy_for:.0f} s "
                f"(probation {self.probation:.0f} s)",
                **facts,
            )
        return Check.waiting(
            f"healthy for {healthy_for:.0f}/{self.probation:.0f} s: {report.reason}", **facts
        )
