"""Read a storage root's control plane, without Spark: the one reader of it for tools.

The CLI (`streamkeeper jobs|status|checkpoints`) uses it now, the Airflow hook and UI
later. It imports neither pyspark nor the runtime, so it is cheap to import in an
Airflow worker or a web server.

    client = StreamkeeperClient("s3://bucket/prefix")   # or a local path
    client.jobs()                       # ["keyed-totals", ...]
    client.status("keyed-totals")       # StatusReport: head seq/batch, runner, health
    client.history("keyed-totals", last=20)   # [Checkpoint], oldest first
    client.job_record("keyed-totals")   # JobRecord: lineage, tables, knobs
    client.checkpoints_after("keyed-totals", 41)   # [42, 43]: ids committed after 41

Every dataclass returned has `to_json()` with the field names the README documents.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from streamkeeper.errors import UnknownJobError
from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.lineage.markers import latest_marker, marker_seqs_after
from streamkeeper.observability.history import Checkpoint, CheckpointHistory
from streamkeeper.observability.status import (
    RUNNER_LIVE,
    LineageHead,
    RunnerInfo,
    StatusReport,
    build_status,
)
from streamkeeper.storage import Location, S3Settings, resolve_root

__all__ = [
    "Checkpoint",
    "JobRecord",
    "LineageHead",
    "RunnerInfo",
    "SinkTable",
    "StatusReport",
    "StreamkeeperClient",
    "UnknownJobError",
]

log = logging.getLogger(__name__)

JOBS_FOLDER = "jobs"
HEALTH_HISTORY_ROWS = 20  # what the DEGRADED checks look at
_JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class SinkTable:
    """One of a job's target tables."""

    table: str  # its URI
    output: str | None  # append | merge
    mode: str | None  # exactly_once | idempotent | at_least_once


