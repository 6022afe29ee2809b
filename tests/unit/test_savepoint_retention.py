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
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from streamkeeper import injection
from streamkeeper.errors import SavepointError
from streamkeeper.snapshots.index import read_index
from streamkeeper.snapshots.savepoint_disposal import delete_savepoint
from streamkeeper.snapshots.savepoints import (
    SavepointEntry,
    reasons_to_keep,
    savepoints_in_use,
)
from tests.support.savepoint_world import DAY, JOB, Crash, World, crash

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
        kept = reasons_to_keep(entry, savepoints_in_use(world.store))
        try:
            delete_savepoint(world.store, world.layout, entry.id)
            assert not kept, f"deleted {entry.id} although {kept}"
            event("deleted")
        except SavepointError:
            assert kept, f"refused to delete {entry.id} with no reason to keep it"
            event("delete refused")
    elif kind == "delete_crash" and not reasons_to_keep(entry, savepoints_in_use(world.store)):
        injection.register(argument[1], crash)  # type: ignore[index]
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
