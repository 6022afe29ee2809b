"""A job's status as readers see it: where its lineage stands, and what its runner says.

The lineage's truth (its head: the last committed checkpoint's seq, batch and time,
from the commit markers) is kept apart from the last runner's own report (its
heartbeat: STARTING, RUNNING, STOPPED, FINISHED or FAILED and why), and both feed the
assessed health state (RUNNING, DEGRADED, FAILING, STOPPED, FAILED) with a reason a
person reads at a glance. Pure: the I/O is in `streamkeeper.client`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from streamkeeper.observability.health import (
    HEARTBEAT_LOST_AFTER,
    LOST_HEARTBEAT_GRACE,
    State,
    assess,
)


@dataclass(frozen=True)
class RunnerInfo:
    """The latest runner's own report, from its heartbeat."""

    state: str  # STARTING, RUNNING, STOPPED, FINISHED or FAILED
    reason: str | None
    pid: int | None
    host: str | None
    epoch: int | None
    heartbeat_at: float | None
    run_token: str | None = None  # who started it (`run --run-token`), e.g. an Airflow task
    spark_ui: str | None = None  # the driver's Spark UI address, if it serves one

    @classmethod
    def from_heartbeat(cls, beat: dict[str, Any]) -> RunnerInfo:
        return cls(
            state=str(beat.get("state", "UNKNOWN")),
            reason=beat.get("reason"),
            pid=beat.get("pid"),
            host=beat.get("host"),
            epoch=beat.get("epoch"),
            heartbeat_at=beat.get("time"),
            run_token=beat.get("run_token"),
            spark_ui=beat.get("spark_ui"),
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LineageHead:
    """The lineage's last committed checkpoint (its latest commit marker)."""

    seq: int
    batch_id: int
    committed_at: float | None
    versions: dict[str, int] = field(default_factory=dict)
    visibility_delay_ms: float | None = None  # batch end -> output visible, of this one

    @classmethod
    def from_marker(cls, marker: dict[str, Any]) -> LineageHead:
        return cls(
            seq=int(marker["seq"]),
            batch_id=int(marker["batch_id"]),
            committed_at=marker.get("committed_at"),
            versions={k: int(v) for k, v in (marker.get("versions") or {}).items()},
            visibility_delay_ms=marker.get("visibility_delay_ms"),
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class StatusReport:
    """`streamkeeper status JOB`; `to_json()` is the documented, stable form."""

    job: str
    lineage: str
    root: str
    state: State
    reason: str
    runner: RunnerInfo | None
    head: LineageHead | None
    tables: dict[str, str]
    checked_at: float
    pending_commits: int | None = None
    consecutive_failures: int | None = None
    tolerable_failures: int | None = None
    failed_checkpoints: int | None = None
    last_failure: str | None = None
    # A rollback that restored the tables and did not finish: {savepoint, epoch, at}.
    rewind_pending: dict[str, Any] | None = None

    @property
    def healthy(self) -> bool:
        """RUNNING or STOPPED, and no rollback left halfway (only its savepoint may start)."""
        return self.state in ("RUNNING", "STOPPED") and self.rewind_pending is None

    @property
    def heartbeat_lost(self) -> bool:
        """FAILED only because its runner's beats stopped coming: presumed dead, not known
        to be (a runner cut off from storage beats again once it reaches it)."""
        return (
            self.state == "FAILED"
            and self.runner is not None
            and (self.runner.state in RUNNER_LIVE)
        )

    def lost_lately(self, now: float, grace: float = LOST_HEARTBEAT_GRACE) -> bool:
        """Its heartbeat is lost, but its last beat is less than `grace` seconds past the
        limit: a runner cut off from storage may still beat again, so wait before acting."""
        beat_at = None if self.runner is None else self.runner.heartbeat_at
        if not self.heartbeat_lost or beat_at is None:
            return False
        return now < float(beat_at) + HEARTBEAT_LOST_AFTER + grace

    @property
    def rewind_advice(self) -> str | None:
        """What to do about a rollback left halfway, or None."""
        if self.rewind_pending is None:
            return None
        from streamkeeper.lineage.rewind import rewind_advice

        return rewind_advice(self.rewind_pending)

    def to_json(self) -> dict[str, Any]:
        head = self.head
        return {
            "job": self.job,
            "lineage": self.lineage,
            "root": self.root,
            "state": self.state,
            "healthy": self.healthy,
            "heartbeat_lost": self.heartbeat_lost,
            "reason": self.reason,
            "last_committed_seq": None if head is None else head.seq,
            "last_committed_batch": None if head is None else head.batch_id,
            "last_commit_at": None if head is None else head.committed_at,
            "runner": None if self.runner is None else self.runner.to_json(),
            "pending_commits": self.pending_commits,
            "consecutive_failures": self.consecutive_failures,
            "tolerable_failures": self.tolerable_failures,
            "failed_checkpoints": self.failed_checkpoints,
            "last_failure": self.last_failure,
            "rewind_pending": self.rewind_pending,
            "tables": dict(self.tables),
            "checked_at": self.checked_at,
        }


RUNNER_LIVE = ("STARTING", "RUNNING")


def build_status(
    *,
    job: str,
    lineage: str,
    root: str,
    heartbeat: dict[str, Any] | None,
    head: LineageHead | None,
    history: list[dict[str, Any]],
    tables: dict[str, str],
    interval: float,
    timeout: float,
    now: float,
    rewind_pending: dict[str, Any] | None = None,
) -> StatusReport:
    """Assess a job from its heartbeat, its lineage head and its latest history rows."""
    assessed = assess(
        heartbeat,
        history,
        interval=interval,
        timeout=timeout,
        now=now,
        last_commit_at=None if head is None else head.committed_at,
    )
    beat = heartbeat or {}
    return StatusReport(
        job=job,
        lineage=lineage,
        root=root,
        state=assessed.state,
        reason=assessed.reason,
        runner=None if heartbeat is None else RunnerInfo.from_heartbeat(heartbeat),
        head=head,
        tables=tables,
        checked_at=now,
        pending_commits=beat.get("pending_commits"),
        consecutive_failures=beat.get("consecutive_failures"),
        tolerable_failures=beat.get("tolerable_failures"),
        failed_checkpoints=beat.get("failed_checkpoints"),
        last_failure=beat.get("last_failure"),
        rewind_pending=rewind_pending,
    )
