"""Externalized checkpoints with the real runtime: a lost machine's checkpoint is restored
from object storage and the job goes on with exactly-once output."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jobs.keyed_totals.sample_events import expected_results, write_event_files
from streamkeeper.cli import app
from streamkeeper.commit.coordinator import CommitCoordinator
from streamkeeper.observability.history import CheckpointHistory
from streamkeeper.reader import read_table_rows
from streamkeeper.runtime.runner import RunOptions, RunResult, resolve_paths, run_job
from streamkeeper.snapshots.manifest import CheckpointManifest, checkpoint_ids, read_manifest
from streamkeeper.snapshots.restore import restore_checkpoint
from streamkeeper.spec import JobSpec, load_spec
from tests.conftest import SAMPLE_SPEC

pytestmark = pytest.mark.integration

ROCKSDB_CHANGELOG = {"state_backend.type": "rocksdb", "state_backend.changelog": True}
# The pytest process reuses one SparkSession, whose SQL conf keeps the state store provider
# an earlier RocksDB run set; an HDFS-backed run has to say so.
HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"


def _spec(tmp_path: Path, root: str, **overrides: object) -> JobSpec:
    if "state_backend.type" not in overrides:
        overrides["spark.conf.spark.sql.streaming.stateStore.providerClass"] = HDFS_PROVIDER
    return load_spec(
        SAMPLE_SPEC,
        {
            "source.path": str(tmp_path / "events"),
            "storage.root": root,
            "checkpoint.dir": str(tmp_path / "checkpoint"),
            "checkpoint.externalized.enabled": True,
            "spark.master": "local[2]",
            "spark.shuffle_partitions": 2,
            **overrides,
        },
    )


def _run(spec: JobSpec, **options: object) -> RunResult:
    return run_job(spec, RunOptions(available_now=True, spec_dir=SAMPLE_SPEC.parent, **options))


def _manifests(spec: JobSpec) -> list[CheckpointManifest]:
    paths = resolve_paths(spec)
    store = paths.root.store()
    return [read_manifest(store, paths.layout, i) for i in checkpoint_ids(store, paths.layout)]


def _stored_files(spec: JobSpec) -> set[str]:
    paths = resolve_paths(spec)
    return set(paths.root.store().list(paths.layout.checkpoint_files))


def _assert_exact_output(spec: JobSpec, files: list[Path]) -> None:
    totals, changes = expected_results(files)
    target = resolve_paths(spec).targets
    rows = read_table_rows(target["totals"].location.uri, location=target["totals"].location)
    assert {r["key"]: (r["events"], r["total"]) for r in rows} == totals
    rows = read_table_rows(target["changes"].location.uri, location=target["changes"].location)
    assert sorted((r["key"], r["events"], r["total"]) for r in rows) == changes  # no duplicates


def _assert_incremental(spec: JobSpec, manifests: list[CheckpointManifest]) -> None:
    """Each checkpoint uploaded exactly the files no earlier one had, and only those."""
    for before, after in zip(manifests, manifests[1:], strict=False):
        new = after.keys - before.keys
        assert after.uploaded_files == len(new) < len(after.files)
        new_sizes = {f.key: f.size for f in after.files if f.key in new}  # identical files: once
        assert after.uploaded_bytes == sum(new_sizes.values())
    assert _stored_files(spec) == set().union(*(m.keys for m in manifests))


@pytest.mark.parametrize(
    ("storage", "backend"),
    [
        ("local", {}),
        ("local", ROCKSDB_CHANGELOG),
        pytest.param("seaweedfs", {}, marks=pytest.mark.s3),
    ],
    ids=["local-hdfs", "local-rocksdb-changelog", "seaweedfs-hdfs"],
)
def test_a_lost_checkpoint_is_restored_from_the_latest_externalized_one(
    tmp_path: Path, request: pytest.FixtureRequest, storage: str, backend: dict
) -> None:
    root = str(tmp_path / "data") if storage == "local" else request.getfixturevalue("s3_root")
    files = write_event_files(tmp_path / "events", files=3, events_per_file=300)
    spec = _spec(tmp_path, root, **backend)
    _run(spec)
    manifests = _manifests(spec)
    assert [m.batch_id for m in manifests] == [0, 1, 2]  # retained: 3 (the default)
    _assert_incremental(spec, manifests)

    # The checkpoint history shows each checkpoint's upload (the coordinator's facts).
    history = CheckpointHistory(resolve_paths(spec).history).read()
    uploaded = {m.checkpoint_id: m.uploaded_bytes for m in manifests}
    assert {r["commit_seq"]: r["bytes_uploaded"] for r in history} == uploaded

    shutil.rmtree(tmp_path / "checkpoint")  # the machine is lost, its disk with it
    files += write_event_files(tmp_path / "events", files=2, events_per_file=300, first_file=3)
    result = _run(spec, from_checkpoint="latest")

    assert result.batches == 2  # resumed after batch 2, with its state
    _assert_exact_output(spec, files)
    assert [m.batch_id for m in _manifests(spec)] == [2, 3, 4]  # retention kept the last 3
    _assert_incremental(spec, _manifests(spec))


def test_a_checkpoint_externalized_before_its_commit_is_committed_after_a_restore(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The machine dies after checkpoint 2 reached storage, before batch 2 became visible."""
    files = write_event_files(tmp_path / "events", files=3, events_per_file=300)
    spec = _spec(tmp_path, str(tmp_path / "data"))
    real_commit = CommitCoordinator.commit_sinks

    def die_at_batch_2(self: CommitCoordinator, manifest, sinks):  # noqa: ANN001, ANN202
        if manifest.batch_id == 2:
            raise RuntimeError("machine lost")
        return real_commit(self, manifest, sinks)

    monkeypatch.setattr(CommitCoordinator, "commit_sinks", die_at_batch_2)
    with pytest.raises(Exception, match="machine lost"):
        _run(spec)
    monkeypatch.undo()
    assert _manifests(spec)[-1].batch_id == 2
    _assert_exact_output(spec, files[:2])  # batch 2 is not visible

    shutil.rmtree(tmp_path / "checkpoint")
    files += write_event_files(tmp_path / "events", files=1, events_per_file=300, first_file=3)
    result = _run(spec, from_checkpoint="latest")
    assert len(result.recovery.committed) == 1  # batch 2, from the WAL, vouched for by commits/2
    assert result.batches == 1
    _assert_exact_output(spec, files)