@dataclass(frozen=True)
class JobRecord:
    """What the runner's last start recorded in `jobs/{job}/job.json`."""

    job: str
    lineage: str
    root: str
    checkpoint_dir: str | None
    interval: float
    timeout: float
    max_concurrent: int | None
    tables: dict[str, SinkTable]
    started_at: float | None
    epoch: int | None
    run_token: str | None = None  # who started it (`run --run-token`)

    @classmethod
    def from_json(cls, job: str, root: str, record: dict[str, Any]) -> JobRecord:
        return cls(
            job=job,
            lineage=str(record.get("lineage") or job),
            root=str(record.get("root") or root),
            checkpoint_dir=record.get("checkpoint_dir"),
            interval=float(record.get("interval") or 1.0),
            timeout=float(record.get("timeout") or 600.0),
            max_concurrent=record.get("max_concurrent"),
            tables={
                name: SinkTable(
                    table=str(t.get("table")), output=t.get("output"), mode=t.get("mode")
                )
                for name, t in (record.get("tables") or {}).items()
            },
            started_at=record.get("started_at"),
            epoch=record.get("epoch"),
            run_token=record.get("run_token"),
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _JobFiles:
    record: JobRecord
    heartbeat: dict[str, Any] | None = field(default=None)


class StreamkeeperClient:
    """Reads the jobs, status and checkpoint history below one storage root."""

    def __init__(self, root: str, s3: S3Settings | None = None) -> None:
        """
        Args:
            root: the storage root (a local path or s3://bucket/prefix).
            s3: how to reach S3; default: from AWS_* environment variables.
        """
        self.location = Location(resolve_root(root), s3 or S3Settings.from_env())
        self.store = self.location.store()

    @property
    def root(self) -> str:
        return self.location.uri

    def jobs(self) -> list[str]:
        """Names of the jobs that ever started below the root, sorted."""
        return [
            name
            for name in self.store.children(JOBS_FOLDER)
            if self.store.exists(f"{JOBS_FOLDER}/{name}/job.json")
            or self.store.exists(f"{JOBS_FOLDER}/{name}/heartbeat.json")
        ]

    def job_record(self, job: str) -> JobRecord:
        """The job's record (lineage, tables, knobs).

        Raises:
            UnknownJobError: no such job below the root (names the jobs there are).
        """
        return self._job(job).record

    def status(self, job: str, *, now: float | None = None) -> StatusReport:
        """Where the job's lineage stands, what its runner says, and its assessed health.

        Raises:
            UnknownJobError: no such job below the root (names the jobs there are).
        """
        now = time.time() if now is None else now
        files = self._job(job)
        record, beat = files.record, files.heartbeat
        layout = self._layout(record)
        head = self._head(layout, record, beat)
        live = beat is not None and beat.get("state") in RUNNER_LIVE
        # Only a live runner is judged by its recent checkpoints (DEGRADED).
        history = self._history(layout).read(last=HEALTH_HISTORY_ROWS) if live else []
        return build_status(
            job=job,
            lineage=record.lineage,
            root=self.root,
            heartbeat=beat,
            head=head,
            history=history,
            tables={name: t.table for name, t in record.tables.items()},
            interval=float((beat or {}).get("interval") or record.interval),
            timeout=float((beat or {}).get("timeout") or record.timeout),
            now=now,
        )

    def history(self, job: str, last: int | None = 20) -> list[Checkpoint]:
        """The job lineage's last `last` committed checkpoints (all if None), oldest first.

        Raises:
            UnknownJobError: no such job below the root (names the jobs there are).
        """
        layout = self._layout(self._job(job).record)
        return [Checkpoint.from_row(row) for row in self._history(layout).read(last=last)]

    def checkpoints_after(self, job: str, checkpoint_id: int) -> list[int]:
        """Ids of the checkpoints the job's lineage committed after `checkpoint_id`, ascending.

        Lists only the commit markers after it, so it stays cheap while few are new (what
        a sensor waiting for N new checkpoints asks). -1 means from the beginning.

        Raises:
            UnknownJobError: no such job below the root (names the jobs there are).
        """
        layout = self._layout(self._job(job).record)
        return marker_seqs_after(self.store, layout, checkpoint_id)

    # -- reading ---------------------------------------------------------------------

    def _job(self, job: str) -> _JobFiles:
        base = f"{JOBS_FOLDER}/{job}"
        if _JOB_NAME.fullmatch(job):
            record = self.store.read_json(f"{base}/job.json")
            beat = self.store.read_json(f"{base}/heartbeat.json")
            if record is not None or beat is not None:
                # A job started before job records existed has only its heartbeat.
                fallback = {"lineage": (beat or {}).get("lineage", job)}
                return _JobFiles(JobRecord.from_json(job, self.root, record or fallback), beat)
        raise UnknownJobError(self._unknown(job))

    def _unknown(self, job: str) -> str:
        jobs = self.jobs()
        if not jobs:
            return (
                f"no job {job!r} under {self.root!r}: no job has run under this root; check "
                "--root (or STREAMKEEPER_ROOT): it is the job spec's storage.root"
            )
        return (
            f"no job {job!r} under {self.root!r}; jobs there: {', '.join(jobs)} "
            "(a job is named by its spec's `name`)"
        )

    def _layout(self, record: JobRecord) -> LineageLayout:
        return LineageLayout(self.location, record.lineage, record.job)

    def _history(self, layout: LineageLayout) -> CheckpointHistory:
        return CheckpointHistory(self.location.child(f"{layout.base}/history"))

    def _head(
        self, layout: LineageLayout, record: JobRecord, beat: dict[str, Any] | None
    ) -> LineageHead | None:
        """The latest commit marker, found near a hint so old markers are not listed."""
        hint = (beat or {}).get("last_committed_seq")
        if hint is None or int(hint) < 0:
            hint = self._tables_seq(layout, record)
        marker = latest_marker(self.store, layout, near=None if hint < 0 else int(hint))
        return None if marker is None else LineageHead.from_marker(marker)

    def _tables_seq(self, layout: LineageLayout, record: JobRecord) -> int:
        """The highest seq the lineage committed to any of its tables (-1 if none)."""
        from streamkeeper.commit.tables import TableTarget

        seqs = [-1]
        for sink, info in record.tables.items():
            target = TableTarget(
                sink=sink,
                location=self.location.child(info.table),
                data_app_id=layout.data_app_id(sink),
                fence_app_id=layout.fence_app_id(),
            )
            try:
                seqs.append(target.committed_seq())
            except Exception:  # noqa: BLE001 - a missing table only loses a hint
                log.debug("table %s unreadable; no seq hint from it", info.table, exc_info=True)
        return max(seqs)
