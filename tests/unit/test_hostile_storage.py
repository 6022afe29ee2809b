"""Nothing read back from storage reaches outside its own folder.

A process that may only write objects under the storage root (another job's transform
runs with the root's credentials) plants manifests, index entries, registry entries and
job records. Each path or key in them is checked to stay under its folder before any
byte is written or deleted: a refused restore writes nothing, a refused retention
deletes nothing, and the error names the bad value, where it was read and the fix.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from streamkeeper.client import StreamkeeperClient
from streamkeeper.commit.wal import WriteAheadLog
from streamkeeper.errors import StreamkeeperError
from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.snapshots.index import IndexWriter, read_index
from streamkeeper.snapshots.restore import restore_checkpoint
from streamkeeper.snapshots.retention import ManifestKeys, apply_retention
from streamkeeper.snapshots.savepoint_disposal import apply_savepoint_retention
from streamkeeper.snapshots.savepoint_restore import plan_restore, restore_native
from streamkeeper.storage import LocalStore, Location, S3Settings, S3Store
from tests.support.savepoint_world import World

LINEAGE = "lin"


class Root:
    """A storage root below `base/data`, and a host folder beside it that must stay as is."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.data = base / "data"
        self.store = LocalStore(self.data)
        self.layout = LineageLayout(Location(str(self.data)), LINEAGE, "job")
        self.host = base / "host"  # stands for the driver host's files
        self.host.mkdir(parents=True)
        (self.host / "precious").write_bytes(b"keep me")

    def put_file(self, key: str, body: bytes) -> dict:
        path = self.data / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
        return {"size": len(body), "mtime_ns": 0, "sha256": hashlib.sha256(body).hexdigest()}

    def checkpoint(self, checkpoint_id: int, files: dict[str, tuple[str, bytes]]) -> None:
        """Manifest `checkpoint_id` listing `path -> (key, body)`; the bodies are stored at
        their keys when the key stays in the root (so only the path or key is bad)."""
        listed = []
        for path, (key, body) in files.items():
            info = {"size": len(body), "mtime_ns": 0, "sha256": hashlib.sha256(body).hexdigest()}
            if not key.startswith("/") and ".." not in key.split("/"):
                self.put_file(key, body)
            listed.append({"path": path, "key": key, **info})
        manifest = {
            "lineage": LINEAGE,
            "checkpoint_id": checkpoint_id,
            "query_id": "q",
            "batch_id": checkpoint_id,
            "files": listed,
            "format": 1,
        }
        self.store.write_json(self.layout.checkpoint_manifest(checkpoint_id), manifest)
        index = self.store.read_json(self.layout.checkpoint_index) or {"checkpoints": []}
        index["checkpoints"].append({"id": checkpoint_id, "batch_id": checkpoint_id, "epoch": 1})
        self.store.write_json(self.layout.checkpoint_index, index)

    def host_files(self) -> dict[str, bytes]:
        return {p.relative_to(self.base).as_posix(): p.read_bytes() for p in _files(self.base)}


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() or p.is_symlink())


@pytest.fixture
def root(tmp_path: Path) -> Root:
    return Root(tmp_path)


def _good(root: Root) -> tuple[str, bytes]:
    return f"{root.layout.checkpoint_files}/{'a' * 64}.e1", b"v1\n{}"


# -- a planted checkpoint manifest: restore writes nothing outside, nothing at all ---------


@pytest.mark.parametrize(
    "bad_path",
    ["../../host/planted", "{host}/planted", "commits/../../../host/planted", "a//b", "a\\b"],
    ids=["dotdot", "absolute", "dotdot-inside", "empty-segment", "backslash"],
)
def test_a_manifest_path_outside_the_checkpoint_is_refused_before_any_write(
    root: Root, bad_path: str
) -> None:
    bad_path = bad_path.format(host=root.host)
    key, body = _good(root)
    root.checkpoint(7, {"metadata": (key, body), bad_path: (key, body)})
    before = root.host_files()
    local = root.base / "restored" / "ck"

    with pytest.raises(StreamkeeperError) as refused:
        restore_checkpoint(root.store, root.layout, local, "latest")

    message = str(refused.value)
    assert repr(bad_path) in message, message
    assert root.layout.checkpoint_manifest(7) in message, message
    assert "not written by streamkeeper" in message, message
    assert root.host_files() == before  # no planted file, no staging folder left behind
    assert not (root.base / "restored").exists() or not any((root.base / "restored").iterdir())


