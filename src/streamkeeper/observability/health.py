"""Checkpoint health: failed checkpoints, tolerable failures, and the job status model.

A checkpoint fails when its batch exceeds `checkpoint.timeout`, errors, or its upload
or commit fails. Consecutive failures count against `checkpoint.tolerable_failures`
(Flink's tolerableCheckpointFailureNumber); one more fails the job with the reason. A
completed checkpoint resets the count.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass
from datetime import datetime
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
    """The assessed state of a job and why, in words a person reads at a glance."""

    state: State
    reason: str

    @property
    def healthy(self) -> bool:
        """False for DEGRADED, FAILING and FAILED (what `status --check` exits 1 on)."""
        return self.state in ("RUNNING", "STOPPED")


HEARTBEAT_LOST_AFTER = 30.0
# How long past HEARTBEAT_LOST_AFTER a lost heartbeat is waited for before a decision (a
# beat sent into a storage outage returns within the fail-fast store's timeouts after it).
LOST_HEARTBEAT_GRACE = 30.0
IDLE_AFTER_INTERVALS = 10


def assess(
    heartbeat: dict[str, Any] | None,
    history: list[dict[str, Any]],
    *,
    interval: float,
    timeout: float,
    now: float | None = None,
    last_commit_at: float | None = None,
) -> JobStatus:
    """RUNNING, DEGRADED, FAILING, STOPPED or FAILED, from the control plane and history.

    Args:
        heartbeat: the latest runner's heartbeat record (None: never started).
        history: the latest checkpoint history rows, oldest first.
        last_commit_at: when the lineage's last checkpoint was committed (its head
            marker), by any run; the heartbeat only knows about its own run.
    """
    now = time.time() if now is None else now
    if heartbeat is None:
        return JobStatus("STOPPED", "never started: no heartbeat in the control plane")
    state = heartbeat.get("state")
    when = ago(float(heartbeat.get("time", 0)), now)
    reason = heartbeat.get("reason")
    if state == "FAILED":
        return JobStatus("FAILED", f"failed {when}: {reason or 'unknown reason'}")
    if state == "FINISHED":
        return JobStatus("STOPPED", f"finished {when}, {reason or 'all input processed'}")
    if state == "STOPPED":
        return JobStatus("STOPPED", f"stopped {when}" + (f": {reason}" if reason else ""))
    age = now - float(heartbeat.get("time", 0))
    if age > HEARTBEAT_LOST_AFTER:
        return JobStatus(
            "FAILED",
            f"heartbeat lost: last beat {when} (pid {heartbeat.get('pid')} on "
            f"{heartbeat.get('host')} presumed dead)",
        )
    if heartbeat.get("consecutive_failures", 0) > 0:
        return JobStatus(
            "FAILING",
            f"{heartbeat['consecutive_failures']} consecutive failed checkpoints "
            f"(tolerable {heartbeat.get('tolerable_failures')}): {heartbeat.get('last_failure')}",
        )
    degraded = _degraded(heartbeat, history, interval=interval, timeout=timeout, now=now)
    if degraded is not None:
        return degraded
    return JobStatus("RUNNING", _running(heartbeat, interval, now, last_commit_at))


def _running(
    heartbeat: dict[str, Any], interval: float, now: float, last_commit_at: float | None
) -> str:
    if heartbeat.get("state") == "STARTING":
        return (
            f"starting: pid {heartbeat.get('pid')} on {heartbeat.get('host')}, "
            f"heartbeat {ago(float(heartbeat.get('time', 0)), now)}"
        )
    known = [t for t in (last_commit_at, heartbeat.get("last_checkpoint_at")) if t is not None]
    if not known:
        return "running, no checkpoint committed yet"
    last = max(float(t) for t in known)
    if not heartbeat.get("data_available") and now - last > IDLE_AFTER_INTERVALS * interval:
        return f"running, idle (no new input), last checkpoint {ago(last, now)}"
    return f"running, last checkpoint {ago(last, now)}"


def _degraded(
    heartbeat: dict[str, Any],
    history: list[dict[str, Any]],
    *,
    interval: float,
    timeout: float,
    now: float,
) -> JobStatus | None:
    last = heartbeat.get("last_checkpoint_at")
    stale_after = max(timeout, 10 * interval, 30.0)
    if last is not None and now - float(last) > stale_after and heartbeat.get("data_available"):
        return JobStatus(
            "DEGRADED",
            f"no checkpoint completed for {duration(now - float(last))} although input waits",
        )
    behind = _overrunning(heartbeat, history, interval=interval)
    if behind is not None:
        return behind
    recent = [r for r in history[-5:] if r.get("input_rows", 0) > 0]
    # Spark's input rate is rows / time since the previous *trigger*: after idle triggers
    # that is one interval, not the time the rows took to arrive, so a slow batch after
    # idle ones looks like input outrunning processing. Only batches that ran back to
    # back (or rows without their timing) are judged by the rates.
    if len(recent) >= 3 and _back_to_back(recent, interval) is not False:
        arriving = sum(r["input_rows_per_second"] for r in recent) / len(recent)
        processing = sum(r["processed_rows_per_second"] for r in recent) / len(recent)
        if processing < 0.9 * arriving:
            return JobStatus(
                "DEGRADED",
                f"falling behind: processing {processing:.0f} rows/s < input {arriving:.0f} rows/s",
            )
    # No rule on state growth: over the few checkpoints a status reads, state that doubles
    # is a young job filling its keys (every new job was DEGRADED), and a leak in a mature
    # one grows a fraction of a percent. State size is in the history and on the page.
    return None


OVERRUN_BATCHES = 3  # Spark's "current batch is falling behind", this many times in a row


def _overrunning(
    heartbeat: dict[str, Any], history: list[dict[str, Any]], *, interval: float
) -> JobStatus | None:
    """Spark's own "current batch is falling behind", sustained: input outruns processing.

    Spark's rates cannot show it: with back-to-back batches its input rate (rows / time
    since the previous trigger) is rows / the previous batch's duration, and its processing
    rate rows / this batch's duration, so the two stay equal however much input waits.
    What does show it is the trigger: the last `OVERRUN_BATCHES` checkpoints of one run
    each took longer than the trigger interval, and each next one started as soon as the
    one before ended (an idle gap means input had caught up), and the runner still sees
    input (`data_available`: the current trigger found some). A run's first batch is left
    out: it pays the query's start-up (a start with a few files waiting is no overload).
    """
    if not heartbeat.get("data_available") or interval <= 0:
        return None
    run = _this_run(history)[1:]  # a run's first batch pays its start-up, not its input
    rows = run[-OVERRUN_BATCHES:]
    if len(rows) < OVERRUN_BATCHES:
        return None
    spans = [_span(r) for r in rows]
    if any(span is None for span in spans) or any(r.get("input_rows", 0) <= 0 for r in rows):
        return None
    if any(end - start <= interval for start, end in spans):  # type: ignore[misc]
        return None
    if not _back_to_back(rows, interval):
        return None
    durations = [end - start for start, end in spans]  # type: ignore[misc]
    rows_per_second = sum(r["input_rows"] for r in rows) / max(sum(durations), 1e-9)
    return JobStatus(
        "DEGRADED",
        f"falling behind: the last {len(rows)} batches each took longer than the "
        f"{interval:g} s trigger interval (median {statistics.median(durations):.1f} s) and "
        f"ran back to back while input kept waiting; processing {rows_per_second:.0f} rows/s",
    )


def _this_run(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The trailing rows of the latest run (same `run_id` as the last row)."""
    if not history:
        return []
    run_id = history[-1].get("run_id")
    start = len(history)
    while start > 0 and history[start - 1].get("run_id") == run_id:
        start -= 1
    return history[start:]


def _back_to_back(rows: list[dict[str, Any]], interval: float) -> bool | None:
    """Whether each batch started as soon as the one before it ended (None: no timing).

    Spark starts the next trigger at once after a batch that overran its interval and
    input waits; an idle gap of more than a quarter interval (at most 0.5 s) means the
    trigger waited for its time or for input.
    """
    spans = [_span(r) for r in rows]
    if any(span is None for span in spans):
        return None
    slack = min(0.25 * interval, 0.5)
    return all(
        nxt[0] - prev[1] <= slack  # type: ignore[index]
        for prev, nxt in zip(spans, spans[1:], strict=False)
    )


def _span(row: dict[str, Any]) -> tuple[float, float] | None:
    """A history row's trigger start and end in seconds since the epoch, if it has them."""
    stamp, millis = row.get("trigger_time"), row.get("duration_ms")
    if not stamp or millis is None:
        return None
    try:
        start = datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
    return start, start + float(millis) / 1000.0


def duration(seconds: float) -> str:
    """A duration as a person says it, rounded down: 3 s, 23 min, 2 h, 4 d."""
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit}"
    return f"{int(seconds)} s"


def ago(timestamp: float, now: float) -> str:
    return f"{duration(now - float(timestamp))} ago"
