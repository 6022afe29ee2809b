"""An event per health change of a job: what schedules its monitor DAG.

`JobHealthTrigger` is an event trigger (`BaseEventTrigger`) for the `AssetWatcher` of a
job's health asset (`streamkeeper_airflow.assets.job_health_asset`). The triggerer reads
the job's status every `poll_interval` seconds through the pyspark-free client (what the
monitor's check reads: `StreamkeeperHook.status`), and fires only when the health
changes, so a healthy job costs no task run at all:

- into an unhealthy state (DEGRADED, FAILING, FAILED, or a rollback left halfway), from a
  healthy one or another unhealthy one; a new failed runner (another epoch) is a change;
- back to healthy after an event said unhealthy (the recovery is recorded): STOPPED, or
  RUNNING with a checkpoint committed since it was last seen unhealthy (what resets the
  restart back-off, `restarts.healthy_again`), not merely a driver that started;
- again every `failed_repeat` seconds while the job stays FAILED: a restart that waited
  out its back-off is still made (`restarts.py`: the wait is checked when the monitor
  runs), and a job whose restarts gave up keeps alerting, as the polling monitor did.

Events:
    `{"job", "event": "unhealthy" | "recovered" | "still_failed", "state", "healthy",
    "previous", "previous_healthy", "reason", "observed_at", "epoch", "head_seq",
    "rewind_pending"}`; `previous` is the state of the last event (None: the first).

What it does not do: remember across triggerer restarts. It holds only its arguments, so
a (re)started trigger takes the health it finds as its baseline. A healthy baseline
fires nothing; an unhealthy one fires at once (`previous` None), as the trigger cannot
know whether the watcher before it reported it: one more monitor run (an alert, a
restart the back-off ledger counts once) costs less than a failure missed until the
safety-net run. A poll that fails is logged (redacted) and retried; a watcher never
gives up.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from streamkeeper_airflow.triggers.base import watch_polls

if TYPE_CHECKING:
    from streamkeeper.client import StatusReport
    from streamkeeper_airflow.hooks.streamkeeper import StreamkeeperHook

DEFAULT_HEALTH_POLL_SECONDS = 15.0
# While a job stays FAILED: the polling monitor's old cadence, so restarts and alerts of
# a failed job come as often as before; a healthy job fires nothing.
DEFAULT_FAILED_REPEAT_SECONDS = 300.0

Change = Literal["unhealthy", "recovered", "still_failed"]


@dataclass(frozen=True)
class HealthReading:
    """One poll of the job's status, reduced to what a health change is made of."""

    state: str | None  # RUNNING, DEGRADED, FAILING, STOPPED, FAILED; None: never ran
    healthy: bool
    reason: str
    epoch: int | None  # the runner's: a new failed runner is a new failure
    head_seq: int  # the lineage's last committed checkpoint, -1 if none
    rewind_pending: bool

    @classmethod
    def of(cls, report: StatusReport | None) -> HealthReading:
        if report is None:
            return cls(None, True, "never ran", None, -1, False)
        return cls(
            state=report.state,
            healthy=report.healthy,
            reason=report.rewind_advice or report.reason,
            epoch=None if report.runner is None else report.runner.epoch,
            head_seq=-1 if report.head is None else report.head.seq,
            rewind_pending=report.rewind_pending is not None,
        )

    @property
    def condition(self) -> tuple[Any, ...] | None:
        """What an unhealthy reading is (None: healthy); a different one is a change."""
        return None if self.healthy else (self.state, self.rewind_pending, self.epoch)