@pytest.mark.parametrize(
    "bad_key",
    [
        "lineages/lin/checkpoints/files/../../../../../host/precious",
        "{host}/precious",
        "jobs/job/job.json",
        "lineages/other/checkpoints/files/" + "b" * 64,
    ],
    ids=["dotdot", "absolute", "another-folder", "another-lineage"],
)
def test_a_manifest_key_outside_the_checkpoint_files_is_refused(root: Root, bad_key: str) -> None:
    bad_key = bad_key.format(host=root.host)
    body = b"keep me"  # the host file's bytes: its sha256 would match
    root.put_file("jobs/job/job.json", body)
    root.put_file("lineages/other/checkpoints/files/" + "b" * 64, body)
    root.checkpoint(7, {"metadata": _good(root), "offsets/0": (bad_key, body)})
    local = root.base / "restored" / "ck"
    before = root.host_files()

    with pytest.raises(StreamkeeperError) as refused:
        restore_checkpoint(root.store, root.layout, local, 7)

    assert repr(bad_key) in str(refused.value)
    assert root.host_files() == before
    assert not local.exists()


# -- retention deletes only what is its own ------------------------------------------------


@pytest.mark.parametrize(
    "bad_key",
    ["jobs/job/job.json", "lineages/lin/checkpoints/files/../../savepoints/registry.json"],
    ids=["another-folder", "dotdot"],
)
def test_retention_never_deletes_a_key_a_dropped_manifest_lists_outside_its_folder(
    root: Root, bad_key: str
) -> None:
    root.put_file("jobs/job/job.json", b"{}")
    root.put_file("lineages/lin/savepoints/registry.json", b"{}")
    root.checkpoint(1, {"metadata": _good(root), "offsets/0": (bad_key, b"{}")})
    root.checkpoint(2, {"metadata": _good(root)})
    writer = IndexWriter(root.store, root.layout, epoch=1)
    before = root.host_files()

    with pytest.raises(StreamkeeperError) as refused:
        apply_retention(writer, 1, ManifestKeys(root.store, root.layout))

    assert repr(bad_key) in str(refused.value)
    deleted = set(before) - set(root.host_files())
    assert "data/jobs/job/job.json" not in deleted
    assert "data/lineages/lin/savepoints/registry.json" not in deleted


@pytest.mark.parametrize(
    "entry",
    [{"id": 12}, {"id": "../../jobs"}, {"id": True}],
    ids=["fine", "a-path", "a-bool"],
)
def test_an_index_entry_is_read_as_a_checkpoint_id_or_refused(root: Root, entry: dict) -> None:
    root.store.write_json(
        root.layout.checkpoint_index, {"checkpoints": [{"batch_id": 0, "epoch": 1, **entry}]}
    )
    if entry["id"] == 12:
        assert read_index(root.store, root.layout).ids == [12]
        return
    with pytest.raises(StreamkeeperError) as refused:
        read_index(root.store, root.layout)
    assert repr(entry["id"]) in str(refused.value)
    assert root.layout.checkpoint_index in str(refused.value)


def test_an_index_pin_names_a_savepoint_id_or_is_refused(root: Root) -> None:
    root.store.write_json(root.layout.checkpoint_index, {"pins": {"../../jobs": 3}})
    with pytest.raises(StreamkeeperError, match=r"'\.\./\.\./jobs'"):
        read_index(root.store, root.layout)


# -- registry entries: an id read back is checked as it was on write ------------------------


@pytest.mark.parametrize("bad_id", ["", "..", "../checkpoints", "sp-x/../.."])
def test_savepoint_retention_refuses_a_registry_entry_whose_id_is_no_savepoint_id(
    tmp_path: Path, bad_id: str
) -> None:
    world = World(tmp_path, retained=1)
    world.run_batch(planned=False)
    kept = world.take(self_contained=True)
    world.run_batch(planned=False)
    newest = world.take(self_contained=True)
    registry = world.store.read_json(world.layout.savepoint_registry)
    assert registry is not None and kept and newest
    forged = {**registry["savepoints"][0], "id": bad_id, "created_at": 0.0}
    registry["savepoints"].insert(0, forged)
    world.store.write_json(world.layout.savepoint_registry, registry)
    before = {p.as_posix() for p in _files(tmp_path)}

    with pytest.raises(StreamkeeperError) as refused:
        apply_savepoint_retention(
            world.store, world.layout, retained=5, max_age=1.0, epoch=99, now=world.now
        )

    assert repr(bad_id) in str(refused.value)
    assert world.layout.savepoint_registry in str(refused.value)
    assert {p.as_posix() for p in _files(tmp_path)} == before  # nothing deleted


