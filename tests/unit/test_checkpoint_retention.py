"""Externalized checkpoints on a LocalStore: retention never loses a referenced file,
uploads are incremental, and a restore rebuilds exactly what was captured."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamkeeper.errors import FencedError
from streamkeeper.lineage.control import ControlPlane, Fence
from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.snapshots.externalized import CheckpointUploader, ExternalizedCheckpoints
from streamkeeper.snapshots.index import read_index
from streamkeeper.snapshots.manifest import (
    CheckpointRestoreError,
    FileTransfer,
    checkpoint_ids,
    read_manifest,
    scan_checkpoint,
)
from streamkeeper.snapshots.restore import restore_checkpoint
from streamkeeper.spec import ExternalizedSpec
from streamkeeper.storage import LocalStore, Location

PATHS = ["state/0/0/1.delta", "state/0/0/2.delta", "state/0/1/SSTs/000008-a.sst", "offsets/0"]
# Distinct lengths: a path rewritten with other content changes size, as it would in Spark
# (which never rewrites a file in place), so the (path, size, mtime) digest cache is sound.
CONTENTS = [b"a", b"bb", b"ccc", b"dddd"]  # few: files share contents across checkpoints

Tree = dict[str, bytes]


class Harness:
    """A fake Spark checkpoint directory, its uploader, and the store it uploads to."""

    def __init__(self, base: Path) -> None:
        self.local = base / "checkpoint"
        self.store = LocalStore(base / "data")
        self.layout = LineageLayout(Location(str(base / "data")), "lin", "job")
        self.epoch = 1
        self.uploader = CheckpointUploader(self.store, self.layout, self.local, epoch=1)
        self.batch = -1
        self.next_id = 100  # checkpoint ids are commit seqs: not batch ids, not from 0
        self.expected: dict[int, Tree] = {}

    def write_tree(self, files: dict[str, int]) -> Tree:
        """Make the local directory hold `files` plus Spark's metadata and a new commit."""
        self.batch += 1
        wanted = {path: CONTENTS[i] for path, i in files.items()}
        wanted["metadata"] = json.dumps({"id": "query-1"}).encode()
        for n in range(self.batch + 1):
            wanted[f"commits/{n}"] = b"v1\n{}"
        for path in self.tree():
            if path not in wanted:
                (self.local / path).unlink()
        for path, data in wanted.items():
            target = self.local / path
            if not target.exists() or target.read_bytes() != data:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
        return wanted

    def tree(self) -> Tree:
        return {f.path: (self.local / f.path).read_bytes() for f in scan_checkpoint(self.local)}

    def stored_keys(self) -> set[str]:
        return set(self.store.list(self.layout.checkpoint_files))

    def referenced(self) -> set[str]:
        keys: set[str] = set()
        for checkpoint_id in checkpoint_ids(self.store, self.layout):
            keys |= read_manifest(self.store, self.layout, checkpoint_id).keys
        return keys


def _check_every_manifest_is_restorable(h: Harness) -> None:
    for checkpoint_id in checkpoint_ids(h.store, h.layout):
        manifest = read_manifest(h.store, h.layout, checkpoint_id)
        assert {f.path for f in manifest.files} == set(h.expected[checkpoint_id])
        for f in manifest.files:
            data = (h.store.root / f.key).read_bytes()  # exists: else FileNotFoundError
            name = f.key.rsplit("/", 1)[1]  # {sha256}.e{epoch that uploaded it}
            assert hashlib.sha256(data).hexdigest() == f.sha256 == name.split(".e")[0]
            assert data == h.expected[checkpoint_id][f.path]


def _checkpoint(h: Harness, files: dict[str, int]) -> None:
    known_before = h.referenced()
    tree = h.write_tree(files)
    h.next_id += 1
    manifest = h.uploader.upload(h.next_id)
    assert manifest is not None and manifest.batch_id == h.batch
    h.expected[h.next_id] = tree
    # Incremental: exactly the contents no stored checkpoint had were uploaded.
    assert manifest.uploaded_files == len(manifest.keys - known_before)


def _crash_before_manifest(h: Harness, files: dict[str, int]) -> None:
    def lose_the_machine() -> None:
        raise RuntimeError("machine lost")

    h.write_tree(files)
    with pytest.raises(RuntimeError, match="machine lost"):
        h.uploader.upload(h.next_id + 1, guard=lose_the_machine)
    # The next runner start: a new epoch takes the index over and sweeps the leftovers.
    h.epoch += 1
    h.uploader = CheckpointUploader(h.store, h.layout, h.local, epoch=h.epoch)
    h.uploader.take_ownership()
    assert h.stored_keys() == h.referenced()


def _retain(h: Harness, keep: int) -> None:
    ids_before = checkpoint_ids(h.store, h.layout)
    retained = h.uploader.retain(keep)
    assert checkpoint_ids(h.store, h.layout) == ids_before[-keep:] == retained
    # Nothing referenced is gone (checked below); nothing unreferenced is left.
    assert h.stored_keys() == h.referenced()


