"""Checkpoint health and history with a real Spark session and injected faults."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from jobs.keyed_totals.sample_events import expected_results, write_event_files
from streamkeeper import injection
from streamkeeper.errors import CheckpointFailureLimitError
from streamkeeper.lineage.control import ControlPlane
from streamkeeper.observability.health import assess
from streamkeeper.observability.history import CheckpointHistory
from streamkeeper.reader import read_table_rows
from streamkeeper.runtime.runner import RunOptions, resolve_paths, run_job
from streamkeeper.spec import JobSpec
from tests.conftest import SAMPLE_SPEC
from tests.support import faults
from tests.support.specs import local_spec

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def fresh_faults(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    faults.reset()
    faults.install()
    yield
    injection.clear()
    faults.reset()


def _spec(tmp_path: Path, **overrides: object) -> JobSpec:
    return local_spec(tmp_path, SAMPLE_SPEC, **overrides)


def _run(spec: JobSpec):  # noqa: ANN202
    return run_job(spec, RunOptions(available_now=True, spec_dir=SAMPLE_SPEC.parent))


def _heartbeat(spec: JobSpec) -> dict:
    paths = resolve_paths(spec)
    beat = ControlPlane(paths.root.store(), paths.layout).heartbeat()
    assert beat is not None
    return beat


def _totals(spec: JobSpec) -> dict:
    rows = read_table_rows(str(resolve_paths(spec).targets["totals"].location.uri))
    return {r["key"]: (r["events"], r["total"]) for r in rows}


def test_history_rows_agree_with_the_query_progress(tmp_path: Path) -> None:
    write_event_files(tmp_path / "events", files=3, events_per_file=250)
    spec = _spec(tmp_path)
    _run(spec)
    rows = CheckpointHistory(resolve_paths(spec).history).read()
    assert [r["checkpoint_id"] for r in rows] == [0, 1, 2]
    assert [r["input_rows"] for r in rows] == [250, 250, 250]
    assert [r["commit_seq"] for r in rows] == [0, 1, 2]
    assert all(r["visibility_delay_ms"] is not None for r in rows)
    assert all(0 < r["state_rows"] <= 100 for r in rows)
    assert all(r["duration_ms"] >= r["write_ms"] > 0 for r in rows)
    assert rows[-1]["state_rows"] == len(_totals(spec))
    # Each commit marker says where its visibility delay went: its parts add up to at
    # most the whole, and every table of the job has its own.
    paths = resolve_paths(spec)
    store = paths.root.store()
    for row in rows:
        marker = store.read_json(paths.layout.marker(row["commit_seq"]))
        phases = marker["visibility_phases_ms"]
        assert set(phases["tables"]) == {"totals", "changes"}, phases
        parts = [phases["noticed"], phases["checkpoint"], *phases["tables"].values()]
        assert all(part >= 0 for part in parts), phases
        assert sum(parts) <= marker["visibility_delay_ms"] + 1.0, (phases, marker)


def test_a_failed_batch_within_tolerance_restarts_and_stays_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = write_event_files(tmp_path / "events", files=3, events_per_file=200)
    monkeypatch.setenv("STREAMKEEPER_FAIL_BATCHES", "1")
    spec = _spec(tmp_path, **{"checkpoint.tolerable_failures": 1})
    _run(spec)
    beat = _heartbeat(spec)
    assert beat["state"] == "FINISHED"
    assert beat["failed_checkpoints"] == 1 and beat["consecutive_failures"] == 0
    assert "injected failure of batch 1" in beat["last_failure"]
    assert _totals(spec) == expected_results(files)[0]


def test_a_failed_batch_beyond_tolerance_fails_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = write_event_files(tmp_path / "events", files=3, events_per_file=200)
    monkeypatch.setenv("STREAMKEEPER_FAIL_BATCHES", "1")
    spec = _spec(tmp_path, **{"checkpoint.tolerable_failures": 0})
    with pytest.raises(CheckpointFailureLimitError, match="injected failure of batch 1"):
        _run(spec)
    beat = _heartbeat(spec)
    status = assess(beat, [], interval=1.0, timeout=600.0)
    assert status.state == "FAILED" and "tolerable_failures=0" in status.reason
    assert _totals(spec) == expected_results(files[:1])[0]  # batch 0 only, nothing of batch 1


def _warm_lineage(tmp_path: Path) -> list[Path]:
    """One batch with the default timeout: a query's first batch pays its start-up (Python
    workers, state store), which on a busy machine outlasts the short timeouts below."""
    files = write_event_files(tmp_path / "events", files=1, events_per_file=100)
    _run(_spec(tmp_path))
    return files


def test_slow_batches_count_as_failed_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _warm_lineage(tmp_path)
    write_event_files(tmp_path / "events", files=4, events_per_file=100, first_file=1)
    monkeypatch.setenv("STREAMKEEPER_SLOW_BATCHES", "2,3:4")
    spec = _spec(tmp_path, **{"checkpoint.timeout": "2s", "checkpoint.tolerable_failures": 1})
    with pytest.raises(
        CheckpointFailureLimitError, match="checkpoint 3 exceeded checkpoint.timeout"
    ):
        _run(spec)
    assert _heartbeat(spec)["state"] == "FAILED"


def test_one_slow_batch_is_tolerated_and_the_next_resets_the_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = _warm_lineage(tmp_path)
    files += write_event_files(tmp_path / "events", files=3, events_per_file=100, first_file=1)
    monkeypatch.setenv("STREAMKEEPER_SLOW_BATCHES", "2:4")
    spec = _spec(tmp_path, **{"checkpoint.timeout": "2s", "checkpoint.tolerable_failures": 1})
    _run(spec)
    beat = _heartbeat(spec)
    assert beat["failed_checkpoints"] == 1 and beat["consecutive_failures"] == 0
    assert "checkpoint 2 exceeded" in beat["last_failure"]
    assert _totals(spec) == expected_results(files)[0]


@pytest.fixture
def fresh_upload_faults() -> Iterator[None]:
    faults.reset()
    yield
    faults.reset()


@pytest.mark.usefixtures("fresh_upload_faults")
def test_a_failed_upload_within_tolerance_is_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = write_event_files(tmp_path / "events", files=3, events_per_file=100)
    monkeypatch.setenv("STREAMKEEPER_FAIL_UPLOADS", "1")
    spec = _spec(
        tmp_path,
        **{"checkpoint.externalized.enabled": True, "checkpoint.tolerable_failures": 1},
    )
    _run(spec)
    beat = _heartbeat(spec)
    assert beat["failed_checkpoints"] == 1 and beat["consecutive_failures"] == 0
    assert "injected failure of checkpoint upload 1" in beat["last_failure"]
    assert _totals(spec) == expected_results(files)[0]


@pytest.mark.usefixtures("fresh_upload_faults")
def test_a_failed_upload_beyond_tolerance_fails_the_job_before_any_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_event_files(tmp_path / "events", files=2, events_per_file=100)
    monkeypatch.setenv("STREAMKEEPER_FAIL_UPLOADS", "1")
    spec = _spec(tmp_path, **{"checkpoint.externalized.enabled": True})
    with pytest.raises(CheckpointFailureLimitError, match="upload 1"):
        _run(spec)
    assert _heartbeat(spec)["state"] == "FAILED"
    assert _totals(spec) == {}  # the checkpoint never became durable, so nothing is visible
