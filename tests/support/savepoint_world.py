"""A lineage's savepoint storage without Spark: a fake checkpoint directory written
batch by batch, its externalized checkpoints, and savepoints taken with the real
storage code (`SavepointWriter`), as `runtime/savepointing.py` takes them."""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path

from streamkeeper import injection
from streamkeeper.lineage.control import ControlPlane, Fence
from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.snapshots.externalized import ExternalizedCheckpoints
from streamkeeper.snapshots.index import read_index
from streamkeeper.snapshots.restore import download
from streamkeeper.snapshots.savepoint_capture import (
    in_savepoint,
    source_log_offsets,
    source_offsets,
)
from streamkeeper.snapshots.savepoint_check import check_savepoint
from streamkeeper.snapshots.savepoint_disposal import apply_savepoint_retention, sweep_savepoints
from streamkeeper.snapshots.savepoint_manifest import SavepointManifest, SavepointPlace
from streamkeeper.snapshots.savepoint_writer import SavepointWriter
from streamkeeper.snapshots.savepoints import (
    SavepointEntry,
    SavepointRegistry,
    new_savepoint_id,
    reasons_to_keep,
    savepoints_in_use,
)
from streamkeeper.spec import ExternalizedSpec
from streamkeeper.storage import LocalStore, Location

JOB = "blue"
NOW = 1_800_000_000.0
DAY = 86400.0


def _offsets(log_offset: int) -> str:
    """offsets/N as Spark writes it for one file source at `log_offset`."""
    metadata = {"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": {}}
    return f"v1\n{json.dumps(metadata)}\n{json.dumps({'logOffset': log_offset})}"


class Crash(Exception):
    """The process died here (a SIGKILL: nothing after it runs)."""


