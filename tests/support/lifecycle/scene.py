"""A lifecycle scene: a world, its actors, and the DAGs' way of finishing it.

Used by the property test (which draws the moves) and by the tests of each hole it
found (which write one interleaving down).
"""

from __future__ import annotations

import itertools
import os
import random
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

from streamkeeper import injection
from streamkeeper.runtime import savepointing
from streamkeeper.upgrade.record import UpgradeRecord, UpgradeRecords
from tests.support.lifecycle import actors
from tests.support.lifecycle.checks import (
    IndexWatch,
    every_version_is_whole,
    output_is_a_prefix,
    output_is_exact,
    savepoints_are_whole,
    tables_reference_only_existing_files,
)
from tests.support.lifecycle.explored import EXPLORED
from tests.support.lifecycle.scheduler import Actor, install_pause_points, install_store_steps
from tests.support.lifecycle.world import JOB, OTHER_JOB, World

RUN_BOUND = 400  # steps an actor may take to reach a point, or its end


class Scene:
    """One world and the actors in it."""

    def __init__(self, *, shared_table: bool = False, batch_size: int = 2, events: int = 6) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="sk-lifecycle-"))
        injection.clear()
        install_pause_points()
        self._undo_store = install_store_steps()
        # Numbered savepoint ids (creation order) where a report must replay exactly: the
        # deep profile and the replay set STREAMKEEPER_LIFECYCLE_NUMBERED_IDS.
        numbered = os.environ.get("STREAMKEEPER_LIFECYCLE_NUMBERED_IDS") == "1"
        self._undo_ids = _numbered_savepoint_ids() if numbered else (lambda: None)
        self._undo_uuids = _seeded_uuids()
        self.world = World(self.base, shared_table=shared_table, batch_size=batch_size)
        self.world.inputs[JOB].count = events
        self.world.inputs[OTHER_JOB].count = events
        self.actors: list[Actor] = []
        self.upgrade_id: str | None = None
        self.index = IndexWatch()

    # -- actors ------------------------------------------------------------------------

    def spawn(self, name: str, operation: Any) -> Actor:
        actor = Actor(f"{name}#{len(self.actors)}", operation)
        self.actors.append(actor)
        actor.start()
        EXPLORED.actors.add(name)
        return actor

    @property
    def movable(self) -> list[Actor]:
        return [a for a in self.actors if a.movable]

    def run(self, actor: Actor, until: str | None = None, bound: int = RUN_BOUND) -> Actor:
        """Step `actor` until it is at `until` (None: until it ends or idles)."""
        for _ in range(bound):
            if not actor.movable or (until is not None and actor.at == until):
                return actor
            actor.step()
            EXPLORED.point(actor.at)
            if until is None and actor.at == "idle":
                return actor
        if until is not None and actor.at != until:
            raise AssertionError(f"{actor!r} did not reach {until} in {bound} steps")
        return actor

    def feed(self, events: int) -> None:
        for job in (JOB, OTHER_JOB):
            self.world.inputs[job].count += events

    def upgrade(self) -> UpgradeRecord | None:
        if self.upgrade_id is None:
            return None
        return UpgradeRecords(actors.client_of(self.world).store, JOB).read(self.upgrade_id)

    def begin_handover(self, batches: int = 3) -> Actor:
        self.upgrade_id = actors.begin_handover(self.world)
        return self.spawn("green", actors.green(self.world, self.upgrade_id, batches))

    def fail_probation(self) -> Actor:
        """The probation task's verdict, then the rollback task."""
        record = self.upgrade()
        assert record is not None and record.handover is not None
        client = actors.client_of(self.world)
        UpgradeRecords(client.store, JOB).update(
            record.id, lambda r: setattr(r, "probation", {"passed": False, "reason": "test"})
        )
        target = record.handover["blue_savepoint"]
        return self.spawn("rollback", actors.rollback(self.world, target, record.id))

    # -- what must hold ----------------------------------------------------------------

    def check(self) -> None:
        output_is_a_prefix(self.world)
        tables_reference_only_existing_files(self.world)
        savepoints_are_whole(self.world, self.world.layout())
        self.index.check(self.world.layout())

    def finish(self) -> None:
        """Every actor dies; the DAGs finish what is left; the job runs to the end of its
        input alone; every table must then hold every event exactly once."""
        for actor in self.movable:
            actor.crash()
        self.world.inputs[OTHER_JOB].count = self.world.inputs[JOB].count
        plan = actors.RunnerPlan(until_input_ends=True)
        finisher = self.spawn(
            "finish", actors.finishing_operation(self.world, self.upgrade(), plan)
        )
        self._to_the_end(finisher, "the run that finishes the job")
        if self.world.shared_table:
            other_plan = actors.RunnerPlan(job=OTHER_JOB, until_input_ends=True)
            other = self.spawn("other", actors.runner(self.world, other_plan))
            self._to_the_end(other, "the other job's last run")
        self.check()
        every_version_is_whole(self.world)
        output_is_exact(self.world)

    def _to_the_end(self, actor: Actor, what: str) -> None:
        while actor.movable:
            actor.step()
        if actor.error is not None:
            raise AssertionError(f"{what} failed: {actor.error!r}") from actor.error

    def close(self) -> None:
        for actor in self.actors:
            actor.crash()
            actor.release()
        self._undo_store()
        self._undo_ids()
        self._undo_uuids()
        injection.clear()
        shutil.rmtree(self.base, ignore_errors=True)


def _numbered_savepoint_ids() -> Any:
    """Savepoint ids by creation order, so a printed falsifying example (which names the
    savepoints it drew) replays exactly (tests/support/lifecycle/replay.py)."""
    original = savepointing.new_savepoint_id
    counter = itertools.count(1)
    savepointing.new_savepoint_id = lambda now=None: f"sp-20000101T000000-{next(counter):08x}"

    def undo() -> None:
        savepointing.new_savepoint_id = original

    return undo


def _seeded_uuids() -> Any:
    """uuid4 from a seeded generator while the scene lives: file names, tokens and ids
    then come out the same in every run of the same moves, so listing and sort orders
    do too, and a derandomized property run explores the same interleavings each time
    (with random uuids, CI's 25 examples passed or failed by luck)."""
    original = uuid.uuid4
    generator = random.Random(0)
    uuid.uuid4 = lambda: uuid.UUID(int=generator.getrandbits(128), version=4)

    def undo() -> None:
        uuid.uuid4 = original

    return undo
