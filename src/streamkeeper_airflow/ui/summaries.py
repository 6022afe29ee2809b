"""One row of the jobs table per job: what `streamkeeper status` says, made small.

Built from the control plane's small files only (the job record, the heartbeat, the
head commit marker, and the history log's tail for a live runner's health checks: see
`StreamkeeperClient.status`), so a refresh costs the same for a job that ran for a year
as for one that ran for a minute. Paging and the name filter are applied before any
job's files are read.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from streamkeeper.client import StatusReport, StreamkeeperClient

log = logging.getLogger(__name__)

MAX_PAGE = 200
READERS = 8  # jobs whose files are read at the same time


@dataclass(frozen=True)
class JobSummary:
    """A job's row: its assessed state and the figures an operator looks at first."""

    job: str
    state: str  # RUNNING, DEGRADED, FAILING, STOPPED, FAILED; UNKNOWN if unreadable
    reason: str
    epoch: int | None
    runner_state: str | None
    runner: str | None  # pid@host of the latest runner
    last_checkpoint_id: int | None
    last_checkpoint_at: float | None
    last_checkpoint_age_s: float | None
    visibility_delay_ms: float | None
    pending_commits: int | None
    consecutive_failures: int | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def summarize(report: StatusReport, now: float) -> JobSummary:
    """The row of one job's status report."""
    runner, head = report.runner, report.head
    committed_at = None if head is None else head.committed_at
    return JobSummary(
        job=report.job,
        state=report.state,
        reason=report.reason,
        epoch=None if runner is None else runner.epoch,
        runner_state=None if runner is None else runner.state,
        runner=None if runner is None else f"{runner.pid}@{runner.host}",
        last_checkpoint_id=None if head is None else head.seq,
        last_checkpoint_at=committed_at,
        last_checkpoint_age_s=None if committed_at is None else max(0.0, now - committed_at),
        visibility_delay_ms=None if head is None else head.visibility_delay_ms,
        pending_commits=report.pending_commits,
        consecutive_failures=report.consecutive_failures,
    )


def unreadable(job: str, error: Exception) -> JobSummary:
    """A row saying why the job's files could not be read (the page still shows the rest)."""
    return JobSummary(job, "UNKNOWN", f"control plane unreadable: {error}", *([None] * 9))


def never_started(job: str) -> JobSummary:
    """A job the jobs folder defines that never ran below the root."""
    return JobSummary(job, "STOPPED", "never started: defined in the jobs folder", *([None] * 9))


@dataclass(frozen=True)
class JobPage:
    """One page of the jobs table."""

    jobs: list[JobSummary]
    total: int  # jobs matching the filter
    offset: int
    limit: int
    generated_at: float

    def to_json(self) -> dict[str, Any]:
        return {
            "jobs": [j.to_json() for j in self.jobs],
            "total": self.total,
            "offset": self.offset,
            "limit": self.limit,
            "generated_at": self.generated_at,
        }


def job_page(
    client: StreamkeeperClient,
    *,
    names: list[str],
    started: set[str] | None = None,
    query: str = "",
    offset: int = 0,
    limit: int = 50,
    now: float | None = None,
) -> JobPage:
    """Summaries of the jobs in `names` whose name contains `query`, one page of them.

    Args:
        names: every job name, sorted (the root's jobs and the specs' jobs).
        started: those that ran below the root (None: all of `names`).
        query: a case-insensitive part of the name; empty: all.
    """
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"Invalid page size {limit}; expected 1 to {MAX_PAGE}")
    if offset < 0:
        raise ValueError(f"Invalid offset {offset}; expected 0 or more")
    now = time.time() if now is None else now
    matching = [name for name in names if query.lower() in name.lower()]
    shown = matching[offset : offset + limit]
    # Each job's few small reads wait on storage (S3 round trips): read jobs side by side.
    with ThreadPoolExecutor(max_workers=READERS) as pool:
        rows = list(pool.map(lambda name: _row(client, name, started, now), shown))
    return JobPage(rows, len(matching), offset, limit, now)


def _row(client: StreamkeeperClient, name: str, started: set[str] | None, now: float) -> JobSummary:
    if started is not None and name not in started:
        return never_started(name)
    try:
        return summarize(client.status(name, now=now), now)
    except Exception as error:  # noqa: BLE001 - one bad job must not hide the others
        log.warning("job %s: status unreadable", name, exc_info=True)
        return unreadable(name, error)