class World:
    """A lineage with a fake Spark checkpoint directory, its store and its runner."""

    def __init__(
        self,
        base: Path,
        retained: int | None = None,
        max_age: float | None = None,
        job: str = JOB,
    ) -> None:
        self.base = base
        self.job = job
        self.local = base / "checkpoint"
        self.store = LocalStore(base / "data")
        self.layout = LineageLayout(Location(str(base / "data")), job, job)
        self.control = ControlPlane(self.store, self.layout)
        self.retained, self.max_age = retained, max_age
        self.batch, self.seq, self.now = -1, 100, NOW
        self.rng = random.Random(3)
        self.captured: dict[str, dict[str, bytes]] = {}  # what each savepoint restores to
        self.new_owner()

    def new_owner(self) -> None:
        """A runner start: the next epoch takes the index over and sweeps leftovers."""
        lease = self.control.acquire(takeover=True)
        self.fence = Fence(self.control, lease)
        spec = ExternalizedSpec(enabled=True, retained=2)
        self.checkpoints = ExternalizedCheckpoints(
            self.store, self.layout, self.local, spec, self.fence
        )
        self.checkpoints.take_ownership()
        self.writer = SavepointWriter(
            self.store,
            self.layout,
            self.local,
            epoch=lease.epoch,
            guard=self.fence.check,
            checkpoints=self.checkpoints,
        )
        sweep_savepoints(self.store, self.layout, lease.epoch)

    @property
    def registry(self) -> SavepointRegistry:
        return SavepointRegistry(self.store, self.layout)

    # -- the job ---------------------------------------------------------------------

    def run_batch(self, planned: bool) -> None:
        """Batch N completes (state version N+1), maybe N+1 is planned; checkpoint it.

        The file source's log runs one entry ahead of the batches, as a run killed after
        logging an entry and before planning its batch leaves it: batch N reads entry N+1.
        """
        self.batch += 1
        n = self.batch
        self._write(f"sources/0/{n + 1}", f'v1\n{{"path": "file:/in/{n}.json"}}')
        self._write(f"offsets/{n}", _offsets(n + 1))
        self._write(f"state/0/0/{n + 1}.delta", f"state {n + 1} {self.rng.random()}")
        self._write(f"state/0/1/{n + 1}.delta", f"state {n + 1} {self.rng.random()}")
        self._write(f"commits/{n}", f"commit {n}")
        self._write("metadata", json.dumps({"id": "query-1"}))
        for old in (self.local / "state/0/0").glob(f"{n - 3}.delta"):
            old.unlink()  # Spark's maintenance
        self.seq += 1
        self.checkpoints.uploader.upload(self.seq)
        self.checkpoints.uploader.retain(2)
        if planned:  # Spark planned N+1 and its batch waits at the boundary
            self._write(f"sources/0/{n + 2}", f'v1\n{{"path": "file:/in/{n + 1}.json"}}')
            self._write(f"offsets/{n + 1}", _offsets(n + 2))

    def _write(self, path: str, text: str) -> None:
        target = self.local / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)

    def take(self, self_contained: bool, crash_at: str | None = None) -> str | None:
        """Take a savepoint of the latest batch (SavepointTaker's storage steps)."""
        if self.batch < 0:
            return None
        savepoint_id = new_savepoint_id(self.now)
        entry = SavepointEntry(
            id=savepoint_id,
            job=self.job,
            lineage=self.job,
            format="native",
            storage="self_contained" if self_contained else "pinned",
            epoch=self.fence.epoch,
            created_at=self.now,
        )
        source_logs = source_log_offsets(self.local, self.batch)
        expected = {
            f.relative_to(self.local).as_posix(): f.read_bytes()
            for f in self.local.rglob("*")
            if f.is_file()
            and in_savepoint(f.relative_to(self.local).as_posix(), self.batch, source_logs)
        }
        if crash_at is not None:
            injection.register(crash_at, crash)
        try:
            self.writer.register(entry)
            if self_contained:
                files = self.writer.self_contained(savepoint_id, self.seq, self.batch)
            else:
                files = self.writer.pinned(savepoint_id, self.seq, self.batch)
            offsets = source_offsets(self.local, self.batch)[0]
            self.writer.complete(_manifest(entry, self.seq, self.batch, files, offsets))
        except Crash:
            return None
        finally:
            injection.clear()
        self.captured[savepoint_id] = expected
        return savepoint_id

    def retention(self) -> list[str]:
        before = self.registry.read().savepoints
        in_use = savepoints_in_use(self.store)
        keep = {e.id for e in before if e.state == "complete" and reasons_to_keep(e, in_use)}
        deleted = apply_savepoint_retention(
            self.store,
            self.layout,
            retained=self.retained,
            max_age=self.max_age,
            epoch=self.fence.epoch,
            now=self.now,
        )
        assert not keep & set(deleted), "retention deleted a savepoint with a reason to keep it"
        self._check_retention_kept_enough()
        return deleted

    def _check_retention_kept_enough(self) -> None:
        complete = sorted(
            (e for e in self.registry.read().savepoints if e.state == "complete"),
            key=lambda e: e.created_at,
        )
        in_use = savepoints_in_use(self.store)
        newest = {e.id for e in complete[-self.retained :]} if self.retained else None
        for entry in complete[:-1]:
            beyond = newest is not None and entry.id not in newest
            too_old = self.max_age is not None and self.now - entry.created_at > self.max_age
            if beyond or too_old:
                assert reasons_to_keep(entry, in_use), f"retention left {entry.id}"

    # -- invariants --------------------------------------------------------------------

    def check(self, restore: bool = False) -> None:
        """The invariants; `restore`: also restore every savepoint and compare its bytes."""
        registry = self.registry.read()
        index = read_index(self.store, self.layout)
        assert set(index.pins.values()) <= set(index.ids), "a pinned checkpoint was dropped"
        known = {e.id for e in registry.savepoints}
        for entry in registry.savepoints:
            if entry.state != "complete":
                continue
            place = SavepointPlace(self.store, self.layout.savepoint(entry.id))
            check = check_savepoint(place, entry.id, entry=entry, layout=self.layout)
            assert not check.broken, check.problems
            if restore and entry.id in self.captured:
                assert self._restored(place, check.manifest) == self.captured[entry.id]
        for savepoint_id in set(self.captured) - known:  # forgotten: nothing of it is left
            assert self.store.list(self.layout.savepoint(savepoint_id)) == []
            assert savepoint_id not in index.pins

    def _restored(self, place: SavepointPlace, manifest: SavepointManifest | None) -> dict:
        assert manifest is not None
        with tempfile.TemporaryDirectory() as work:
            target = Path(work) / "restored"
            download(
                place.store,
                manifest.files,
                target,
                label=manifest.id,
                keys=lambda f: place.file_key(manifest, f),
            )
            return {
                p.relative_to(target).as_posix(): p.read_bytes()
                for p in target.rglob("*")
                if p.is_file()
            }


def crash(**_context: object) -> None:
    raise Crash


def _manifest(
    entry: SavepointEntry, seq: int, batch: int, files: list, offsets: list
) -> SavepointManifest:
    return SavepointManifest(
        id=entry.id,
        job=entry.job,
        lineage=entry.lineage,
        format="native",
        storage=entry.storage,  # type: ignore[arg-type]
        seq=seq,
        batch_id=batch,
        query_id="query-1",
        spark_version="4.2.0",
        spec_hash="-",
        code_version="-",
        state_backend="hdfs",
        partitions=2,
        operators=[],
        source_offsets=offsets,
        tables={},
        files=files,
        checkpoint_id=seq if entry.storage == "pinned" else None,
        started_at=entry.created_at,
    )
