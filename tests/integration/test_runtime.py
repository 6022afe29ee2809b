"""The sample job through the real runtime: a real Spark session, real Delta tables."""

from __future__ import annotations

import json
import logging
import re
import shutil
import uuid
from pathlib import Path

import pytest

from jobs.keyed_totals.sample_events import expected_results, write_event_files
from streamkeeper.errors import CheckpointRestoreError
from streamkeeper.reader import read_table_rows
from streamkeeper.runtime.runner import RunOptions, resolve_paths, run_job
from streamkeeper.spec import JobSpec, load_spec
from streamkeeper.storage import Location, S3Settings
from tests.conftest import SAMPLE_SPEC

pytestmark = pytest.mark.integration


def _spec(tmp_path: Path, root: str, **overrides: object) -> JobSpec:
    return load_spec(
        SAMPLE_SPEC,
        {
            "source.path": str(tmp_path / "events"),
            "storage.root": root,
            "checkpoint.dir": str(tmp_path / "checkpoint"),
            "spark.master": "local[2]",
            "spark.shuffle_partitions": 2,
            **overrides,
        },
    )


def _run(spec: JobSpec, **options: object) -> object:
    return run_job(spec, RunOptions(available_now=True, spec_dir=SAMPLE_SPEC.parent, **options))


def _rows(spec: JobSpec, sink: str, version: int | None = None) -> list[dict]:
    target = resolve_paths(spec).targets[sink]
    return read_table_rows(target.location.uri, version=version, location=target.location)


def _totals(rows: list[dict]) -> dict[str, tuple[int, int]]:
    return {r["key"]: (r["events"], r["total"]) for r in rows}


def _markers(spec: JobSpec) -> list[dict]:
    paths = resolve_paths(spec)
    store = paths.root.store()
    return [store.read_json(k) for k in store.list(paths.layout.markers)]


@pytest.mark.parametrize("mode", ["exactly_once", "idempotent", "at_least_once"])
def test_each_sink_mode_writes_the_reference_result(tmp_path: Path, mode: str) -> None:
    files = write_event_files(tmp_path / "events", files=3, events_per_file=300)
    spec = _spec(tmp_path, str(tmp_path / "data"), **{"sinks.0.mode": mode, "sinks.1.mode": mode})
    result = _run(spec)
    totals, changes = expected_results(files)
    assert result.batches == 3
    assert _totals(_rows(spec, "totals")) == totals
    assert sorted((r["key"], r["events"], r["total"]) for r in _rows(spec, "changes")) == changes


def test_commit_markers_read_every_table_as_of_one_checkpoint(tmp_path: Path) -> None:
    files = write_event_files(tmp_path / "events", files=3, events_per_file=300)
    spec = _spec(tmp_path, str(tmp_path / "data"))
    _run(spec)
    markers = _markers(spec)
    assert [m["batch_id"] for m in markers] == [0, 1, 2]
    assert [m["seq"] for m in markers] == sorted({m["seq"] for m in markers})
    for batch, marker in enumerate(markers):
        as_of = _totals(_rows(spec, "totals", version=marker["versions"]["totals"]))
        assert as_of == expected_results(files[: batch + 1])[0]
        changes = _rows(spec, "changes", version=marker["versions"]["changes"])
        assert len(changes) == sum(m["rows"]["changes"] for m in markers[: batch + 1])
        assert all(w.startswith("driver/") for w in marker["writers"])  # local mode: no cluster
    assert not list((tmp_path / "data").rglob("wal/manifests/*.json")), "manifests not retired"


def test_restart_resumes_from_the_checkpoint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    files = write_event_files(tmp_path / "events", files=2, events_per_file=200)
    spec = _spec(tmp_path, str(tmp_path / "data"))
    assert _run(spec).batches == 2
    files += write_event_files(tmp_path / "events", files=2, events_per_file=200, first_file=2)
    caplog.set_level(logging.INFO, logger="streamkeeper.runtime.start_phases")
    assert _run(spec).batches == 2
    assert _totals(_rows(spec, "totals")) == expected_results(files)[0]
    # The restart says where its time went, once, phase by phase.
    # The last line is the restart's (the first run logs one too where INFO is captured).
    line = [r.getMessage() for r in caplog.records if r.name.endswith("start_phases")][-1]
    order = ["storage probe ", "lineage checks ", "Spark session and plan ", "restore ",
             "fence and heartbeat ", "records, tables and checkpoints ", "recovery ",
             "query start "]  # fmt: skip
    positions = [line.index(name) for name in order]
    assert positions == sorted(positions), line
    seconds = [float(x) for x in re.findall(r" (\d+\.\d\d) s", line)]
    assert len(seconds) == len(order) + 1 and abs(sum(seconds[:-1]) - seconds[-1]) < 0.05


