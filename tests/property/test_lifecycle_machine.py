"""The lifecycle's interleavings, explored: a stateful property test over the real code.

Actors (tests/support/lifecycle): runners of the job (blue, a takeover, a restart from a
lost machine's externalized checkpoint), green handing over from blue, a rollback (of a
failed probation, or on demand to any savepoint), a second job appending to a shared
table. Each runs the real commit, recovery, lineage, savepoint, upgrade and retention
code against real Delta tables on local disk, with synthetic batches instead of Spark,
in lock step: Hypothesis picks who moves next at every crash point and every object
write, crashes any actor at any step (a SIGKILL: it never runs again), and loses the
answer to any write (the write landed; the caller sees a reset).

After every rule the world is checked against a reference computed from the input
(support/lifecycle/checks.py); at the end the DAGs' way of finishing what was left
(roll back a green that died, redo a rollback left halfway, else start the job) runs
alone to the end of the input, and every table must hold every event exactly once.

`STREAMKEEPER_LIFECYCLE_EXAMPLES` sets the number of examples (CI runs a bounded
number; benchmarks/lifecycle_explore.py runs the deep profile and prints what it
explored).
"""

from __future__ import annotations

import os
import shutil

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from streamkeeper.commit.crashpoints import POINTS as COMMIT_POINTS
from streamkeeper.snapshots.savepoint_points import POINTS as SAVEPOINT_POINTS
from streamkeeper.upgrade.points import POINTS as LIFECYCLE_POINTS
from streamkeeper.upgrade.steps import promote_upgrade
from tests.support.lifecycle import actors
from tests.support.lifecycle.explored import EXPLORED
from tests.support.lifecycle.scene import Scene
from tests.support.lifecycle.scheduler import Actor
from tests.support.lifecycle.world import JOB, OTHER_JOB, World

MAX_EVENTS = 40
MAX_ACTORS = 3
RUN_TO_BOUND = 80
# Where `run_to` aims: the protocols' crash points and the moments between two writes
# that the holes found so far needed (blue answering a stop, a claim before its seal).
CRASH_POINTS = (
    *COMMIT_POINTS,
    *SAVEPOINT_POINTS,
    *LIFECYCLE_POINTS,
    "table_commit_landed",
    "table_restore_landed",
    "awaiting_command_result",
    "idle",
)
LOSABLE = ("store", "table_commit_landed", "table_fence_landed", "table_restore_landed")


class LifecycleMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.scene: Scene | None = None

    @property
    def world(self) -> World:
        assert self.scene is not None
        return self.scene.world

    @property
    def movable(self) -> list[Actor]:
        return [] if self.scene is None else self.scene.movable

    @property
    def busy(self) -> list[Actor]:
        """Actors with something to do (an idle runner only polls until fed or asked)."""
        busy = [a for a in self.movable if a.at != "idle"]
        return busy or self.movable

    # -- set-up ------------------------------------------------------------------------

    @initialize(shared=st.booleans(), batch_size=st.integers(1, 4), events=st.integers(2, 12))
    def setup(self, shared: bool, batch_size: int, events: int) -> None:
        self.scene = Scene(shared_table=shared, batch_size=batch_size, events=events)
        self.scene.spawn("blue", actors.runner(self.world, actors.RunnerPlan(batches=2)))

    def _job_started(self) -> bool:
        return self.scene is not None and (self.world.root / "jobs" / JOB / "job.json").exists()

    def _upgrade(self):  # noqa: ANN202 - UpgradeRecord | None
        return None if self.scene is None else self.scene.upgrade()

    def _complete_savepoints(self) -> list[str]:
        if not self._job_started():
            return []
        savepoints = actors.client_of(self.world).savepoints(JOB)
        return [s.id for s in savepoints if s.state == "complete"]

    def _indexed(self) -> list[int]:
        from streamkeeper.snapshots.index import read_index

        if not self._job_started():
            return []
        return read_index(self.world.layout().root.store(), self.world.layout()).ids

    # -- rules -------------------------------------------------------------------------

    @precondition(lambda self: self.movable)
    @rule(data=st.data(), steps=st.integers(1, 12))
    def step(self, data: st.DataObject, steps: int) -> None:
        actor = data.draw(st.sampled_from(self.busy), label="actor")
        for _ in range(steps):
            if not actor.movable:
                break
            actor.step()
            EXPLORED.point(actor.at)

    @precondition(lambda self: self.movable)
    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        actor = data.draw(st.sampled_from(self.movable), label="actor")
        actor.crash()
        EXPLORED.crash(actor.at)

    @precondition(lambda self: self.movable)
    @rule(data=st.data(), point=st.sampled_from(CRASH_POINTS), crash=st.booleans())
    def run_to(self, data: st.DataObject, point: str, crash: bool) -> None:
        """Run an actor until it reaches a named point (or a bound), maybe kill it there."""
        assert self.scene is not None
        actor = data.draw(st.sampled_from(self.busy), label="actor")
        try:
            self.scene.run(actor, until=point, bound=RUN_TO_BOUND)
        except AssertionError:
            return  # it did not get there: a move like any other
        if crash and actor.movable:
            actor.crash()
            EXPLORED.crash(point)

    @precondition(lambda self: self.movable)
    @rule(data=st.data(), kind=st.sampled_from(LOSABLE))
    def lose_an_answer(self, data: st.DataObject, kind: str) -> None:
        actor = data.draw(st.sampled_from(self.movable), label="actor")
        actor.lose_next.add(kind)

    @precondition(lambda self: self.scene is not None and self.world.inputs[JOB].count < MAX_EVENTS)
    @rule(events=st.integers(1, 6))
    def feed(self, events: int) -> None:
        assert self.scene is not None
        self.scene.feed(events)

    @precondition(lambda self: self.scene is not None and len(self.movable) < MAX_ACTORS)
    @rule(batches=st.integers(1, 4), savepoint_after=st.none() | st.integers(1, 4))
    def start_job(self, batches: int, savepoint_after: int | None) -> None:
        assert self.scene is not None
        plan = actors.RunnerPlan(batches=batches, savepoint_after=savepoint_after)
        self.scene.spawn("takeover", actors.runner(self.world, plan))

    @precondition(lambda self: self._job_started())
    @rule()
    def savepoint_command(self) -> None:
        actors.client_of(self.world).send_command(JOB, "savepoint", self_contained=True)

    @precondition(
        lambda self: self._job_started()
        and len(self.movable) < MAX_ACTORS
        and (self._upgrade() is None or self._upgrade().finished)
    )
    @rule(batches=st.integers(1, 4))
    def upgrade(self, batches: int) -> None:
        assert self.scene is not None
        self.scene.begin_handover(batches)

    @precondition(
        lambda self: self._upgrade() is not None
        and self._upgrade().phase == "live"
        and self._upgrade().probation is None
    )
    @rule(passed=st.booleans())
    def probation(self, passed: bool) -> None:
        assert self.scene is not None
        if passed:
            record = self._upgrade()
            client = actors.client_of(self.world)
            promote_upgrade(client, JOB, record.id, {"passed": True, "reason": "test"})
        else:
            self.scene.fail_probation()

    @precondition(lambda self: self._complete_savepoints() and len(self.movable) < MAX_ACTORS)
    @rule(data=st.data())
    def rollback_on_demand(self, data: st.DataObject) -> None:
        assert self.scene is not None
        target = data.draw(st.sampled_from(self._complete_savepoints()), label="savepoint")
        self.scene.spawn("rollback", actors.rollback(self.world, target, None))

    @precondition(lambda self: self._complete_savepoints() and len(self.movable) < MAX_ACTORS)
    @rule(data=st.data())
    def delete_savepoint(self, data: st.DataObject) -> None:
        """Retention by hand, beside everything else (the runners apply it too)."""
        assert self.scene is not None
        target = data.draw(st.sampled_from(self._complete_savepoints()), label="savepoint")
        self.scene.spawn("retention", actors.delete_savepoint(self.world, target))

    @precondition(lambda self: self._indexed() and len(self.movable) < MAX_ACTORS)
    @rule(which=st.sampled_from(["latest", "oldest"]))
    def lose_the_machine(self, which: str) -> None:
        """The driver's host is gone with its checkpoint folder; a start on a new one
        restores an externalized checkpoint."""
        assert self.scene is not None
        ids = self._indexed()
        for actor in self.movable:
            if not actor.name.startswith("other"):
                actor.crash()
        if self.world.live_dir.exists():
            shutil.rmtree(self.world.live_dir)
        checkpoint = "latest" if which == "latest" else str(ids[0])
        plan = actors.RunnerPlan(batches=2, from_checkpoint=checkpoint)
        self.scene.spawn("restore", actors.runner(self.world, plan))

    @precondition(
        lambda self: self.scene is not None
        and self.world.shared_table
        and len(self.movable) < MAX_ACTORS
        and not any(a.name.startswith("other") for a in self.movable)
    )
    @rule(batches=st.integers(1, 4))
    def other_job(self, batches: int) -> None:
        assert self.scene is not None
        plan = actors.RunnerPlan(job=OTHER_JOB, batches=batches)
        self.scene.spawn("other", actors.runner(self.world, plan))

    # -- what must hold ----------------------------------------------------------------

    @invariant()
    def holds(self) -> None:
        if self.scene is not None:
            self.scene.check()

    def teardown(self) -> None:
        if self.scene is None:
            return
        try:
            self.scene.finish()
            EXPLORED.end_example()
        finally:
            self.scene.close()


_NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target)


def _examples() -> int:
    return int(os.environ.get("STREAMKEEPER_LIFECYCLE_EXAMPLES", "25"))


LifecycleMachine.TestCase.settings = settings(
    max_examples=_examples(),
    stateful_step_count=int(os.environ.get("STREAMKEEPER_LIFECYCLE_STEPS", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    derandomize=os.environ.get("STREAMKEEPER_LIFECYCLE_SEED") is None,
    database=None,
    # Exploring for holes: no shrinking (a shrink of a threaded world takes minutes).
    phases=tuple(Phase)
    if os.environ.get("STREAMKEEPER_LIFECYCLE_SHRINK", "1") == "1"
    else _NO_SHRINK,
)

test_lifecycle_interleavings = pytest.mark.timeout(1800)(LifecycleMachine.TestCase)
