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

    # Commands to the running job, answered between batches (lineage/commands.py):
    sent = client.send_command("keyed-totals", "savepoint", format="native")
    result = client.wait_for_result("keyed-totals", sent.id, timeout=300)
    result.state, result.savepoint_id       # "ok", "sp-20270115T080000-1a2b3c4d"
    client.send_command("keyed-totals", "stop")   # stop with a savepoint; or "cancel"

    # Savepoints (snapshots/savepoints.py):
    client.savepoints("keyed-totals")         # [SavepointEntry], oldest first
    client.describe_savepoint("sp-...")       # SavepointDescription: entry, manifest, broken?
    client.protect_savepoint("sp-...", "rollback target")
    client.delete_savepoint("sp-...")

Every dataclass returned has `to_json()` with the field names the README documents.
"""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from streamkeeper.errors import StorageError, UnknownJobError
from streamkeeper.lineage.commands import (
    Command,
    CommandBox,
    CommandResult,
    check_command_id,
    new_command_id,
)
from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.lineage.markers import latest_marker, marker_seqs_after
from streamkeeper.observability.health import LOST_HEARTBEAT_GRACE
from streamkeeper.observability.history import Checkpoint, CheckpointHistory
from streamkeeper.observability.history_tail import HistoryTail
from streamkeeper.observability.status import (
    RUNNER_LIVE,
    LineageHead,
    RunnerInfo,
    StatusReport,
    build_status,
)
from streamkeeper.snapshots.savepoint_check import check_savepoint
from streamkeeper.snapshots.savepoint_disposal import delete_savepoint
from streamkeeper.snapshots.savepoint_manifest import SavepointManifest, SavepointPlace
from streamkeeper.snapshots.savepoints import SavepointEntry, SavepointRegistry, locate
from streamkeeper.storage import Location, S3Settings, resolve_root
from streamkeeper.storage.confine import NAME_PATTERN, checked_name

__all__ = [
    "Checkpoint",
    "Command",
    "CommandResult",
    "SavepointDescription",
    "SavepointEntry",
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
        lineage = checked_name(
            record.get("lineage") or job,
            NAME_PATTERN,
            what="lineage",
            source=f"the job record {f'jobs/{job}/job.json'!r}",
            expected="a lineage name (a-z, 0-9 and '-')",
        )
        return cls(
            job=job,
            lineage=lineage,
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


@dataclass(frozen=True)
class SavepointDescription:
    """A savepoint: its registry entry, its manifest, and whether it is whole."""

    entry: SavepointEntry
    manifest: SavepointManifest | None
    problems: list[str]

    @property
    def broken(self) -> bool:
        return bool(self.problems)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.entry.to_json(),
            "broken": self.broken,
            "problems": list(self.problems),
            "manifest": None if self.manifest is None else self.manifest.to_json(),
        }


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
        if not self.location.is_s3 and os.path.exists(self.root) and not os.path.isdir(self.root):
            raise StorageError(
                f"storage root {self.root!r} is a file, not a folder; pass the folder the job "
                "spec's storage.root names (--root or STREAMKEEPER_ROOT)"
            )
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
        # Only a live runner is judged by its recent checkpoints (DEGRADED); the log's
        # tail has them without loading the whole table (status is asked for often).
        history = self._history_tail(layout).read(HEALTH_HISTORY_ROWS) if live else []
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
            rewind_pending=self.store.read_json(layout.rewind_pending),
        )

    def settled_status(
        self, job: str, *, grace: float = LOST_HEARTBEAT_GRACE, poll: float = 1.0
    ) -> StatusReport:
        """The job's status for a decision that is not undone (refuse an upgrade, a
        command): a heartbeat lost only lately is waited out.

        A runner cut off from storage cannot beat, so for a moment after an outage longer
        than `HEARTBEAT_LOST_AFTER` its status says FAILED (heartbeat lost) although it
        runs on. This reads the status again every `poll` seconds until the runner beats,
        or its last beat is `grace` seconds past that limit: then it is presumed dead. A
        job dead for longer is answered at once.

        Raises:
            UnknownJobError: no such job below the root (names the jobs there are).
        """
        while True:
            report = self.status(job)
            if not report.lost_lately(time.time(), grace):
                return report
            log.info("job %s: %s; waiting up to %gs for a beat", job, report.reason, grace)
            time.sleep(poll)

    def history(self, job: str, last: int | None = 20) -> list[Checkpoint]:
        """The job lineage's last `last` committed checkpoints (all if None), oldest first.

        Raises:
            UnknownJobError: no such job below the root (names the jobs there are).
        """
        layout = self._layout(self._job(job).record)
        rows = (
            self._history(layout).read() if last is None else self._history_tail(layout).read(last)
        )
        return [Checkpoint.from_row(row) for row in rows]

    def checkpoints_after(self, job: str, checkpoint_id: int) -> list[int]:
        """Ids of the checkpoints the job's lineage committed after `checkpoint_id`, ascending.

        Lists only the commit markers after it, so it stays cheap while few are new (what
        a sensor waiting for N new checkpoints asks). -1 means from the beginning.

        Raises:
            UnknownJobError: no such job below the root (names the jobs there are).
        """
        layout = self._layout(self._job(job).record)
        return marker_seqs_after(self.store, layout, checkpoint_id)

    # -- commands to a running job --------------------------------------------------

    def send_command(
        self,
        job: str,
        kind: str,
        *,
        format: str = "native",
        self_contained: bool = False,
        savepoint: bool = True,
        command_id: str | None = None,
        ttl: float | None = None,
        hold: str | None = None,
    ) -> Command:
        """Ask the job's running runner for a savepoint, a stop or a cancel.

        Args:
            kind: savepoint | stop | cancel.
            format: native | canonical (savepoint, stop).
            self_contained: copy the savepoint's files into its folder (portable).
            savepoint: stop only: take a savepoint first (the default).
            command_id: an id of the caller's choosing (a retry with the same id is one
                command); generated if None.
            ttl: seconds after which an unanswered command expires (default 600).
            hold: savepoint, stop: a holder the savepoint is born held by (an upgrade's
                rollback target: retention never deletes it before the holder releases it).

        Returns:
            The command as stored (an earlier send's, for a retry).

        Raises:
            UnknownJobError: no such job; CommandError: a bad option, or the id was
                used for another command.
        """
        self._job(job)  # an unknown job is refused before anything is written
        sent_at = time.time()
        command = Command(
            id=command_id or new_command_id(kind),
            kind=kind,  # type: ignore[arg-type]
            job=job,
            format=format,  # type: ignore[arg-type]
            self_contained=self_contained,
            savepoint=savepoint,
            hold=hold,
            sent_at=sent_at,
            expires_at=None if ttl is None else sent_at + ttl,
        )
        return self._commands(job).send(command)

    def command_sent(self, job: str, command_id: str) -> bool:
        """Whether a command of this id was sent to the job (queued, or in its command log)."""
        box = self._commands(job)
        return (
            box.read(check_command_id(command_id)) is not None or box.record(command_id) is not None
        )

    def command_result(
        self, job: str, command_id: str, *, acknowledge: bool = False
    ) -> CommandResult | None:
        """The command's result (None while unanswered); `acknowledge` archives it."""
        box = self._commands(job)
        result = box.result(command_id)
        if result is not None and acknowledge:
            box.acknowledge(command_id)
        return result

    def wait_for_result(
        self,
        job: str,
        command_id: str,
        *,
        timeout: float = 600.0,
        poll: float = 0.5,
        acknowledge: bool = True,
    ) -> CommandResult:
        """Wait for the command's result, then acknowledge it.

        Raises:
            CommandError: no result within `timeout` seconds.
        """
        box = self._commands(job)
        result = box.wait(command_id, timeout, poll)
        if acknowledge:
            box.acknowledge(command_id)
        return result

    def _commands(self, job: str) -> CommandBox:
        return CommandBox(self.store, self._layout(self._job(job).record))

    # -- savepoints --------------------------------------------------------------------

    def savepoints(self, job: str) -> list[SavepointEntry]:
        """The job lineage's savepoints, oldest first (from its registry: no listing)."""
        layout = self._layout(self._job(job).record)
        entries = SavepointRegistry(self.store, layout).read().savepoints
        return sorted(entries, key=lambda e: e.created_at)

    def describe_savepoint(self, savepoint_id: str) -> SavepointDescription:
        """A savepoint's entry and manifest, checked: `broken` if any of it is missing.

        Raises:
            UnknownSavepointError: no savepoint of that id under the root.
        """
        lineage, entry = locate(self.store, savepoint_id)
        layout = LineageLayout(self.location, lineage, entry.job)
        place = SavepointPlace(self.store, layout.savepoint(savepoint_id))
        check = check_savepoint(place, savepoint_id, entry=entry, layout=layout)
        manifest = check.manifest
        if manifest is None and entry.state != "complete":
            try:  # pending or deleting: show what there is
                manifest = place.read()
            except Exception:  # noqa: BLE001 - the problems say what is wrong
                manifest = None
        return SavepointDescription(entry, manifest, check.problems)

    def delete_savepoint(self, savepoint_id: str) -> None:
        """Dispose of a savepoint's data, then forget it (unpinning its checkpoint).

        Raises:
            SavepointError: it is protected, held, in use or being taken.
        """
        lineage, entry = locate(self.store, savepoint_id)
        delete_savepoint(self.store, LineageLayout(self.location, lineage, entry.job), savepoint_id)

    def protect_savepoint(self, savepoint_id: str, reason: str) -> SavepointEntry:
        """Keep a savepoint from retention and deletion (a rollback target)."""
        return self._registry_of(savepoint_id).protect(savepoint_id, reason)

    def unprotect_savepoint(self, savepoint_id: str) -> SavepointEntry:
        return self._registry_of(savepoint_id).unprotect(savepoint_id)

    def _registry_of(self, savepoint_id: str) -> SavepointRegistry:
        lineage, entry = locate(self.store, savepoint_id)
        return SavepointRegistry(self.store, LineageLayout(self.location, lineage, entry.job))

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

    def _history_tail(self, layout: LineageLayout) -> HistoryTail:
        prefix = f"{layout.base}/history"
        return HistoryTail(self.store, prefix, self.location.child(prefix))

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