def test_a_driver_killed_while_it_wrote_its_first_offsets_starts_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What a SIGKILL during the first batch's `offsets/0` write leaves (found by the
    fan-in chaos test): the query's metadata and Spark's temp file, renamed never. Spark's
    new-query check counts the temp file, so every restart failed with
    STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY; the start sweeps it first."""
    files = write_event_files(tmp_path / "events", files=2, events_per_file=200)
    spec = _spec(tmp_path, str(tmp_path / "data"))
    checkpoint = tmp_path / "checkpoint"
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}) + "\n")
    temp = f"0.{uuid.uuid4()}.tmp"
    (checkpoint / "offsets" / f".{temp}").write_bytes(b"")
    (checkpoint / "offsets" / f"..{temp}.crc").write_bytes(b"")
    caplog.set_level(logging.INFO, logger="streamkeeper.runtime.ownership")
    assert _run(spec).batches == 2
    assert _totals(_rows(spec, "totals")) == expected_results(files)[0]
    swept = [r.getMessage() for r in caplog.records if "unfinished checkpoint" in r.getMessage()]
    assert len(swept) == 1 and f"offsets/.{temp}" in swept[0], swept


def test_checkpoint_reset_neither_skips_nor_repeats(tmp_path: Path) -> None:
    """Batch ids restart at 0 in a fresh checkpoint; the commit sequence does not."""
    old = write_event_files(tmp_path / "events", files=2, events_per_file=200)
    spec = _spec(tmp_path, str(tmp_path / "data"))
    _run(spec)
    shutil.rmtree(tmp_path / "checkpoint")
    new_dir = tmp_path / "events-after-reset"
    new = write_event_files(new_dir, files=2, events_per_file=200, first_file=50)
    reset = _spec(tmp_path, str(tmp_path / "data"), **{"source.path": str(new_dir)})
    with pytest.raises(CheckpointRestoreError, match="--allow-fresh-start"):
        _run(reset)  # an empty checkpoint folder under a lineage that committed: refused
    _run(reset, allow_fresh_start=True)  # a new input: starting over is what is meant
    markers = _markers(spec)
    assert [m["batch_id"] for m in markers] == [0, 1, 0, 1]
    assert [m["seq"] for m in markers] == sorted(m["seq"] for m in markers)
    assert len({m["seq"] for m in markers}) == 4
    changes = sorted((r["key"], r["events"], r["total"]) for r in _rows(spec, "changes"))
    assert changes == sorted(expected_results(old)[1] + expected_results(new)[1])


def test_rocksdb_state_backend_with_changelog(tmp_path: Path) -> None:
    files = write_event_files(tmp_path / "events", files=2, events_per_file=300)
    spec = _spec(
        tmp_path,
        str(tmp_path / "data"),
        **{"state_backend.type": "rocksdb", "state_backend.changelog": True},
    )
    _run(spec)
    assert _totals(_rows(spec, "totals")) == expected_results(files)[0]
    state_files = [p.name for p in (tmp_path / "checkpoint" / "state").rglob("*") if p.is_file()]
    assert any(name.endswith(".changelog") for name in state_files), state_files


@pytest.mark.s3
def test_sample_job_on_seaweedfs(tmp_path: Path, s3_root: str) -> None:
    files = write_event_files(tmp_path / "events", files=3, events_per_file=300)
    spec = _spec(tmp_path, s3_root)
    result = _run(spec)
    assert result.tables["totals"] == f"{s3_root}/tables/totals"
    assert _totals(_rows(spec, "totals")) == expected_results(files)[0]
    root = Location(s3_root, S3Settings.from_env())
    assert root.store().list(f"lineages/{spec.name}/wal/manifests") == []
    assert len(root.store().list(f"lineages/{spec.name}/markers")) == 3
