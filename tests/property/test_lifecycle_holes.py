"""Each hole of the lifecycle (issue 23, 1.1-1.7) as one interleaving written down.

The property test (test_lifecycle_machine.py) explores interleavings at random; these
pin the ones that broke an invariant, with the same actors and checks, so each stays
fixed. Every scene ends the way the DAGs finish a lifecycle (`Scene.finish`) and is then
compared with the input: every event once in every table.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Iterator

import pytest

from streamkeeper.errors import CheckpointRestoreError, FencedError, SavepointError
from streamkeeper.snapshots.index import read_index
from streamkeeper.snapshots.savepoints import SavepointRegistry
from streamkeeper.upgrade.steps import promote_upgrade
from tests.support.lifecycle import actors
from tests.support.lifecycle.scene import Scene
from tests.support.lifecycle.scheduler import Actor
from tests.support.lifecycle.world import JOB, OTHER_JOB, ConcurrentQueryError


@pytest.fixture
def scene() -> Iterator[Scene]:
    made = Scene(batch_size=2, events=4)
    yield made
    made.close()


def _blue(scene: Scene, batches: int = 2, **plan: object) -> Actor:
    blue = scene.spawn(
        "blue", actors.runner(scene.world, actors.RunnerPlan(batches=batches, **plan))
    )
    return scene.run(blue)


def _handover(scene: Scene, blue: Actor, green_batches: int = 3) -> Actor:
    """Green asks blue to stop; blue answers with S1 and ends; green goes live."""
    green = scene.begin_handover(green_batches)
    scene.run(green, until="awaiting_command_result")
    scene.run(blue)  # picks the stop up, takes S1, drains, stops
    assert blue.done and blue.error is None, blue.error
    scene.run(green, until="handover_after_live")
    return green


def test_1_1_a_rollback_disposes_of_a_batch_green_half_committed(scene: Scene) -> None:
    """Green commits its first live batch to one table and dies before the next; the
    rollback restores S1 and starts blue from it: blue must not commit green's batch to
    the other table, then replay the same input (the issue saw 754 ids twice)."""
    blue = _blue(scene)
    scene.feed(4)
    green = _handover(scene, blue)
    scene.run(green, until="between_table_commits")  # `last` holds green's batch
    green.crash()
    rollback = scene.run(scene.fail_probation())
    assert rollback.error is None, rollback.error
    scene.check()
    scene.finish()


def test_1_2_a_rollback_never_takes_another_jobs_rows_from_a_shared_table() -> None:
    scene = Scene(shared_table=True, batch_size=2, events=4)
    try:
        blue = _blue(scene, batches=1, savepoint_after=1)
        other = scene.spawn("other", actors.runner(scene.world, actors.RunnerPlan(job=OTHER_JOB)))
        scene.run(other)  # two batches of the other job in the shared table
        savepoint = actors.client_of(scene.world).savepoints(JOB)[-1].id
        blue.crash()
        rollback = scene.run(scene.spawn("rollback", actors.rollback(scene.world, savepoint, None)))
        assert rollback.error is None, rollback.error
        scene.check()
        scene.finish()
    finally:
        scene.close()


def test_1_3_a_claim_swept_by_a_takeover_can_no_longer_be_sealed(scene: Scene) -> None:
    """A takeover's recovery sweeps the files of a batch whose runner is still alive
    (claimed, written, not sealed); that runner must not seal a manifest listing them."""
    blue = scene.spawn("blue", actors.runner(scene.world, actors.RunnerPlan(batches=2)))
    scene.run(blue, until="batch_before_manifest")
    takeover = scene.spawn("takeover", actors.runner(scene.world, actors.RunnerPlan(batches=2)))
    scene.run(takeover, until="batch_start")  # recovered (swept blue's files), then dies
    takeover.crash()
    scene.run(blue)  # seals (or not), then learns it is fenced
    assert isinstance(blue.error, FencedError), blue.error
    scene.check()
    scene.finish()


def test_1_4_a_start_that_would_read_the_input_again_is_refused(scene: Scene) -> None:
    """The lineage has committed checkpoints; its checkpoint folder is empty (moved away
    by a handover, or lost): a plain start would run a new query from the input's
    beginning and write it all again."""
    blue = _blue(scene)
    blue.crash()
    shutil.rmtree(scene.world.live_dir)
    fresh = scene.run(scene.spawn("start", actors.runner(scene.world, actors.RunnerPlan())))
    assert isinstance(fresh.error, CheckpointRestoreError), fresh.error
    assert "--from-checkpoint latest" in str(fresh.error)
    scene.check()
    scene.finish()


def test_1_4_green_dying_after_blues_stop_is_settled_by_the_dags(scene: Scene) -> None:
    """Green dies after blue answered its stop with S1, before the upgrade went live."""
    blue = _blue(scene)
    green = scene.begin_handover()
    scene.run(green, until="awaiting_command_result")
    scene.run(blue)
    scene.run(green, until="handover_after_move")
    green.crash()
    scene.finish()


def test_1_5_a_checkpoint_uploaded_twice_is_indexed_once(scene: Scene) -> None:
    """A crash after the upload and before the commit: the next start uploads the same
    checkpoint again; retention must keep it (it counted entries: [.., 12, 12] with
    retained 1 dropped every restorable checkpoint)."""
    blue = scene.spawn("blue", actors.runner(scene.world, actors.RunnerPlan(batches=2)))
    scene.run(blue, until="before_delta_commit")
    blue.crash()
    restart = scene.run(scene.spawn("restart", actors.runner(scene.world, actors.RunnerPlan())))
    assert restart.error is None, restart.error
    ids = read_index(scene.world.layout().root.store(), scene.world.layout()).ids
    assert ids == [0, 1], f"retained: 2, and the index holds {ids}"
    scene.check()
    scene.finish()


def test_1_6_two_rollbacks_at_once_never_revert_each_others_blue(scene: Scene) -> None:
    """Rollback A fences; rollback B fences, restores and starts its blue, which commits;
    A's RESTORE must not revert the commits of B's blue."""
    _blue(scene, batches=3, savepoint_after=1)
    savepoint = actors.client_of(scene.world).savepoints(JOB)[-1].id
    first = scene.spawn("rollback-a", actors.rollback(scene.world, savepoint, None))
    scene.run(first, until="rollback_after_fence")
    scene.feed(4)
    second = scene.run(scene.spawn("rollback-b", actors.rollback(scene.world, savepoint, None)))
    assert second.error is None, second.error
    scene.run(first, until="rollback_before_restart")  # A restored; its task dies
    first.crash()
    scene.feed(4)
    scene.run(second)  # B's blue goes on
    scene.check()
    scene.finish()


def test_1_7_a_restoring_an_older_checkpoint_is_a_rewind(scene: Scene) -> None:
    """`--from-checkpoint <older id>` rewinds past the head: refused unless asked for."""
    blue = _blue(scene, batches=2)
    blue.crash()
    ids = read_index(scene.world.layout().root.store(), scene.world.layout()).ids
    assert len(ids) == 2, ids
    shutil.rmtree(scene.world.live_dir)
    plan = actors.RunnerPlan(from_checkpoint=str(ids[0]))
    older = scene.run(scene.spawn("restore", actors.runner(scene.world, plan)))
    assert isinstance(older.error, CheckpointRestoreError), older.error
    assert "--allow-rewind" in str(older.error)
    scene.check()
    scene.finish()


def test_1_7_b_a_promoted_upgrade_releases_its_rollback_target(scene: Scene) -> None:
    blue = _blue(scene)
    green = _handover(scene, blue)
    scene.run(green)
    record = scene.upgrade()
    client = actors.client_of(scene.world)
    promote_upgrade(client, JOB, record.id, {"passed": True, "reason": "healthy"})
    entry = SavepointRegistry(client.store, scene.world.layout()).entry(
        record.handover["blue_savepoint"]
    )
    assert entry.holds == {}, entry.holds
    scene.finish()


def test_1_7_c_green_era_files_stay_after_a_rollback(scene: Scene) -> None:
    """Green commits a batch everywhere and dies before retiring its manifest; after the
    rollback, the table versions green committed must stay readable (time travel, and
    savepoints taken during its probation)."""
    blue = _blue(scene)
    scene.feed(4)
    green = _handover(scene, blue)
    scene.run(green, until="before_commit_marker")
    scene.run(green, until="store.delete")  # the marker is written; the retire is next
    green.crash()
    rollback = scene.run(scene.fail_probation())
    assert rollback.error is None, rollback.error
    scene.finish()


def test_blues_stop_savepoint_is_held_from_its_birth(scene: Scene) -> None:
    """Found by the property test on the fixed code: green dies right after blue stopped
    with S1, before green held it; the job is started again and takes savepoints, whose
    retention (2 kept) deleted S1, and the DAG could no longer settle the handover. The
    stop command asks blue to take S1 held for the upgrade."""
    blue = _blue(scene)
    green = scene.begin_handover()
    scene.run(green, until="awaiting_command_result")
    scene.run(blue)
    scene.run(green, until="handover_after_stop_result")
    green.crash()
    again = scene.spawn("start", actors.runner(scene.world, actors.RunnerPlan(batches=3)))
    scene.run(again)
    client = actors.client_of(scene.world)
    for _ in range(2):
        client.send_command(JOB, "savepoint", self_contained=True)
        scene.feed(2)
        scene.run(again)
    s1 = client.wait_for_result(JOB, f"stop-{scene.upgrade_id}", timeout=1).savepoint_id
    assert s1 in {s.id for s in client.savepoints(JOB)}, "S1 was deleted by retention"
    scene.finish()


def test_a_savepoint_a_rollback_restores_is_never_deleted(scene: Scene) -> None:
    """The tables are back at savepoint S; before blue restarts from S, an operator (or
    retention) deletes S: the rollback could never finish. S is needed until then."""
    _blue(scene, batches=3, savepoint_after=1)
    savepoint = actors.client_of(scene.world).savepoints(JOB)[-1].id
    rollback = scene.spawn("rollback", actors.rollback(scene.world, savepoint, None))
    scene.run(rollback, until="rollback_before_restart")
    rollback.crash()
    deleting = scene.run(scene.spawn("retention", actors.delete_savepoint(scene.world, savepoint)))
    assert isinstance(deleting.error, SavepointError), deleting.error
    assert "rollback" in str(deleting.error)
    scene.finish()


def test_a_held_savepoint_that_was_never_taken_is_swept(scene: Scene) -> None:
    """Found by the property test after S1 was born held: blue dies while it takes S1; the
    next start's sweep must dispose of the unfinished savepoint (its hold holds nothing),
    not refuse to start."""
    blue = _blue(scene)
    green = scene.begin_handover()
    scene.run(green, until="awaiting_command_result")
    scene.run(blue, until="savepoint_after_register")
    blue.crash()
    green.crash()
    again = scene.run(scene.spawn("start", actors.runner(scene.world, actors.RunnerPlan())))
    assert again.error is None, again.error
    scene.finish()


def test_a_fenced_runners_late_batch_on_the_same_checkpoint_folder_is_committed(
    scene: Scene,
) -> None:
    """Found by the property test once table maintenance ran in it: a takeover recovers;
    the runner it fenced, past its batch's fence check, then claims, seals and completes
    that batch (its Spark writes commits/N into the shared folder); the takeover's query
    starts after it and commits its next batch above it: the late batch was never
    committed (its seq fell below the tables' and was skipped as done). The takeover
    recovers again before its first batch."""
    blue = scene.spawn("blue", actors.runner(scene.world, actors.RunnerPlan(batches=2)))
    scene.run(blue, until="batch_after_commit")  # batch 0 pre-committed
    scene.run(blue, until="batch_start")  # batch 1: its fence check is next
    blue.step()  # past the check: at its claim
    takeover = scene.spawn("takeover", actors.runner(scene.world, actors.RunnerPlan(batches=2)))
    scene.run(takeover, until="recovery_before_cleanup")
    scene.run(blue)  # claims, seals, completes batch 1; then learns it is fenced
    assert isinstance(blue.error, FencedError), blue.error
    scene.feed(2)
    scene.run(takeover)
    assert takeover.error is None, takeover.error
    scene.check()
    scene.finish()


def test_a_takeover_from_the_latest_checkpoint_races_a_commit_of_the_running_job(
    scene: Scene, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the split-brain chaos run in CI: a takeover with `--from-checkpoint latest`
    checks that the checkpoint is not older than where the lineage stands. The running
    job externalizes each checkpoint before it commits, so `latest` is never behind the
    head, unless the two are read with a commit in between, the checkpoint first: the
    takeover was refused as a rewind. A commit landing between the two reads must not
    refuse it, whichever read comes first."""
    from streamkeeper.runtime import ownership
    from streamkeeper.runtime.options import RunOptions

    blue = scene.spawn("blue", actors.runner(scene.world, actors.RunnerPlan(batches=3)))
    scene.run(blue, until="table_commit_landed")  # seq 0 in `last`
    scene.run(blue, until="batch_start")  # batch 1 next
    raced: list[str] = []

    def commit_once() -> None:  # blue externalizes checkpoint 1, then commits it
        if not raced:
            raced.append("committed")
            scene.run(blue, until="table_commit_landed")

    original_position = ownership.LineageStart.position
    original_restorable = ownership.check_restorable

    def position(self: ownership.LineageStart) -> int | None:
        answer = original_position(self)
        commit_once()
        return answer

    def restorable(*args: object, **kwargs: object) -> object:
        answer = original_restorable(*args, **kwargs)
        commit_once()
        return answer

    monkeypatch.setattr(ownership.LineageStart, "position", position)
    monkeypatch.setattr(ownership, "check_restorable", restorable)
    paths = dataclasses.replace(
        scene.world.paths(), checkpoint_dir=scene.base / "checkpoints" / "takeover"
    )
    options = RunOptions(takeover=True, spec_dir=scene.world.base, from_checkpoint="latest")
    ownership.LineageStart(scene.world.spec(), options, paths).check()  # not refused
    assert raced == ["committed"]
    index = read_index(paths.root.store(), paths.layout)
    assert index.ids[-1] == original_position(
        ownership.LineageStart(scene.world.spec(), options, paths)
    )
    blue.crash()
    scene.finish()


def test_a_start_whose_checkpoint_folder_moved_before_it_took_the_lineage_is_refused(
    scene: Scene,
) -> None:
    """Found by the lifecycle property test's deep profile (seed 11): a start checks its
    checkpoint folder (blue's query is there), then, while its Spark session starts, a
    handover stops blue and moves that folder aside. The start took the lineage after
    and ran a new query in the empty folder: the input from its beginning, again (ids
    0-3 twice). A start checks again once it holds the lineage."""
    blue = _blue(scene)
    takeover = scene.spawn("takeover", actors.runner(scene.world, actors.RunnerPlan()))
    takeover.step()  # checked (blue's folder holds its query); about to take the epoch
    green = _handover(scene, blue)  # blue stops at S1, its folder moved aside
    scene.run(takeover)
    assert isinstance(takeover.error, CheckpointRestoreError), takeover.error
    assert "--from-savepoint" in str(takeover.error)
    scene.run(green)
    scene.finish()


def test_a_start_between_blues_stop_and_the_move_keeps_blues_folder(scene: Scene) -> None:
    """The same race on the handover's side: a start takes the lineage after blue stopped
    for the handover and before green moves blue's folder aside. The handover must not
    move the folder from under it: the upgrade fails, that run keeps going, S1 is not
    held any more."""
    from streamkeeper.upgrade.record import UpgradeError

    blue = _blue(scene)
    green = scene.begin_handover()
    scene.run(green, until="awaiting_command_result")
    scene.run(blue)
    scene.run(green, until="handover_after_stop_result")
    start = scene.spawn("start", actors.runner(scene.world, actors.RunnerPlan(batches=1)))
    scene.feed(2)
    scene.run(start, until="batch_start")  # holds the lineage in blue's folder
    scene.run(green)
    assert isinstance(green.error, UpgradeError), green.error
    record = scene.upgrade()
    assert record is not None and record.phase == "failed", record
    assert scene.world.live_dir.exists()
    s1 = [
        e
        for e in SavepointRegistry(scene.world.layout().root.store(), scene.world.layout())
        .read()
        .savepoints
        if e.holds
    ]
    assert s1 == [], s1
    scene.run(start)
    assert start.error is None, start.error
    scene.finish()


def test_files_a_failed_batchs_tasks_write_after_it_gave_up_are_swept(scene: Scene) -> None:
    """Found by the combined lifecycle chaos run in CI: the rollback cancelled green's job
    mid-batch; the batch gave up (swept its folder, deleted its claim), then its tasks
    finished the files they were writing. Nothing led a sweep to them any more, and a
    merge sink's staged files were never swept at all. The claim stays, voided, until a
    recovery has swept again."""
    from streamkeeper import injection
    from streamkeeper.lineage.layout import seq_of

    world = scene.world
    store = world.layout().root.store()
    failed: list[int] = []

    def cancelled(**_context: object) -> None:
        if len(failed) == 0 and store.list(world.layout().manifests):
            failed.append(max(seq_of(k) for k in store.list(world.layout().manifests)))
            raise RuntimeError("job cancelled while its tasks wrote")

    blue = scene.spawn("blue", actors.runner(world, actors.RunnerPlan(batches=2)))
    scene.run(blue, until="batch_after_commit")  # batch 0 pre-committed
    injection.register("batch_before_manifest", cancelled)
    scene.run(blue)
    assert isinstance(blue.error, RuntimeError), blue.error
    (seq,) = failed
    late = world.table_path("ledger") / world.layout().precommit_dir(seq) / "e1-late.parquet"
    staged = world.root / world.layout().staging_prefix(seq) / "last" / "e1-late.parquet"
    for path in (late, staged):  # the tasks' files, finished after the batch gave up
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"PAR1")
    # The next start's recovery, before any batch of its own could reuse the seq (after a
    # rollback its marker takes it: nothing would ever write that folder again).
    start = scene.spawn("start", actors.runner(world, actors.RunnerPlan(batches=1)))
    scene.run(start, until="batch_start")
    assert not late.exists() and not staged.exists()
    scene.finish()