file_sets = st.dictionaries(st.sampled_from(PATHS), st.integers(0, len(CONTENTS) - 1))
steps = st.lists(
    st.one_of(
        st.tuples(st.just("checkpoint"), file_sets),
        st.tuples(st.just("crash"), file_sets),
        st.tuples(st.just("retain"), st.integers(1, 3)),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=steps)
def test_retention_keeps_exactly_what_retained_checkpoints_reference(steps: list) -> None:
    with tempfile.TemporaryDirectory() as base:
        h = Harness(Path(base))
        for kind, argument in steps:
            {"checkpoint": _checkpoint, "crash": _crash_before_manifest, "retain": _retain}[kind](
                h, argument
            )
            assert h.referenced() <= h.stored_keys()
            _check_every_manifest_is_restorable(h)
        ids = checkpoint_ids(h.store, h.layout)
        if ids:
            restored = Path(base) / "restored"
            manifest = restore_checkpoint(h.store, h.layout, restored)
            assert manifest.checkpoint_id == ids[-1]
            got = {f.path: (restored / f.path).read_bytes() for f in scan_checkpoint(restored)}
            assert got == h.expected[ids[-1]]


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    yield Harness(tmp_path)


def test_a_file_deleted_during_upload_is_left_out_unless_an_identical_copy_made_it(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark deletes old offsets and state files while we upload: never an error.

    The capture stands for the directory as listed, so a file deleted after listing is
    kept when its content reached the store from an identical file; else it is left out.
    """
    harness.write_tree({"offsets/0": 1, "offsets/1": 1, "sources/0/0": 3, "state/0/0/1.delta": 2})
    real_put = FileTransfer.put

    def put(self: FileTransfer, source: Path, key: str) -> None:
        if source.as_posix().endswith(("offsets/0", "sources/0/0")):
            source.unlink()  # Spark's clean-up got there first
        real_put(self, source, key)

    monkeypatch.setattr(FileTransfer, "put", put)
    manifest = harness.uploader.upload(1)
    paths = {f.path for f in manifest.files}
    assert {"offsets/0", "offsets/1", "state/0/0/1.delta"} <= paths
    assert "sources/0/0" not in paths
    assert harness.referenced() == harness.stored_keys()


def test_a_file_changing_during_upload_is_not_captured(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An SST still being copied in place by RocksDB is left out, and so is its object."""
    harness.write_tree({"state/0/1/SSTs/000008-a.sst": 2, "state/0/0/1.delta": 1})
    real_put = FileTransfer.put

    def put(self: FileTransfer, source: Path, key: str) -> None:
        real_put(self, source, key)
        if source.suffix == ".sst":
            with open(source, "ab") as handle:
                handle.write(b"more")

    monkeypatch.setattr(FileTransfer, "put", put)
    manifest = harness.uploader.upload(1)
    assert "state/0/1/SSTs/000008-a.sst" not in {f.path for f in manifest.files}
    assert harness.stored_keys() == manifest.keys


def test_temp_files_are_not_captured(harness: Harness) -> None:
    harness.write_tree({"offsets/0": 0})
    for name in ("offsets/.1.3f2c.tmp", "offsets/..1.3f2c.tmp.crc", "state/0/0/.8.zip.ab.tmp"):
        (harness.local / name).parent.mkdir(parents=True, exist_ok=True)
        (harness.local / name).write_bytes(b"partial")
    (harness.local / "offsets/.0.crc").write_bytes(b"crc")
    paths = {f.path for f in harness.uploader.upload(1).files}
    assert paths == {"metadata", "commits/0", "offsets/0", "offsets/.0.crc"}


def test_restore_refuses_a_non_empty_directory(harness: Harness, tmp_path: Path) -> None:
    harness.write_tree({"offsets/0": 0})
    harness.uploader.upload(7)
    target = tmp_path / "busy"
    target.mkdir()
    (target / "offsets").mkdir()
    with pytest.raises(CheckpointRestoreError, match="not empty") as caught:
        restore_checkpoint(harness.store, harness.layout, target)
    assert str(target) in str(caught.value)
    assert "--from-checkpoint" in str(caught.value)


def test_restore_of_an_unknown_id_lists_the_available_ones(
    harness: Harness, tmp_path: Path
) -> None:
    with pytest.raises(CheckpointRestoreError, match="no externalized checkpoints"):
        restore_checkpoint(harness.store, harness.layout, tmp_path / "empty")
    for checkpoint_id in (7, 9):
        harness.write_tree({"offsets/0": checkpoint_id % 4})
        harness.uploader.upload(checkpoint_id)
    with pytest.raises(
        CheckpointRestoreError, match=r"available: 7 \(batch 0\), 9 \(batch 1\)"
    ) as caught:
        restore_checkpoint(harness.store, harness.layout, tmp_path / "empty", checkpoint=8)
    assert "'8'" in str(caught.value) or " 8 " in str(caught.value)
    with pytest.raises(CheckpointRestoreError, match="neither 'latest' nor"):
        restore_checkpoint(harness.store, harness.layout, tmp_path / "empty", checkpoint="last")
    assert not (tmp_path / "empty").exists()


def test_restore_of_a_specific_id_keeps_mtimes_so_uploads_after_it_dedup(
    harness: Harness, tmp_path: Path
) -> None:
    harness.write_tree({"offsets/0": 0, "state/0/0/1.delta": 3})
    first = harness.uploader.upload(1)
    harness.write_tree({"offsets/0": 0, "offsets/1": 1, "state/0/0/1.delta": 3})
    harness.uploader.upload(2)
    restored = tmp_path / "restored"
    assert restore_checkpoint(harness.store, harness.layout, restored, checkpoint=1) == first
    for f in first.files:
        assert os.stat(restored / f.path).st_mtime_ns == f.mtime_ns
    again = CheckpointUploader(harness.store, harness.layout, restored, epoch=2).upload(3)
    assert again.uploaded_files == 0 and again.keys == first.keys


def test_discard_all_deletes_every_checkpoint(harness: Harness) -> None:
    harness.write_tree({"offsets/0": 0})
    harness.uploader.upload(1)
    harness.uploader.discard_all()
    assert checkpoint_ids(harness.store, harness.layout) == []
    assert harness.stored_keys() == set()


def test_a_fenced_uploader_can_neither_add_nor_drop_checkpoints(harness: Harness) -> None:
    harness.expected[1] = harness.write_tree({"offsets/0": 0, "state/0/0/1.delta": 1})
    harness.uploader.upload(1)
    newer = CheckpointUploader(harness.store, harness.layout, harness.local, epoch=2)
    newer.take_ownership()
    harness.write_tree({"offsets/0": 0, "state/0/0/2.delta": 2})
    with pytest.raises(FencedError, match="epoch 2 owns its checkpoint index"):
        harness.uploader.upload(2)
    with pytest.raises(FencedError):
        harness.uploader.retain(1)
    with pytest.raises(FencedError):
        harness.uploader.discard_all()
    assert checkpoint_ids(harness.store, harness.layout) == [1]
    _check_every_manifest_is_restorable(harness)


def test_sweep_never_deletes_what_a_newer_epoch_uploaded(harness: Harness) -> None:
    harness.write_tree({"offsets/0": 0})
    harness.uploader.upload(1)
    newer_upload = harness.layout.checkpoint_file("f" * 64 + ".e7")
    older_leftover = harness.layout.checkpoint_file("a" * 64 + ".e1")
    for key in (newer_upload, older_leftover):
        (harness.store.root / key).write_bytes(b"x")
    CheckpointUploader(harness.store, harness.layout, harness.local, epoch=5).take_ownership()
    assert (harness.store.root / newer_upload).exists()  # an upload in flight of epoch 7
    assert not (harness.store.root / older_leftover).exists()
    assert harness.stored_keys() - harness.referenced() == {newer_upload}


def test_a_pinned_checkpoint_outlives_retention(harness: Harness) -> None:
    for n in range(3):
        harness.write_tree({"offsets/0": n, f"state/0/0/{n + 1}.delta": n})
        harness.uploader.upload(n + 1)
    harness.uploader.index.update(
        lambda index: index.pins.update({"sp-20270115T080000-00000001": 1})
    )
    assert harness.uploader.retain(1) == [1, 3]
    assert checkpoint_ids(harness.store, harness.layout) == [1, 3]
    assert harness.stored_keys() == harness.referenced()


def _hook(harness: Harness) -> ExternalizedCheckpoints:
    control = ControlPlane(harness.store, harness.layout)
    fence = Fence(control, control.acquire(takeover=True))
    spec = ExternalizedSpec(enabled=True, retained=2)
    return ExternalizedCheckpoints(harness.store, harness.layout, harness.local, spec, fence)


def test_a_restored_savepoint_becomes_the_latest_checkpoint(tmp_path: Path) -> None:
    """A start from a savepoint taken at seq 7, whose checkpoint retention retired: the
    restored folder is checkpoint 7, so a restart before the first commit resumes there."""
    harness = Harness(tmp_path)
    restored = harness.write_tree({"state/0/0/1.delta": 0, "offsets/0": 3})
    _hook(harness).restore_point(7, "sp-x")
    assert read_index(harness.store, harness.layout).ids == [7]
    manifest = read_manifest(harness.store, harness.layout, 7)
    assert manifest.query_id == "query-1" and manifest.batch_id == harness.batch
    out = tmp_path / "again"
    restore_checkpoint(harness.store, harness.layout, out, "latest")
    assert {f.path: (out / f.path).read_bytes() for f in scan_checkpoint(out)} == restored


def test_a_restore_point_never_overwrites_a_kept_checkpoint_of_that_seq(tmp_path: Path) -> None:
    """Checkpoint 7 is still kept (a native savepoint may pin it): a canonical restore, a
    new query, at seq 7 leaves it as it is."""
    harness = Harness(tmp_path)
    harness.write_tree({"state/0/0/1.delta": 0})
    harness.uploader.upload(7)
    before = read_manifest(harness.store, harness.layout, 7)
    harness.write_tree({"state/0/0/2.delta": 1})
    (harness.local / "metadata").write_text(json.dumps({"id": "query-2"}))
    _hook(harness).restore_point(7, "sp-canonical")
    assert read_manifest(harness.store, harness.layout, 7) == before
