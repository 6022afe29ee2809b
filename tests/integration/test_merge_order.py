"""A merge sink fed several rows per key in one batch: refused without order_by, else the
row with the greatest order_by wins. Real Spark, real Delta tables."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from jobs.keyed_totals.sample_events import read_events, write_event_files
from streamkeeper.reader import read_table_rows
from streamkeeper.runtime.runner import RunOptions, resolve_paths, run_job
from streamkeeper.spec import JobSpec
from tests.support.specs import local_spec

pytestmark = pytest.mark.integration

JOBS = Path(__file__).parent / "jobs"
SPEC = JOBS / "latest_per_key.yaml"


def _spec(tmp_path: Path, **overrides: object) -> JobSpec:
    return local_spec(tmp_path, SPEC, **overrides)


def _run(spec: JobSpec) -> Any:
    return run_job(spec, RunOptions(available_now=True, spec_dir=JOBS))


def test_two_rows_per_key_are_refused_then_ordered(tmp_path: Path) -> None:
    files = write_event_files(tmp_path / "events", files=2, events_per_file=60, keys=10)
    spec = _spec(tmp_path)
    target = resolve_paths(spec).targets["latest"]

    with pytest.raises(Exception) as caught:
        _run(spec)
    message = str(caught.value)
    assert "DuplicateKeyError: merge sink 'latest'" in message, message
    assert "key='k00" in message and "Add order_by: <column> to sink 'latest'" in message
    # Refused before the manifest: the table and the write-ahead log are unchanged.
    table = DeltaTable(target.location.uri)  # created, then fenced with the runner's epoch
    assert table.version() == 1 and table.transaction_version(target.data_app_id) is None
    assert read_table_rows(target.location.uri) == []
    # The failed batch's claim is voided, not deleted (its tasks may outlive the batch):
    # it can never be sealed, and its files are gone; a later start forgets it.
    claims = [json.loads(p.read_text()) for p in (tmp_path / "data").rglob("wal/manifests/*.json")]
    assert [c["state"] for c in claims] in ([], ["void"]), claims
    assert not list((tmp_path / "data").rglob("wal/staging/**/*.parquet"))

    # The fix the error names; the same checkpoint replays the refused batch.
    fixed = _spec(tmp_path, **{"sinks.0.order_by": "event_id"})
    assert _run(fixed).batches == 2
    latest: dict[str, dict] = {}
    for path in files:  # event ids grow with the file and within it
        for event in read_events(path):
            if event["event_id"] > latest.get(event["key"], {"event_id": -1})["event_id"]:
                latest[event["key"]] = event
    rows = read_table_rows(target.location.uri)
    assert sorted((r["key"], r["event_id"], r["value"]) for r in rows) == sorted(
        (e["key"], e["event_id"], e["value"]) for e in latest.values()
    )
