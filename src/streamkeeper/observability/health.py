"""Checkpoint health: failed checkpoints, tolerable failures, and the job status model.

A checkpoint fails when its batch exceeds `checkpoint.timeout`, errors, or its upload
or commit fails. Consecutive failures count against `checkpoint.tolerable_failures`
(Flink's tolerableCheckpointFailureNumber); one more fails the job with the reason. A
completed checkpoint resets the count.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Literal

from streamkeeper.errors import CheckpointFailureLimitError

State = Literal["RUNNING", "DEGRADED", "FAILING", "STOPPED", "FAILED"]


class CheckpointHealth:
    """Counts consecutive checkpoint failures; thread-safe."""

    def __init__(self, tolerable_failures: int) -> None:
        self.tolerable = tolerable_failures
        self.consecutive = 0
        self.total = 0
        self.last_reason: str | None = None
        self.last_completed_at: float | None = None
        self._lock = threading.Lock()

    def completed(self) -> None:
        with self._lock:
            self.consecutive = 0
            self.last_completed_at = time.time()

    def failed(self, reason: str) -> None:
        """Record a failed checkpoint.

        Raises:
            CheckpointFailureLimitError: the failure exceeds the tolerable number.
        """
        with self._lock:
            self.consecutive += 1
            self.total += 1
            self.last_reason = reason
            if self.consecutive > self.tolerable:
                raise CheckpointFailureLimitError(
                    f"{self.consecutive} consecutive checkpoint failures exceed "
                    f"checkpoint.tolerable_failures={self.tolerable}; last: {reason}"
                )

    def facts(self) -> dict[str, Any]:
        return {
            "consecutive_failures": self.consecutive,
            "tolerable_failures": self.tolerable,
            "failed_checkpoints": self.total,
            "last_failure": self.last_reason,
            "last_checkpoint_at": self.last_completed_at,
        }


class BatchTimeoutWatch:
    """Flags a running batch that exceeds the checkpoint timeout, once per batch.

    Spark keeps `isTriggerActive` true across back-to-back batches, so a batch is told
    apart by its id: the clock restarts whenever the running batch id changes, and stops
    while no trigger is active (waiting for the next interval).
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._batch: int | None = None
        self._started: float | None = None
        self._flagged = False

    def observe(self, batch_id: int, trigger_active: bool, now: float) -> bool:
        """Feed the running batch id and `isTriggerActive`; True when a batch first overruns."""
        if not trigger_active:
            self._batch, self._started, self._flagged = None, None, False
            return False
        if batch_id != self._batch or self._started is None:
            self._batch, self._started, self._flagged = batch_id, now, False
        if not self._flagged and now - self._started > self.timeout:
            self._flagged = True
            return True
        return False


@dataclass(frozen=True)
class JobStatus:
    """The assessed state of a job and why."""

    state: State
    reason: str


HEARTBEAT_LOST_AFTER = 30.0


def assess(
    heartbeat: dict[str, Any] | None,
    history: list[dict[str, Any]],
    *,
    interval: float,
    timeout: float,
    now: float | None = None,
) -> JobStatus:
    """RUNNING, DEGRADED, FAILING, STOPPED or FAILED, from the control plane and history."""
    now = time.time() if now is None else now
    if heartbeat is None:
        return JobStatus("STOPPED", "never started: no heartbeat in the control plane")
    state = heartbeat.get("state")
    if state == "FAILED":
        return JobStatus("FAILED", str(heartbeat.get("reason", "unknown reason")))
    if state in ("STOPPED", "FINISHED"):
        return JobStatus("STOPPED", f"runner {state.lower()} at {_ago(heartbeat['time'], now)}")
    age = now - float(heartbeat.get("time", 0))
    if age > HEARTBEAT_LOST_AFTER:
        return JobStatus(
            "FAILED", f"heartbeat lost {age:.0f}s ago (pid {heartbeat.get('pid')} presumed dead)"
        )
    if heartbeat.get("consecutive_failures", 0) > 0:
        return JobStatus(
            "FAILING",
            f"{heartbeat['consecutive_failures']} consecutive failed checkpoints "
            f"(tolerable {heartbeat.get('tolerable_failures')}): {heartbeat.get('last_failure')}",
        )
    return _degraded(heartbeat, history, interval=interval, timeout=timeout, now=now)


def _degraded(
    heartbeat: dict[str, Any],
    history: list[dict[str, Any]],
    *,
    interval: float,
    timeout: float,
    now: float,
) -> JobStatus:
    last = heartbeat.get("last_checkpoint_at")
    stale_after = max(timeout, 10 * interval, 30.0)
    if last is not None and now - float(last) > stale_after and heartbeat.get("data_available"):
        return JobStatus("DEGRADED", f"no checkpoint completed for {now - float(last):.0f}s")
    recent = [r for r in history[-5:] if r.get("input_rows", 0) > 0]
    if len(recent) >= 3:
        arriving = sum(r["input_rows_per_second"] for r in recent) / len(recent)
        processing = sum(r["processed_rows_per_second"] for r in recent) / len(recent)
        if processing < 0.9 * arriving:
            return JobStatus(
                "DEGRADED",
                f"falling behind: processing {processing:.0f} rows/s < input {arriving:.0f} rows/s",
            )
    growth = _state_growth(history[-20:])
    if growth is not None and growth > 2.0:
        return JobStatus(
            "DEGRADED", f"state grew {growth:.1f}x over the last {len(history[-20:])} checkpoints"
        )
    return JobStatus("RUNNING", "checkpoints completing")


def _state_growth(history: list[dict[str, Any]]) -> float | None:
    sizes = [r.get("state_bytes") or 0 for r in history]
    if len(sizes) < 5 or sizes[0] <= 0:
        return None
    if any(b < a for a, b in zip(sizes, sizes[1:], strict=False)):
        return None  # not monotonic: state is being cleaned up
    return sizes[-1] / sizes[0]


def _ago(timestamp: float, now: float) -> str:
    return f"{now - float(timestamp):.0f}s ago"