class HealthWatch:
    """Decides, poll by poll, which readings are events (pure; one trigger run's memory).

    Args:
        failed_repeat: seconds after which a job still FAILED fires again.
    """

    def __init__(self, failed_repeat: float = DEFAULT_FAILED_REPEAT_SECONDS) -> None:
        self.failed_repeat = failed_repeat
        self.reported: HealthReading | None = None  # what the last event (or baseline) said
        self.reported_at = 0.0
        self.unhealthy_head = -1  # the head seq when last seen unhealthy

    def observe(self, reading: HealthReading, now: float) -> Change | None:
        """The change `reading` is, if it is one; `now` is a monotonic clock."""
        first, reported = self.reported is None, self.reported
        change: Change | None = None
        if not reading.healthy:
            self.unhealthy_head = reading.head_seq
            if reported is None or reported.condition != reading.condition:
                change = "unhealthy"
            elif reading.state == "FAILED" and now - self.reported_at >= self.failed_repeat:
                change = "still_failed"
        elif first:
            self.reported = reading  # a healthy baseline: nothing to say
        elif reported is not None and not reported.healthy and self._recovered(reading):
            change = "recovered"
        if change is not None:
            self.reported, self.reported_at = reading, now
        return change

    def _recovered(self, reading: HealthReading) -> bool:
        # A driver that merely started is not recovered: it may fail again before its
        # first checkpoint. STOPPED (or never ran) is healthy without one.
        return reading.state != "RUNNING" or reading.head_seq > self.unhealthy_head


class JobHealthTrigger(BaseEventTrigger):
    """Yields an event each time the job's health changes (see the module's docstring).

    Args:
        conn_id: the Airflow connection of the storage root.
        job: the job's name.
        root: the storage root, if not the connection's.
        poll_interval: seconds between status reads.
        failed_repeat: seconds after which a job still FAILED fires again.
    """

    def __init__(
        self,
        *,
        conn_id: str,
        job: str,
        root: str | None = None,
        poll_interval: float = DEFAULT_HEALTH_POLL_SECONDS,
        failed_repeat: float = DEFAULT_FAILED_REPEAT_SECONDS,
    ) -> None:
        super().__init__()
        for name, value in (("poll_interval", poll_interval), ("failed_repeat", failed_repeat)):
            if float(value) <= 0:
                raise ValueError(f"{name} {value!r} is not positive; expected seconds, e.g. 15")
        self.conn_id = conn_id
        self.job = job
        self.root = root
        self.poll_interval = float(poll_interval)
        self.failed_repeat = float(failed_repeat)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{type(self).__module__}.{type(self).__qualname__}", {
            "conn_id": self.conn_id,
            "job": self.job,
            "root": self.root,
            "poll_interval": self.poll_interval,
            "failed_repeat": self.failed_repeat,
        }

    async def run(self) -> AsyncIterator[TriggerEvent]:
        watch = HealthWatch(self.failed_repeat)
        async for reading in watch_polls(
            self,
            self._poll,
            conn_id=self.conn_id,
            root=self.root,
            interval=self.poll_interval,
            what=f"{self.job}: health",
        ):
            previous = watch.reported
            change = watch.observe(reading, time.monotonic())
            if previous is None and change is None:
                self.log.info("%s: watching health from %s", self.job, reading.state)
            if change is not None:
                self.log.info("%s: %s (%s)", self.job, change, reading.state)
                yield TriggerEvent(health_event(self.job, change, reading, previous))

    def _poll(self, hook: StreamkeeperHook) -> HealthReading:
        """The job's health now (in a thread)."""
        return HealthReading.of(hook.status(self.job, missing_ok=True))


def health_event(
    job: str, change: Change, reading: HealthReading, previous: HealthReading | None
) -> dict[str, Any]:
    """The event for one change (JSON: Airflow stores it as the asset event's extra)."""
    return {
        "job": job,
        "event": change,
        "state": reading.state,
        "healthy": reading.healthy,
        "previous": None if previous is None else previous.state,
        "previous_healthy": None if previous is None else previous.healthy,
        "reason": reading.reason,
        "observed_at": time.time(),
        "epoch": reading.epoch,
        "head_seq": reading.head_seq,
        "rewind_pending": reading.rewind_pending,
    }
