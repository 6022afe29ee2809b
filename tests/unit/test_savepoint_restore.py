"""What a savepoint captures, and every refusal before a restore: broken savepoints,
another job's, a rewind not asked for, a busy directory; on local storage, no Spark."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from streamkeeper.cli import app
from streamkeeper.client import StreamkeeperClient
from streamkeeper.errors import BrokenSavepointError, IncompatibleSavepointError, SavepointError
from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.snapshots.savepoint_capture import in_savepoint
from streamkeeper.snapshots.savepoint_disposal import unpin
from streamkeeper.snapshots.savepoint_restore import RESTORE_MARKER, plan_restore, restore_native
from streamkeeper.storage import Location
from tests.conftest import SAMPLE_SPEC
from tests.support.savepoint_world import World


@pytest.mark.parametrize(
    ("path", "kept"),
    [
        ("offsets/7", True),
        ("offsets/8", False),  # planned after the savepoint's batch
        ("offsets/.8.crc", False),
        ("commits/7", True),
        ("state/0/3/8.delta", True),  # batch 7 writes state version 8
        ("state/0/3/.8.delta.crc", True),
        ("state/0/3/9.delta", False),
        ("state/0/3/9.zip", False),
        ("state/0/3/8_4b1e.zip", True),
        ("state/0/3/9.changelog", False),
        ("state/0/3/SSTs/000012-ab.sst", True),
        ("state/0/_metadata/metadata", True),
        ("sources/0/7", True),  # the file source's log, up to the batch
        ("sources/0/8", False),  # written while Spark planned batch 8
        ("sources/1/9.compact", False),
        ("sources/0/.8.crc", False),
        ("sources/0/5.compact", True),
        ("metadata", True),
    ],
)
def test_a_savepoint_captures_checkpoint_n_and_nothing_planned_after_it(
    path: str, kept: bool
) -> None:
    assert in_savepoint(path, 7) is kept


@pytest.mark.parametrize(
    ("path", "kept"),
    [
        ("sources/0/9", True),  # batch 7 read log entry 9: a killed run left the log ahead
        ("sources/0/10", False),  # logged while Spark planned batch 8
        ("sources/0/9.compact", True),
        ("sources/1/7", True),  # a source without a log offset: cut at the batch
        ("sources/1/8", False),
        ("offsets/8", False),
    ],
)
def test_the_file_source_log_is_cut_at_its_own_offset_not_at_the_batch(
    path: str, kept: bool
) -> None:
    assert in_savepoint(path, 7, {"0": 9}) is kept


@pytest.fixture
def world(tmp_path: Path) -> World:
    world = World(tmp_path)
    world.run_batch(planned=True)
    world.run_batch(planned=True)
    return world


def _plan(world: World, reference: str, local: Path, **options: object):  # noqa: ANN202
    return plan_restore(
        world.layout.root,
        world.layout,
        reference,
        local,
        head_seq=options.get("head_seq"),  # type: ignore[arg-type]
        allow_rewind=bool(options.get("allow_rewind")),
    )


@pytest.mark.parametrize("self_contained", [False, True], ids=["pinned", "self-contained"])
def test_a_savepoint_missing_a_file_is_broken_and_never_restored(
    world: World, tmp_path: Path, self_contained: bool
) -> None:
    savepoint_id = world.take(self_contained=self_contained)
    assert savepoint_id is not None
    client = StreamkeeperClient(str(world.store.root))
    assert not client.describe_savepoint(savepoint_id).broken
    manifest = _plan(world, savepoint_id, tmp_path / "fresh").manifest
    victim = next(f for f in manifest.files if f.path.startswith("state/"))
    key = world.layout.savepoint(savepoint_id) + "/" + victim.key if self_contained else victim.key
    (world.store.root / key).unlink()

    described = client.describe_savepoint(savepoint_id)
    assert described.broken and any(victim.path in p for p in described.problems)
    with pytest.raises(BrokenSavepointError, match=f"{victim.path}.*restore another savepoint"):
        _plan(world, savepoint_id, tmp_path / "fresh")
    assert not (tmp_path / "fresh").exists()
    result = CliRunner().invoke(
        app, ["savepoints", "describe", savepoint_id, "--root", str(world.store.root)]
    )
    assert result.exit_code == 1 and "BROKEN" in result.output


def test_other_kinds_of_broken(world: World, tmp_path: Path) -> None:
    client = StreamkeeperClient(str(world.store.root))
    resized, unpinned, no_manifest, garbled = (world.take(self_contained=s) for s in (1, 0, 1, 1))
    manifest = _plan(world, resized, tmp_path / "x").manifest  # type: ignore[arg-type]
    first = world.store.root / world.layout.savepoint(resized) / manifest.files[0].key  # type: ignore[arg-type]
    first.write_bytes(first.read_bytes() + b"!")
    unpin(world.store, world.layout, unpinned)  # type: ignore[arg-type]
    (world.store.root / world.layout.savepoint_manifest(no_manifest)).unlink()  # type: ignore[arg-type]
    (world.store.root / world.layout.savepoint_manifest(garbled)).write_text("{not json")  # type: ignore[arg-type]
    problems = {
        name: " ".join(client.describe_savepoint(i).problems)  # type: ignore[arg-type]
        for name, i in [("resized", resized), ("unpinned", unpinned), ("none", no_manifest)]
    }
    assert "bytes, the manifest says" in problems["resized"]
    assert "is not pinned" in problems["unpinned"]
    assert "manifest" in problems["none"] and "is missing" in problems["none"]
    assert "not valid JSON" in " ".join(client.describe_savepoint(garbled).problems)  # type: ignore[arg-type]


def test_a_savepoint_without_the_source_log_entry_its_batch_read_is_broken(
    world: World, tmp_path: Path
) -> None:
    """As one taken before the log was cut at its own offset: Spark fails to resume it."""
    savepoint_id = world.take(self_contained=True)
    assert savepoint_id is not None
    key = world.store.root / world.layout.savepoint_manifest(savepoint_id)
    manifest = json.loads(key.read_text())
    entry = f"sources/0/{world.batch + 1}"  # the World's log runs one entry ahead
    assert any(f["path"] == entry for f in manifest["files"])
    manifest["files"] = [f for f in manifest["files"] if f["path"] != entry]
    key.write_text(json.dumps(manifest))

    problems = " ".join(
        StreamkeeperClient(str(world.store.root)).describe_savepoint(savepoint_id).problems
    )
    assert f"lacks entry {world.batch + 1} of source 0's file log ({entry})" in problems
    with pytest.raises(BrokenSavepointError, match="take a new savepoint"):
        _plan(world, savepoint_id, tmp_path / "fresh")
    assert not (tmp_path / "fresh").exists()


def test_another_jobs_savepoint_is_refused_before_anything_changes(
    world: World, tmp_path: Path
) -> None:
    savepoint_id = world.take(self_contained=True)
    assert savepoint_id is not None
    green = LineageLayout(world.layout.root, "keyed-totals", "keyed-totals")
    with pytest.raises(IncompatibleSavepointError, match="belongs to lineage 'blue' of job 'blue'"):
        plan_restore(
            green.root, green, savepoint_id, tmp_path / "ck", head_seq=None, allow_rewind=False
        )
    copied = tmp_path / "copied-savepoint"  # a portable copy, passed by path
    shutil.copytree(world.store.root / world.layout.savepoint(savepoint_id), copied)
    with pytest.raises(IncompatibleSavepointError, match="taken by job 'blue'"):
        plan_restore(
            green.root, green, str(copied), tmp_path / "ck", head_seq=None, allow_rewind=False
        )

    # Through the CLI: refused with exit 2 before Spark, an epoch or a table.
    command = ["run", str(SAMPLE_SPEC), "--root", str(world.store.root)]
    command += ["--checkpoint-dir", str(tmp_path / "ck"), "--from-savepoint", savepoint_id]
    result = CliRunner(env={"COLUMNS": "300"}).invoke(app, command)
    assert result.exit_code == 2, result.output
    assert "belongs to lineage 'blue'" in result.output
    assert not (world.store.root / "lineages" / "keyed-totals").exists()
    assert not (world.store.root / "tables").exists() and not (tmp_path / "ck").exists()


def test_a_rewind_must_be_asked_for(world: World, tmp_path: Path) -> None:
    savepoint_id = world.take(self_contained=False)
    assert savepoint_id is not None
    seq = _plan(world, savepoint_id, tmp_path / "ck").manifest.seq
    with pytest.raises(
        SavepointError, match=f"up to seq {seq + 3}: restoring it rewinds.*--allow-rewind"
    ):
        _plan(world, savepoint_id, tmp_path / "ck", head_seq=seq + 3)
    plan = _plan(world, savepoint_id, tmp_path / "ck", head_seq=seq + 3, allow_rewind=True)
    assert plan.rewinds and not _plan(world, savepoint_id, tmp_path / "ck", head_seq=seq).rewinds


def test_a_restore_is_whole_or_nothing_and_a_retried_start_resumes(
    world: World, tmp_path: Path
) -> None:
    savepoint_id = world.take(self_contained=False)
    assert savepoint_id is not None
    local = tmp_path / "ck"
    (local / "offsets").mkdir(parents=True)
    with pytest.raises(SavepointError, match="is not empty; move it away"):
        _plan(world, savepoint_id, local)
    shutil.rmtree(local)
    plan = _plan(world, savepoint_id, local)
    restore_native(plan, local)
    restored = {
        p.relative_to(local).as_posix(): p.read_bytes()
        for p in local.rglob("*")
        if p.is_file() and p.name != RESTORE_MARKER
    }
    assert restored == world.captured[savepoint_id]
    assert "offsets/2" not in restored  # planned after batch 1: not captured
    # Batch 1 read the file source's log entry 2 (the log runs ahead): Spark reads it back
    # to resume, so it is restored; entry 3, logged for the planned batch 2, is not.
    assert "sources/0/2" in restored and "sources/0/3" not in restored
    assert json.loads((local / RESTORE_MARKER).read_text())["savepoint_id"] == savepoint_id
    assert _plan(world, savepoint_id, local).already_restored  # an Airflow retry resumes


def test_a_copied_self_contained_savepoint_restores_from_its_folder(
    world: World, tmp_path: Path
) -> None:
    savepoint_id = world.take(self_contained=True)
    assert savepoint_id is not None
    copied = tmp_path / "elsewhere" / savepoint_id
    shutil.copytree(world.store.root / world.layout.savepoint(savepoint_id), copied)
    shutil.rmtree(world.store.root / world.layout.savepoint(savepoint_id))
    plan = _plan(world, str(copied), tmp_path / "ck")
    assert plan.location == Location(str(copied), plan.location.s3)
    restore_native(plan, tmp_path / "ck")
    assert (tmp_path / "ck" / "commits" / "1").read_text() == "commit 1"
