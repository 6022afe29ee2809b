"""A restored checkpoint under the real runtime: the exactly-once sink continues.

The sample job runs through `run_job`; its state is exported at the last committed
batch (to SeaweedFS in the second test), restored into a fresh checkpoint with another
partition count, and `run_job` resumes there on new input. The tables must hold the
reference over all input: nothing skipped, nothing repeated, though the restored
checkpoint's batch ids start again (the lineage's commit sequence does not).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.keyed_totals.sample_events import expected_results, write_event_files
from streamkeeper.reader import read_table_rows
from streamkeeper.runtime.job import build_output
from streamkeeper.runtime.runner import RunOptions, resolve_paths, run_job
from streamkeeper.runtime.session import build_session
from streamkeeper.spec import JobSpec, load_spec
from streamkeeper.state.export import export_canonical
from streamkeeper.state.positions import read_source_positions
from streamkeeper.state.restore import restore_canonical
from streamkeeper.state.spark_state import read_operators
from streamkeeper.state.uids import resolve_uids
from streamkeeper.storage import Location, S3Settings
from tests.conftest import SAMPLE_SPEC

pytestmark = pytest.mark.integration


def sample_spec(tmp_path: Path, root: str, checkpoint: str, **overrides: object) -> JobSpec:
    return load_spec(
        SAMPLE_SPEC,
        {
            "source.path": str(tmp_path / "events"),
            "storage.root": root,
            "checkpoint.dir": str(tmp_path / checkpoint),
            "spark.master": "local[2]",
            "spark.shuffle_partitions": 4,
            **overrides,
        },
    )


def rows(spec: JobSpec, sink: str) -> list[dict]:
    target = resolve_paths(spec).targets[sink]
    return read_table_rows(target.location.uri, location=target.location)


def savepoint_and_resume(tmp_path: Path, root: str, savepoint: Location, backend: str) -> None:
    files = write_event_files(tmp_path / "events", files=3, events_per_file=300)
    old = sample_spec(tmp_path, root, "ckpt-a", **{"state_backend.type": backend})
    assert run_job(old, RunOptions(available_now=True, spec_dir=SAMPLE_SPEC.parent)).batches == 3

    spark = build_session(old)
    checkpoint = resolve_paths(old).checkpoint_dir
    uids = resolve_uids(old.state, read_operators(spark, checkpoint))
    operators = export_canonical(spark, checkpoint, 2, uids, savepoint)
    positions = read_source_positions(checkpoint, 2).to_manifest()

    new = sample_spec(
        tmp_path,
        root,
        "ckpt-b",
        **{"state_backend.type": backend, "spark.shuffle_partitions": 3},
    )
    spark = build_session(new)
    report = restore_canonical(
        spark,
        savepoint_location=savepoint,
        operators=operators,
        source_offsets=positions["offsets"],
        source_log=positions["log"],
        new_output=build_output(spark, new, SAMPLE_SPEC.parent),
        new_uids=new.state.operator_uids() if new.state else None,
        checkpoint_dir=resolve_paths(new).checkpoint_dir,
        shuffle_partitions=new.spark.shuffle_partitions,
        state_backend=new.state_backend,
    )
    assert [(op.uid, op.rows) for op in report.operators] == [("op-0", 100)]

    files += write_event_files(tmp_path / "events", files=3, events_per_file=300, first_file=3)
    assert run_job(new, RunOptions(available_now=True, spec_dir=SAMPLE_SPEC.parent)).batches == 3

    totals, changes = expected_results(files)
    assert {r["key"]: (r["events"], r["total"]) for r in rows(new, "totals")} == totals
    assert sorted((r["key"], r["events"], r["total"]) for r in rows(new, "changes")) == changes
    store = resolve_paths(new).root.store()
    layout = resolve_paths(new).layout
    markers = [store.read_json(k) for k in store.list(layout.markers)]
    assert [m["batch_id"] for m in markers] == [0, 1, 2, 2, 3, 4]
    assert [m["seq"] for m in markers] == sorted({m["seq"] for m in markers})


def test_run_job_resumes_on_a_restored_checkpoint(tmp_path: Path) -> None:
    root = str(tmp_path / "data")
    savepoint_and_resume(tmp_path, root, Location(str(tmp_path / "savepoint")), "rocksdb")


@pytest.mark.s3
def test_savepoint_on_seaweedfs(tmp_path: Path, s3_root: str) -> None:
    savepoint = Location(f"{s3_root}/savepoints/sp-1", S3Settings.from_env())
    savepoint_and_resume(tmp_path, s3_root, savepoint, "hdfs")
    assert savepoint.store().list("state/op-0/_delta_log")