def test_a_start_from_a_savepoint_is_the_latest_checkpoint_until_it_commits(
    scene: Scene,
) -> None:
    """Found by the deep profile (seed 11): a rollback restored savepoint S, whose
    checkpoint retention had long retired, and forgot the checkpoints after it; blue
    started from S and its machine was lost before its first commit. The monitor's restart
    from the latest externalized checkpoint then had nothing at S: an older one rewinds,
    none at all starts the input over. As in Flink, a start from a savepoint makes it the
    lineage's latest checkpoint before it runs."""
    blue = _blue(scene, batches=4, savepoint_after=2)  # S at the second batch
    scene.feed(4)
    scene.run(blue)  # two more: 2 checkpoints are kept, S's is retired
    blue.crash()
    client = actors.client_of(scene.world)
    savepoint = client.savepoints(JOB)[-1]
    store, layout = scene.world.layout().root.store(), scene.world.layout()
    assert savepoint.seq not in read_index(store, layout).ids  # retired by retention
    rollback = scene.spawn("rollback", actors.rollback(scene.world, savepoint.id, None))
    scene.run(rollback, until="batch_start")  # blue runs from S, nothing committed yet
    rollback.crash()
    shutil.rmtree(scene.world.live_dir)  # its machine is lost
    assert read_index(store, layout).ids[-1] == savepoint.seq
    scene.finish()


