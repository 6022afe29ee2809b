"""Savepoint retention as a property, on local storage, with the real storage code:
checkpoints uploaded and retained, savepoints pinned or self-contained, protected,
held, in use by a job, deleted, and crashes in the middle of taking or deleting one.

After every step: each complete savepoint is whole and restores to exactly what it
captured (pinned files survive checkpoint retention); nothing with a reason to be
kept was deleted; an entry is forgotten only after its data, pin and manifest are
gone; retention kept the newest N and dropped what it had to.
"""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from streamkeeper import injection
from streamkeeper.errors import SavepointError
from streamkeeper.lineage.control import ControlPlane, Fence
from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.snapshots.externalized import ExternalizedCheckpoints
from streamkeeper.snapshots.index import read_index
from streamkeeper.snapshots.restore import download
from streamkeeper.snapshots.savepoint_capture import in_savepoint
from streamkeeper.snapshots.savepoint_check import check_savepoint
from streamkeeper.snapshots.savepoint_disposal import (
    apply_savepoint_retention,
    delete_savepoint,
    sweep_savepoints,
)
from streamkeeper.snapshots.savepoint_manifest import SavepointManifest, SavepointPlace
from streamkeeper.snapshots.savepoint_writer import SavepointWriter
from streamkeeper.snapshots.savepoints import (
    SavepointEntry,
    SavepointRegistry,
    jobs_restored_from,
    new_savepoint_id,
    reasons_to_keep,
)
from streamkeeper.spec import ExternalizedSpec
from streamkeeper.storage import LocalStore, Location

JOB = "blue"
NOW = 1_800_000_000.0
DAY = 86400.0


class Crash(Exception):
    """The process died here (a SIGKILL: nothing after it runs)."""


class World:
    """A lineage with a fake Spark checkpoint directory, its store and its runner."""

    def __init__(self, base: Path, retained: int | None, max_age: float | None) -> None:
        self.base = base
        self.local = base / "checkpoint"
        self.store = LocalStore(base / "data")
        self.layout = LineageLayout(Location(str(base / "data")), JOB, JOB)
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
        """Batch N completes (state version N+1), maybe N+1 is planned; checkpoint it."""
        self.batch += 1
        n = self.batch
        self._write(f"offsets/{n}", f"offsets {n}")
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
            self._write(f"offsets/{n + 1}", f"offsets {n + 1}")

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
            job=JOB,
            lineage=JOB,
            format="native",
            storage="self_contained" if self_contained else "pinned",
            epoch=self.fence.epoch,
            created_at=self.now,
        )
        expected = {
            f.relative_to(self.local).as_posix(): f.read_bytes()
            for f in self.local.rglob("*")
            if f.is_file() and in_savepoint(f.relative_to(self.local).as_posix(), self.batch)
        }
        if crash_at is not None:
            injection.register(crash_at, _crash)
        try:
            self.writer.register(entry)
            if self_contained:
                files = self.writer.self_contained(savepoint_id, self.seq, self.batch)
            else:
                files = self.writer.pinned(savepoint_id, self.seq, self.batch)
            self.writer.complete(_manifest(entry, self.seq, self.batch, files))
        except Crash:
            return None
        finally:
            injection.clear()
        self.captured[savepoint_id] = expected
        return savepoint_id

    def retention(self) -> list[str]:
        before = self.registry.read().savepoints
        in_use = jobs_restored_from(self.store)
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
        in_use = jobs_restored_from(self.store)
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


def _crash(**_context: object) -> None:
    raise Crash


def _manifest(entry: SavepointEntry, seq: int, batch: int, files: list) -> SavepointManifest:
    return SavepointManifest(
        id=entry.id,
        job=JOB,
        lineage=JOB,
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
        source_offsets=[],
        tables={},
        files=files,
        checkpoint_id=seq if entry.storage == "pinned" else None,
        started_at=entry.created_at,
    )


TAKE_CRASHES = [
    "savepoint_after_register",
    "savepoint_during_copy",
    "savepoint_after_pin",
    "savepoint_before_manifest",
    "savepoint_after_manifest",
]
DELETE_CRASHES = ["savepoint_dispose_after_mark", "savepoint_dispose_after_data"]

steps = st.lists(
    st.one_of(
        st.tuples(st.just("batch"), st.booleans()),
        st.tuples(st.just("take"), st.booleans()),
        st.tuples(st.just("batch"), st.booleans()),
        st.tuples(st.just("take"), st.booleans()),  # listed twice: the common steps
        st.tuples(st.just("take_crash"), st.tuples(st.booleans(), st.sampled_from(TAKE_CRASHES))),
        st.tuples(st.just("protect"), st.integers(0, 20)),
        st.tuples(st.just("hold"), st.integers(0, 20)),
        st.tuples(st.just("use"), st.integers(0, 20)),
        st.tuples(st.just("delete"), st.integers(0, 20)),
        st.tuples(
            st.just("delete_crash"), st.tuples(st.integers(0, 20), st.sampled_from(DELETE_CRASHES))
        ),
        st.tuples(st.just("age"), st.floats(0, 10 * DAY)),
        st.tuples(st.just("restart"), st.none()),
    ),
    min_size=1,
    max_size=30,
)
# Every example starts with savepoints to act on: pinned, then self-contained.
PRELUDE = [("batch", True), ("take", False), ("batch", False), ("take", True)]


