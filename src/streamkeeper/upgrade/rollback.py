"""A rollback: the job's tables back to a savepoint, nothing of the rolled-back era left to
commit, and the start from the savepoint the only one allowed until it has run.

The order (each step safe to crash in: a retried rollback does them all again, each is
idempotent; UPGRADE.md lists what each crash leaves and how the DAGs go on):

1. checks, reading only: the savepoint records a version of every table; a table another
   job also writes is an append table (a shared merge table cannot give back only this
   job's changes: refused);
2. the lineage's next epoch E: every runner (green, blue, an older rollback) is fenced;
3. `lineages/{lineage}/rollback.json` and `jobs/{job}/rewind-pending.json`, each by
   compare-and-swap that refuses a newer rollback's: from here no WAL manifest of an
   epoch below E is ever committed (recovery.py), and no start but the one from the
   savepoint runs (runtime/ownership.py);
4. every table fenced with E  ⚡ `rollback_after_fence`;
5. every pending WAL manifest disposed of: claims voided and swept, sealed ones
   discarded; files a table version holds stay (commit/disposal.py);
6. the checkpoint index forgets the checkpoints after the savepoint (unless a savepoint
   pins them): the latest externalized checkpoint is the savepoint's era again;
7. each table back to the savepoint's version: a Delta RESTORE conditional on E (made
   from a snapshot fenced by E, carrying E, never rebased onto a newer snapshot), so a
   newer rollback's fence makes it fail instead of reverting what that rollback's blue
   committed; a table shared with another job instead loses exactly this job's files of
   the seqs after the savepoint  ⚡ `rollback_between_restores`;
8. a commit marker at a new seq R above everything (`rewound_to`: the savepoint): the
   lineage's head. Every seq of the rolled-back era is below it, so obsolete; the start
   from the savepoint is no rewind (the tables are at its versions) and needs no
   `--allow-rewind`; a late start from it, after its blue committed past R, is one.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from streamkeeper import injection
from streamkeeper.client import StreamkeeperClient
from streamkeeper.commit.disposal import Disposed, ManifestDisposal
from streamkeeper.commit.sequence import initial_sequence
from streamkeeper.commit.tables import (
    TableTarget,
    fence_table,
    restore_table,
    table_writers,
    take_back_files,
)
from streamkeeper.commit.wal import WriteAheadLog
from streamkeeper.errors import FencedError, UnknownSavepointError
from streamkeeper.lineage.control import ControlPlane, Lease
from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.snapshots.retention import forget_checkpoints_after
from streamkeeper.snapshots.savepoint_manifest import SavepointManifest
from streamkeeper.snapshots.savepoints import ROLLBACK_HOLDER, SavepointEntry, SavepointRegistry
from streamkeeper.storage import Location, ObjectStore
from streamkeeper.upgrade import points
from streamkeeper.upgrade.record import UpgradeError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TablesRestored:
    """What a rollback did: its epoch, each table's versions, its marker's seq."""

    epoch: int
    tables: dict[str, dict[str, Any]]
    marker_seq: int | None = None
    disposed: dict[str, list[int]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "tables": self.tables,
            "marker_seq": self.marker_seq,
            "disposed": self.disposed,
        }


def restore_tables(
    client: StreamkeeperClient, job: str, manifest: SavepointManifest
) -> TablesRestored:
    """Roll the job's lineage back to the savepoint `manifest` (the module's steps 1-8);
    the restart from the savepoint is the caller's (a launcher, `--takeover`).

    Raises:
        UpgradeError: the savepoint cannot be a rollback target, or a merge table is
            shared with another job (each names the fix); nothing was changed.
        FencedError: a newer rollback took the lineage meanwhile.
    """
    layout = LineageLayout(client.location, manifest.lineage, job)
    targets = _targets(client, layout, manifest)
    shared = _shared_tables(job, manifest, targets)
    injection.load_from_environment()  # an Airflow task's process: the chaos tests' faults
    _hold_target(client.store, layout, manifest.id)
    control = ControlPlane(client.store, layout)
    lease = control.acquire(takeover=True)
    record = {"savepoint": manifest.id, "seq": manifest.seq, "at": time.time()}
    control.write_owned(layout.rollback, lease, record)
    # Before the first table changes: a start that is not from this savepoint is refused
    # until one from it has run, so a rollback failing halfway cannot be resumed past.
    control.write_owned(layout.rewind_pending, lease, record)
    for target in targets.values():
        fence_table(target, lease.epoch)
    points.reached("rollback_after_fence")
    disposed = _dispose_of_the_wal(client, layout, control, lease, targets)
    control.check_not_fenced(lease)
    forget_checkpoints_after(client.store, layout, lease.epoch, manifest.seq)
    restored: dict[str, dict[str, Any]] = {}
    for index, (name, target) in enumerate(targets.items()):
        if index > 0:
            points.reached("rollback_between_restores")
        restored[name] = _restore_one(target, layout, manifest, lease.epoch, name in shared)
    marker_seq = _write_marker(client, layout, control, lease, manifest, targets, restored)
    record["marker_seq"] = marker_seq  # every table restored: the start from it may run
    control.write_owned(layout.rollback, lease, record)
    control.write_owned(layout.rewind_pending, lease, record)
    log.info(
        "lineage %s rolled back to savepoint %s (seq %d) at epoch %d: %s; head marker %d",
        layout.lineage,
        manifest.id,
        manifest.seq,
        lease.epoch,
        restored,
        marker_seq,
    )
    return TablesRestored(
        lease.epoch,
        restored,
        marker_seq,
        {"discarded": disposed.discarded, "swept_claims": disposed.swept_claims},
    )


def _targets(
    client: StreamkeeperClient, layout: LineageLayout, manifest: SavepointManifest
) -> dict[str, TableTarget]:
    missing = sorted(n for n, t in manifest.tables.items() if t.version is None)
    if missing:
        raise UpgradeError(
            f"savepoint {manifest.id!r} recorded no table version for {', '.join(missing)}: "
            "it cannot be a rollback target; pick a later savepoint"
        )
    return {
        name: TableTarget(
            name,
            Location(seq.table, client.location.s3),
            layout.data_app_id(name),
            layout.fence_app_id(),
        )
        for name, seq in manifest.tables.items()
    }


def _shared_tables(
    job: str, manifest: SavepointManifest, targets: dict[str, TableTarget]
) -> set[str]:
    """Tables other jobs also write: append ones are taken back file by file; merge ones
    refuse the rollback (their rows are rewritten in place, other jobs' with ours)."""
    shared = set()
    for name, target in targets.items():
        others = {k: v for k, v in table_writers(target).items() if k != target.lineage}
        if not others:
            continue
        if _is_merge_table(target):
            writers = ", ".join(sorted(f"{c.get('job')!r}" for c in others.values()))
            raise UpgradeError(
                f"sink {name!r} of job {job!r} merges into table {target.location.uri!r}, "
                f"which job(s) {writers} also write: a rollback cannot take back only "
                f"{job!r}'s changes of a merge table, and a RESTORE would take theirs too. "
                "Nothing was changed. Give the sink a table of its own before rolling "
                "back, or restore the table by hand from its history"
            )
        shared.add(name)
    return shared


def _is_merge_table(target: TableTarget) -> bool:
    """Whether this lineage merges into the table (from its writer claim or its history)."""
    claim = table_writers(target).get(target.lineage) or {}
    if "output" in claim:
        return claim["output"] == "merge"
    history = target.open().history(20)
    return any(
        c.get("operation") == "MERGE" and c.get("streamkeeper.lineage") == target.lineage
        for c in history
    )


def _dispose_of_the_wal(
    client: StreamkeeperClient,
    layout: LineageLayout,
    control: ControlPlane,
    lease: Lease,
    targets: dict[str, TableTarget],
) -> Disposed:
    """Every manifest left by the rolled-back epochs: none is ever committed now."""
    wal = WriteAheadLog(client.store, layout)
    disposal = ManifestDisposal(client.store, layout, wal, targets)
    done = Disposed()
    for manifest in wal.pending():
        control.check_not_fenced(lease)
        if not manifest.complete and disposal.sweep_claim(manifest, control, lease.epoch, done):
            continue
        current = manifest if manifest.complete else wal.read(manifest.seq)  # sealed since
        if current is not None and current.complete:
            disposal.discard(current, obsolete=True, done=done)
    return done


def _restore_one(
    target: TableTarget,
    layout: LineageLayout,
    manifest: SavepointManifest,
    epoch: int,
    shared: bool,
) -> dict[str, Any]:
    version = int(manifest.tables[target.sink].version)  # type: ignore[arg-type]
    before = target.open().version()
    try:
        if shared:
            now = take_back_files(target, layout.precommit_folder, manifest.seq, epoch)
        else:
            now = restore_table(target, version, epoch)
    except FencedError:
        log.error("rollback at epoch %d fenced while restoring %s", epoch, target.location.uri)
        raise
    how = "files after the savepoint taken back" if shared else "restored"
    log.info("table %s: %s (version %d -> %d)", target.location.uri, how, before, now)
    return {"from": before, "to": version, "now": now, "shared": shared}


def _write_marker(
    client: StreamkeeperClient,
    layout: LineageLayout,
    control: ControlPlane,
    lease: Lease,
    manifest: SavepointManifest,
    targets: dict[str, TableTarget],
    restored: dict[str, dict[str, Any]],
) -> int:
    """The head after the rollback: a marker above every seq seen, naming the savepoint."""
    store = client.store
    seq = initial_sequence(store, layout, targets)
    savepoint_marker = store.read_json(layout.marker(manifest.seq)) or {}
    marker = {
        "seq": seq,
        "query_id": manifest.query_id,
        "batch_id": manifest.batch_id,
        "checkpoint_dir": None,
        "epoch": lease.epoch,
        "versions": {name: int(r["now"]) for name, r in restored.items()},
        "rows": {},
        "writers": [],
        "committed_at": time.time(),
        "visibility_delay_ms": None,
        "input": savepoint_marker.get("input"),
        "rewound_to": {"savepoint": manifest.id, "seq": manifest.seq},
    }
    while True:
        control.check_not_fenced(lease)
        if store.create_json(layout.marker(seq), marker):
            return seq
        existing = store.read_json(layout.marker(seq)) or {}
        if (
            existing.get("rewound_to") == marker["rewound_to"]
            and existing.get("epoch") == lease.epoch
        ):
            return seq  # ours, its answer lost
        seq += 1
        marker["seq"] = seq


def _hold_target(store: ObjectStore, layout: LineageLayout, savepoint_id: str) -> None:
    """Keep the savepoint from retention and `delete` until the start from it has run:
    a rollback left halfway is redone from it, so it must outlive the rollback. By
    compare-and-swap on the registry, against a deletion's `deleting` mark: one of the two
    sees the other (found by the deep profile, seed 14: a runner's retention deleted the
    target between the rollback's check and its restores, and nothing could finish it)."""

    def hold(entry: SavepointEntry) -> None:
        if entry.state != "complete":
            raise UpgradeError(
                f"savepoint {savepoint_id!r} is {entry.state}: it cannot be rolled back to "
                "now; pick another savepoint"
            )
        entry.holds[ROLLBACK_HOLDER] = "the target of a rollback, until the start from it ran"

    try:
        SavepointRegistry(store, layout).edit(savepoint_id, hold)
    except UnknownSavepointError as error:
        if store.exists(layout.savepoint_manifest(savepoint_id)):
            return  # a savepoint the registry never listed: nothing deletes it either
        raise UpgradeError(f"{error}; nothing was rolled back: pick another savepoint") from None