def test_a_sealed_batch_its_fenced_runner_still_completes_is_not_discarded(
    scene: Scene,
) -> None:
    """Found by the deep profile (seed 11, second run): blue sealed batch N's manifest and
    was fenced by a takeover before Spark wrote `commits/N`. The takeover's recovery saw
    batch N incomplete and discarded the manifest; blue's Spark then wrote `commits/N`
    (Spark does, once the batch function returns, outside any fence), so no later start
    ever ran batch N again: its rows were lost. A manifest whose batch a live runner can
    still complete stays pending."""
    blue = scene.spawn("blue", actors.runner(scene.world, actors.RunnerPlan(batches=2)))
    scene.run(blue, until="batch_after_manifest")  # batch 0 sealed, not yet in commits/
    takeover = scene.spawn("takeover", actors.runner(scene.world, actors.RunnerPlan(batches=2)))
    scene.run(takeover, until="batch_start")  # took the lineage and recovered
    takeover.crash()
    scene.run(blue)  # Spark completes batch 0; the table commit is fenced
    assert isinstance(blue.error, FencedError), blue.error
    assert (scene.world.live_dir / "commits" / "0").exists()
    scene.check()
    scene.finish()


def test_a_zombies_seal_of_a_batch_its_successor_committed_is_not_committed_again(
    scene: Scene,
) -> None:
    """Found by CI's property profile once its uuids were seeded: blue planned batch 0 and
    was fenced by a takeover running from the same checkpoint folder, which sealed batch
    0 as seq 0. Blue then sealed its own batch 0 under the next seq (seq 0 was taken),
    the takeover committed seq 0 and retired its manifest, and blue's commit was fenced.
    The next start's recovery found blue's manifest above the head, vouched by Spark's
    log (the takeover had completed batch 0) and the newest left for that batch: it
    committed batch 0 a second time (id 0 twice). A batch the head already holds, of
    the same query, committed by the manifest's epoch or a newer one, is obsolete."""
    blue = scene.spawn("blue", actors.runner(scene.world, actors.RunnerPlan(batches=1)))
    scene.run(blue, until="batch_start")  # batch 0 planned: offsets/0
    scene.run(blue, until="store.write_if")  # its fence check passed; claiming a seq
    takeover = scene.spawn("takeover", actors.runner(scene.world, actors.RunnerPlan(batches=1)))
    scene.run(takeover, until="batch_after_manifest")  # fenced blue; sealed batch 0 as seq 0
    scene.run(blue, until="batch_after_manifest")  # blue's own batch 0, sealed as seq 1
    scene.run(takeover)  # commits seq 0 and retires its manifest
    assert takeover.error is None, takeover.error
    scene.run(blue)  # Spark refuses its commits/0 (the takeover wrote it)
    assert isinstance(blue.error, ConcurrentQueryError), blue.error
    assert [r["id"] for r in scene.world.rows("ledger")] == [0, 1]
    later = scene.spawn("later", actors.runner(scene.world, actors.RunnerPlan(batches=1)))
    scene.run(later)  # its recovery meets blue's manifest
    assert later.error is None, later.error
    scene.check()
    scene.finish()