def test_a_specific_checkpoint_id_is_restored_and_the_job_rewinds_to_it(tmp_path: Path) -> None:
    files = write_event_files(tmp_path / "events", files=3, events_per_file=300)
    spec = _spec(tmp_path, str(tmp_path / "data"))
    _run(spec)
    first = _manifests(spec)[0]
    paths = resolve_paths(spec)

    elsewhere = tmp_path / "new-machine"
    restored = restore_checkpoint(
        paths.root.store(), paths.layout, elsewhere, checkpoint=first.checkpoint_id
    )
    assert restored == first
    for f in first.files:
        assert (elsewhere / f.path).stat().st_size == f.size
    assert sorted(p.name for p in (elsewhere / "commits").iterdir() if p.name.isdigit()) == ["0"]

    rewound = _spec(tmp_path, str(tmp_path / "data"), **{"checkpoint.dir": str(elsewhere)})
    result = _run(rewound)
    assert result.batches == 2  # batches 1 and 2 again, on the state of checkpoint 0
    totals, _ = expected_results(files)
    target = paths.targets["totals"]
    rows = read_table_rows(target.location.uri, location=target.location)
    assert {r["key"]: (r["events"], r["total"]) for r in rows} == totals


@pytest.mark.parametrize("retention", ["retain_on_cancellation", "delete_on_cancellation"])
def test_cancel_keeps_or_discards_checkpoints_as_configured(tmp_path: Path, retention: str) -> None:
    write_event_files(tmp_path / "events", files=2, events_per_file=300)
    spec = _spec(
        tmp_path,
        str(tmp_path / "data"),
        **{"checkpoint.externalized.retention": retention, "checkpoint.interval": "200ms"},
    )

    def cancel_after_two_checkpoints() -> None:
        deadline = time.monotonic() + 120
        while len(_manifests(spec)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGTERM)  # the runner's stop signal: a cancel

    previous = signal.getsignal(signal.SIGTERM)
    canceller = threading.Thread(target=cancel_after_two_checkpoints, daemon=True)
    canceller.start()
    try:
        run_job(spec, RunOptions(spec_dir=SAMPLE_SPEC.parent))
    finally:
        signal.signal(signal.SIGTERM, previous)
        canceller.join()
    kept = _manifests(spec)
    if retention == "retain_on_cancellation":
        assert len(kept) >= 2 and _stored_files(spec)
    else:
        assert kept == [] and _stored_files(spec) == set()


def test_cli_from_checkpoint_refuses_bad_ids_and_a_non_empty_directory(tmp_path: Path) -> None:
    base = ["run", str(SAMPLE_SPEC), "--root", str(tmp_path / "data")]
    base += ["--checkpoint-dir", str(tmp_path / "checkpoint")]
    runner = CliRunner(env={"COLUMNS": "300"})  # one line per message, not a wrapped box
    result = runner.invoke(app, [*base, "--from-checkpoint", "newest"])
    assert result.exit_code == 2 and "expected 'latest' or a checkpoint id" in result.output

    (tmp_path / "checkpoint" / "offsets").mkdir(parents=True)
    result = runner.invoke(app, [*base, "--from-checkpoint", "latest"])
    assert result.exit_code == 2  # bad input: nothing was touched
    assert "is not empty" in result.output and str(tmp_path / "checkpoint") in result.output