def _pick(world: World, n: int) -> SavepointEntry | None:
    entries = [e for e in world.registry.read().savepoints if e.state == "complete"]
    return entries[n % len(entries)] if entries else None


def _step(world: World, kind: str, argument: object) -> None:  # noqa: C901 - one branch a step
    if kind == "batch":
        world.run_batch(planned=bool(argument))
    elif kind == "take":
        if world.take(self_contained=bool(argument)) is not None:
            event("savepoint taken")
            if world.retention():
                event("retention deleted savepoints")
    elif kind == "take_crash":
        self_contained, point = argument  # type: ignore[misc]
        if world.take(self_contained, crash_at=point) is None and world.batch >= 0:
            event(f"take crashed at {point}")
        world.new_owner()  # the next start sweeps what the crash left
    elif kind == "age":
        world.now += float(argument)  # type: ignore[arg-type]
    elif kind == "restart":
        world.new_owner()
    elif entry := _pick(world, int(argument) if isinstance(argument, int) else argument[0]):  # type: ignore[index]
        _act_on(world, kind, argument, entry)


def _act_on(world: World, kind: str, argument: object, entry: SavepointEntry) -> None:
    registry = world.registry
    if kind == "protect":
        if entry.protected:
            registry.unprotect(entry.id)
        else:
            registry.protect(entry.id, "rollback target")
    elif kind == "hold":
        if entry.holds:
            registry.release(entry.id, "upgrade:1")
        else:
            registry.hold(entry.id, "upgrade:1", "pending upgrade restores it")
    elif kind == "use":
        record = {"job": "green", "restored_from_savepoint": {"id": entry.id, "lineage": JOB}}
        (world.store.root / "jobs" / "green").mkdir(parents=True, exist_ok=True)
        (world.store.root / "jobs" / "green" / "job.json").write_text(json.dumps(record))
    elif kind == "delete":
        kept = reasons_to_keep(entry, jobs_restored_from(world.store))
        try:
            delete_savepoint(world.store, world.layout, entry.id)
            assert not kept, f"deleted {entry.id} although {kept}"
            event("deleted")
        except SavepointError:
            assert kept, f"refused to delete {entry.id} with no reason to keep it"
            event("delete refused")
    elif kind == "delete_crash" and not reasons_to_keep(entry, jobs_restored_from(world.store)):
        injection.register(argument[1], _crash)  # type: ignore[index]
        try:
            delete_savepoint(world.store, world.layout, entry.id, epoch=world.fence.epoch)
        except Crash:
            pass
        finally:
            injection.clear()
        assert world.registry.read().find(entry.id) is not None  # not forgotten yet
        world.new_owner()  # the sweep finishes the deletion
        assert world.registry.read().find(entry.id) is None
        event(f"delete crashed at {argument[1]}")  # type: ignore[index]


@pytest.mark.parametrize(("retained", "max_age"), [(2, None), (None, 3 * DAY), (3, 5 * DAY)])
def test_retention_never_loses_what_is_referenced(
    retained: int | None, max_age: float | None
) -> None:
    @settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(steps=steps)
    def run(steps: list) -> None:
        with tempfile.TemporaryDirectory() as base:
            world = World(Path(base), retained, max_age)
            try:
                for kind, argument in PRELUDE + steps:
                    _step(world, kind, argument)
                    world.check()
                world.check(restore=True)
            finally:
                injection.clear()

    run()


def test_a_pinned_savepoint_keeps_its_checkpoint_through_checkpoint_retention(
    tmp_path: Path,
) -> None:
    world = World(tmp_path, retained=None, max_age=None)
    world.run_batch(planned=True)
    pinned = world.take(self_contained=False)
    for _ in range(5):
        world.run_batch(planned=False)
    index = read_index(world.store, world.layout)
    assert pinned is not None and index.pins == {pinned: 101}
    assert index.ids[0] == 101 and len(index.ids) == 3  # retained 2 + the pinned one
    world.check(restore=True)
    # The planned offsets/1 at capture time is not in the savepoint.
    assert "offsets/1" not in world.captured[pinned] and "offsets/0" in world.captured[pinned]
    delete_savepoint(world.store, world.layout, pinned)
    world.run_batch(planned=False)  # the owner's next checkpoint retention drops it
    assert read_index(world.store, world.layout).ids == [106, 107]
    world.check(restore=True)