# -- savepoint manifests ---------------------------------------------------------------------


@pytest.mark.parametrize("self_contained", [True, False], ids=["self-contained", "pinned"])
@pytest.mark.parametrize("field", ["path", "key"])
def test_a_planted_savepoint_manifest_path_is_refused_before_a_restore(
    tmp_path: Path, self_contained: bool, field: str
) -> None:
    world = World(tmp_path / "w")
    world.run_batch(planned=False)
    savepoint_id = world.take(self_contained=self_contained)
    assert savepoint_id is not None
    host = tmp_path / "host"
    host.mkdir()
    manifest_key = world.layout.savepoint_manifest(savepoint_id)
    manifest = world.store.read_json(manifest_key)
    assert manifest is not None
    bad = "../../../../../../host/planted" if field == "path" else str(host / "x")
    manifest["files"][0][field] = bad
    world.store.write_json(manifest_key, manifest)
    local = tmp_path / "restored"

    with pytest.raises(StreamkeeperError) as refused:
        plan = plan_restore(
            world.layout.root, world.layout, savepoint_id, local, head_seq=None, allow_rewind=True
        )
        restore_native(plan, local)

    assert repr(bad) in str(refused.value)
    assert list(host.iterdir()) == []
    assert not local.exists()


def test_a_canonical_source_log_name_outside_the_source_folder_is_a_broken_savepoint(
    tmp_path: Path,
) -> None:
    world = World(tmp_path)
    world.run_batch(planned=False)
    savepoint_id = world.take(self_contained=True)
    assert savepoint_id is not None
    manifest_key = world.layout.savepoint_manifest(savepoint_id)
    manifest = world.store.read_json(manifest_key)
    assert manifest is not None
    manifest["source"] = {"offsets": None, "log": {"0": {"files": {"../../../x": "v1"}}}}
    world.store.write_json(manifest_key, manifest)

    described = StreamkeeperClient(str(world.store.root)).describe_savepoint(savepoint_id)

    assert described.broken
    assert any("'../../../x'" in p for p in described.problems), described.problems


# -- WAL manifests ---------------------------------------------------------------------------


def _wal_manifest(seq: int, append_path: str, merge_path: str, sink: str = "changes") -> dict:
    def part(table: str, output: str, path: str) -> dict:
        file = {"path": path, "size": 1, "rows": 1, "stats": "{}", "writer": "w"}
        return {"table": table, "output": output, "mode": "exactly_once", "files": [file]}

    return {
        "lineage": LINEAGE,
        "seq": seq,
        "query_id": "q",
        "batch_id": seq,
        "checkpoint_dir": "/ck",
        "epoch": 1,
        "created_at": 0.0,
        "format": 1,
        "sinks": {
            sink: part("/t/changes", "append", append_path),
            "totals": part("/t/totals", "merge", merge_path),
        },
    }


def test_a_wal_manifest_as_written_reads_back(root: Root) -> None:
    staging = root.layout.staging(5, "totals").uri
    good = _wal_manifest(
        5, f"{root.layout.precommit_dir(5)}/e1-a.parquet", f"{staging}/e1-b.parquet"
    )
    root.store.write_json(root.layout.manifest(5), good)
    assert WriteAheadLog(root.store, root.layout).read(5) is not None


@pytest.mark.parametrize(
    ("append_path", "merge_path", "sink", "bad"),
    [
        ("sk-lin/00000000000000000005/../../../victim.parquet", None, "changes", 0),
        ("/etc/victim.parquet", None, "changes", 0),
        ("sk-lin/00000000000000000004/e1-a.parquet", None, "changes", 0),  # another batch's
        (None, "{host}/victim.parquet", "changes", 1),
        (None, "{staging}/../../../../../victim.parquet", "changes", 1),
        (None, None, "../../x", 2),
    ],
    ids=["dotdot", "absolute", "other-seq", "merge-outside", "merge-dotdot", "sink-name"],
)
def test_a_wal_manifest_listing_a_file_outside_its_batch_folder_is_refused(
    root: Root, append_path: str | None, merge_path: str | None, sink: str, bad: int
) -> None:
    staging = root.layout.staging(5, "totals").uri
    append_path = append_path or f"{root.layout.precommit_dir(5)}/e1-a.parquet"
    merge_path = (merge_path or f"{staging}/e1-b.parquet").format(host=root.host, staging=staging)
    root.store.write_json(root.layout.manifest(5), _wal_manifest(5, append_path, merge_path, sink))

    with pytest.raises(StreamkeeperError) as refused:
        WriteAheadLog(root.store, root.layout).pending()

    assert repr([append_path, merge_path, sink][bad]) in str(refused.value)
    assert root.layout.manifest(5) in str(refused.value)


