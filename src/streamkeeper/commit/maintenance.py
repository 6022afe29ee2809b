"""Delta table maintenance: a commit costs what the table retains, not what it has lived.

Every commit adds an entry to the table's log, and delta-rs lists the log on every
commit, so a table nobody maintains commits slower and slower as the job ages (measured
on a local table at 2 500 versions: a merge 56 ms, an append 53 ms; after expiring the
log 22 and 20 ms; tombstones made no difference: benchmarks/README.md). Every `every`
commits to a table it owns, the committer:

1. writes a Delta checkpoint of the current version;
2. expires the log below a *cut*: the newest Delta checkpoint that is at or below the
   protected floor and was committed more than `history_retention` ago. Versions from
   the cut on stay readable (time travel, RESTORE); older ones are gone.

The protected floor is the lowest table version the lineage may still need: the versions
recorded in the commit markers of every retained externalized checkpoint, of every
savepoint in the registry (a rollback restores the tables to them) and of the head.
Nothing below it is kept for its own sake: `history_retention` is for readers outside
the lineage (a downstream stream reading the table, a person time-travelling).

Only the lineage's owner maintains, from the commit thread, between its own commits; a
table several lineages write (`shared: true`) gets checkpoints only, since another
lineage's savepoints may need its older versions. Data files are never deleted here, so
every version from the cut on stays complete.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from streamkeeper.commit import crashpoints
from streamkeeper.commit.tables import TableTarget
from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.lineage.markers import KEEP_LAST, retire_markers
from streamkeeper.storage import Location, ObjectStore

if TYPE_CHECKING:
    from deltalake import DeltaTable

log = logging.getLogger(__name__)

LOG_FOLDER = "_delta_log"
_VERSION_DIGITS = 20


@dataclass(frozen=True)
class MaintenancePolicy:
    """How often tables are maintained and how much history they keep beyond the floor."""

    every: int = 100  # commits to a table between two passes
    history_retention: float = 3600.0  # seconds of history kept for readers outside
    markers_kept: int = KEEP_LAST  # the newest commit markers, always kept


@dataclass
class MaintenanceReport:
    """What one pass did to one table."""

    sink: str
    version: int
    floor: int | None
    cut: int | None = None
    log_entries_deleted: int = 0
    seconds: float = 0.0


def log_version(key: str) -> int | None:
    """The version a `_delta_log` entry belongs to (None for `_last_checkpoint` etc.)."""
    name = key.rsplit("/", 1)[-1]
    head = name[:_VERSION_DIGITS]
    if len(name) > _VERSION_DIGITS and head.isdigit() and name[_VERSION_DIGITS] == ".":
        return int(head)
    return None


def _is_checkpoint(key: str) -> bool:
    return ".checkpoint." in key.rsplit("/", 1)[-1] and key.endswith(".parquet")


@dataclass
class ProtectedVersions:
    """Each table's protected floor, read from the control plane's small summaries.

    `seqs` gives the commit seqs the lineage must keep readable (retained checkpoints,
    savepoints, the head); each seq's commit marker maps it to table versions. Markers are
    immutable, so each is read once.
    """

    store: ObjectStore
    layout: LineageLayout
    seqs: Callable[[], Iterable[int]]
    _versions: dict[int, dict[str, int] | None] = field(default_factory=dict)

    def floors(self) -> dict[str, int] | None:
        """sink -> lowest protected version (a sink absent: nothing protected below its
        head); None if a needed marker is missing, so nothing may be expired."""
        floors: dict[str, int] = {}
        seqs = set(self.seqs())
        # The head moves every batch: keep the markers of the seqs protected now only.
        self._versions = {s: v for s, v in self._versions.items() if s in seqs}
        for seq in seqs:
            versions = self._marker_versions(seq)
            if versions is None:
                log.warning("commit marker of protected seq %d is missing: no log expired", seq)
                return None
            for sink, version in versions.items():
                floors[sink] = min(version, floors.get(sink, version))
        return floors

    def _marker_versions(self, seq: int) -> dict[str, int] | None:
        if seq not in self._versions:
            marker = self.store.read_json(self.layout.marker(seq))
            self._versions[seq] = (
                None
                if marker is None
                else {k: int(v) for k, v in marker.get("versions", {}).items() if v is not None}
            )
        return self._versions[seq]


def expire_log(
    target: TableTarget, floor: int, history_retention: float, now: float | None = None
) -> tuple[int | None, int]:
    """Delete the log entries below the newest checkpoint at or below `floor` that was
    committed more than `history_retention` seconds ago.

    Returns:
        The cut (None if no checkpoint qualifies) and the number of entries deleted.
    """
    return expire_log_at(target.location, floor, history_retention, now)


def expire_log_at(
    location: Location, floor: int, history_retention: float, now: float | None = None
) -> tuple[int | None, int]:
    """`expire_log` for the Delta table at `location`."""
    store = location.store()
    keys = store.list(f"{LOG_FOLDER}/")
    checkpoints = sorted(
        {v for k in keys if _is_checkpoint(k) and (v := log_version(k)) is not None},
        reverse=True,
    )
    oldest_allowed = (time.time() if now is None else now) - history_retention
    cut = None
    for version in checkpoints:
        if version > floor:
            continue
        committed_at = _commit_time(location, version)
        if committed_at is not None and committed_at <= oldest_allowed:
            cut = version
            break
    if cut is None:
        return None, 0
    doomed = [k for k in keys if (v := log_version(k)) is not None and v < cut]
    store.delete(doomed)
    return cut, len(doomed)


def _commit_time(location: Location, version: int) -> float | None:
    """When `version` was committed (its commitInfo timestamp), in seconds."""
    filesystem = location.arrow_filesystem()
    path = f"{location.fs_path}/{LOG_FOLDER}/{version:0{_VERSION_DIGITS}d}.json"
    try:
        with filesystem.open_input_stream(path) as stream:
            lines = stream.read().decode().splitlines()
    except (FileNotFoundError, OSError):
        return None
    for line in lines:
        action: dict[str, Any] = json.loads(line) if line.strip() else {}
        info = action.get("commitInfo")
        if info and "timestamp" in info:
            return float(info["timestamp"]) / 1000
    return None


class TableMaintenance:
    """Runs a maintenance pass on each owned table every `policy.every` commits."""

    def __init__(
        self,
        targets: dict[str, TableTarget],
        shared: set[str],
        protected: ProtectedVersions,
        policy: MaintenancePolicy,
    ) -> None:
        self.targets = targets
        self.shared = shared
        self.protected = protected
        self.policy = policy
        self._last_pass: dict[str, int] = {}
        self.reports: list[MaintenanceReport] = []

    def due(self, versions: dict[str, int]) -> list[str]:
        """The sinks whose table crossed a multiple of `every` since its last pass (so
        a job restarted more often than every `every` commits is maintained too)."""
        every = self.policy.every
        return [
            sink
            for sink, version in versions.items()
            if version // every > self._last_pass.get(sink, version - 1) // every
        ]

    def after_commit(
        self,
        versions: dict[str, int],
        guard: Callable[[], None] | None = None,
        snapshot: Callable[[str], DeltaTable] | None = None,
        head_seq: int | None = None,
    ) -> list[MaintenanceReport]:
        """Maintain the tables that are due (called by the committer after a marker), then
        retire the markers nothing needs (with `head_seq`, the marker just written).

        Args:
            guard: raises FencedError if this runner no longer owns the lineage; called
                before anything is deleted.
            snapshot: the committer's up-to-date table (saves reading the log again).
        """
        due = self.due(versions)
        if not due:
            return []
        floors = self.protected.floors()
        reports = []
        for sink in sorted(due):
            self._last_pass[sink] = versions[sink]
            if guard is not None:
                guard()
            table = snapshot(sink) if snapshot is not None else self.targets[sink].open()
            floor = None if floors is None else floors.get(sink, versions[sink])
            reports.append(self.maintain(sink, table, versions[sink], floor))
        self.reports.extend(reports)
        if head_seq is not None:
            self.retire_markers(head_seq, guard)
        return reports

    def retire_markers(self, head_seq: int, guard: Callable[[], None] | None = None) -> list[int]:
        """The lineage's markers nothing needs any more (lineage/markers.py), deleted."""
        retired = retire_markers(
            self.protected.store,
            self.protected.layout,
            head_seq=head_seq,
            protected=self.protected.seqs(),
            history_retention=self.policy.history_retention,
            keep_last=self.policy.markers_kept,
            guard=guard,
        )
        if retired:
            log.info(
                "retired %d commit markers (seqs %d..%d)", len(retired), retired[0], retired[-1]
            )
        return retired

    def maintain(
        self, sink: str, table: DeltaTable, version: int, floor: int | None
    ) -> MaintenanceReport:
        """Checkpoint the table, then expire its log below the protected floor."""
        began = time.monotonic()
        target = self.targets[sink]
        table.create_checkpoint()
        report = MaintenanceReport(sink=sink, version=version, floor=floor)
        if floor is not None and sink not in self.shared:
            crashpoints.reached("before_log_expiry")
            report.cut, report.log_entries_deleted = expire_log(
                target, min(floor, version), self.policy.history_retention
            )
        report.seconds = time.monotonic() - began
        log.info(
            "maintained table %s at version %d: floor %s, log cut at %s (%d entries deleted)",
            sink,
            version,
            floor,
            report.cut,
            report.log_entries_deleted,
        )
        return report


def lineage_protected_seqs(store: ObjectStore, layout: LineageLayout) -> set[int]:
    """The commit seqs a lineage must keep readable: its retained externalized
    checkpoints, the checkpoints savepoints pin, and every savepoint's seq."""
    from streamkeeper.snapshots.index import read_index
    from streamkeeper.snapshots.savepoints import SavepointRegistry

    index = read_index(store, layout)
    registry = SavepointRegistry(store, layout).read()
    seqs = set(index.ids) | set(index.pins.values())
    return seqs | {entry.seq for entry in registry.savepoints if entry.seq is not None}