@pytest.mark.parametrize("inside", [False, True], ids=["host-folder", "under-the-root"])
def test_a_claim_of_a_sink_the_spec_lacks_is_swept_only_below_the_root(
    root: Root, inside: bool
) -> None:
    """Disposal finds a sink the current spec lacks (a green's new sink, rolled back) by
    the table URI its manifest recorded, and deletes that batch's folder in it: a planted
    manifest naming a host folder must delete nothing there."""
    from streamkeeper.commit.disposal import Disposed, ManifestDisposal
    from streamkeeper.lineage.control import ControlPlane

    seq = 5
    folder = root.layout.precommit_dir(seq)
    table = root.data / "tables" / "ghost" if inside else root.host
    victim = table / folder / "e1-a.parquet"
    victim.parent.mkdir(parents=True, exist_ok=True)
    victim.write_bytes(b"keep me" if not inside else b"a late task's file")
    manifest = _wal_manifest(seq, f"{folder}/e1-a.parquet", "", "ghost")
    manifest["sinks"] = {"ghost": {**manifest["sinks"]["ghost"], "table": str(table)}}
    manifest["state"] = "writing"
    root.store.write_json(root.layout.manifest(seq), manifest)
    wal = WriteAheadLog(root.store, root.layout)
    claim = wal.read(seq)
    assert claim is not None
    disposal = ManifestDisposal(root.store, root.layout, wal, targets={})
    control = ControlPlane(root.store, root.layout)

    if inside:
        done = Disposed()
        assert disposal.sweep_claim(claim, control, 2, done)
        assert not victim.exists() and done.swept_claims == [seq]
        return
    before = root.host_files()
    with pytest.raises(StreamkeeperError) as refused:
        disposal.sweep_claim(claim, control, 2, Disposed())
    assert repr(str(table)) in str(refused.value) and "ghost" in str(refused.value)
    assert victim.read_bytes() == b"keep me" and root.host_files() == before


# -- job records -----------------------------------------------------------------------------


@pytest.mark.parametrize("lineage", ["../lineages/x", "", "a/b"])
def test_a_job_record_naming_a_lineage_that_is_no_name_is_refused(root: Root, lineage: str) -> None:
    root.store.write_json("jobs/job/job.json", {"lineage": lineage, "tables": {}})
    if lineage == "":  # an empty lineage is the job's own (records before lineages)
        assert StreamkeeperClient(str(root.data)).job_record("job").lineage == "job"
        return
    with pytest.raises(StreamkeeperError) as refused:
        StreamkeeperClient(str(root.data)).job_record("job")
    assert repr(lineage) in str(refused.value) and "jobs/job/job.json" in str(refused.value)


# -- the stores themselves ---------------------------------------------------------------------

BAD_KEYS = ["../x", "a/../../x", "/etc/passwd", "a//b", "a/./b", "a\x00b", "a\\..\\b"]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_the_local_store_refuses_a_key_that_is_no_clean_relative_path(root: Root, key: str) -> None:
    for act in (
        lambda: root.store.read_json(key),
        lambda: root.store.write_json(key, {}),
        lambda: root.store.delete([key]),
        lambda: root.store.exists(key),
    ):
        with pytest.raises(StreamkeeperError, match="escapes|not a clean"):
            act()
    assert root.host_files() == {"host/precious": b"keep me"}


@pytest.mark.parametrize("key", BAD_KEYS)
def test_the_s3_store_refuses_a_key_that_is_no_clean_relative_path(key: str) -> None:
    # No server: the refusal comes before any request (the endpoint does not exist).
    settings = S3Settings(endpoint_url="http://127.0.0.1:9", access_key="a", secret_key="b")
    store = S3Store(Location("s3://bucket/prefix", settings), fail_fast=True)
    for act in (
        lambda: store.read_json(key),
        lambda: store.write_json(key, {}),
        lambda: store.delete([key]),
        lambda: store.list(key),
    ):
        with pytest.raises(StreamkeeperError, match="escapes|not a clean"):
            act()


def test_a_folder_delete_of_the_whole_root_is_refused_on_s3() -> None:
    settings = S3Settings(endpoint_url="http://127.0.0.1:9", access_key="a", secret_key="b")
    store = S3Store(Location("s3://bucket/prefix", settings), fail_fast=True)
    with pytest.raises((StreamkeeperError, ValueError), match="not the root"):
        store.delete_folder("")
