"""transformWithStateInPandas: canonical savepoint per state variable, restored through
the job's own initialState (RocksDB only)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from streamkeeper.errors import CheckpointRestoreError
from streamkeeper.spec import StateBackendSpec
from streamkeeper.state.errors import UnsupportedOperatorError
from streamkeeper.state.export import export_canonical
from streamkeeper.state.processor import read_state, restoring
from streamkeeper.state.restore import restore_canonical
from streamkeeper.storage import Location
from tests.integration.jobs import state_jobs
from tests.support.state import (
    all_events,
    reference_totals,
    run_query,
    state_store,
    stream,
    write_events,
    write_manifest,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = SparkSession.builder.master("local[2]").getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session


def test_transform_with_state_restores_through_initial_state(
    spark: SparkSession, tmp_path: Path
) -> None:
    events = tmp_path / "events"
    files = write_events(events, files=2, per_file=200)
    with state_store(spark, "rocksdb", 4):
        run_query(state_jobs.counted(stream(spark, events)), tmp_path / "old")
    folder = Location(str(tmp_path / "sp"))
    operators = export_canonical(spark, tmp_path / "old", 1, {0: "counter"}, folder)
    assert operators[0].store_names == ["count"]
    positions = write_manifest(spark, folder, operators, tmp_path / "old", 1).source
    seen = read_state(spark, folder, "counter", state_variable="count").collect()
    assert {r.key.key: r.value.n for r in seen} == {
        k: v[0] for k, v in reference_totals(all_events(files)).items()
    }

    def restore(output, checkpoint: Path, backend: str = "rocksdb"):
        return restore_canonical(
            spark,
            savepoint_location=folder,
            operators=operators,
            source_offsets=positions["offsets"],
            source_log=positions["log"],
            new_output=output,
            new_uids={0: "counter"},
            checkpoint_dir=checkpoint,
            shuffle_partitions=3,
            state_backend=StateBackendSpec(type=backend),
        )

    # Built outside restoring(): no initialState, so the state would be lost.
    with pytest.raises(CheckpointRestoreError, match="'count' has 0 row.*initialState"):
        restore(state_jobs.counted(stream(spark, events)), tmp_path / "forgot")
    assert not (tmp_path / "forgot").exists()
    with pytest.raises(UnsupportedOperatorError, match="needs the RocksDB state store"):
        restore(state_jobs.counted(stream(spark, events)), tmp_path / "hdfs", "hdfs")

    files += write_events(events, files=2, per_file=200, first_file=2)
    with restoring(folder):
        output = state_jobs.counted(stream(spark, events))
    restore(output, tmp_path / "new")
    latest = run_query(state_jobs.counted(stream(spark, events)), tmp_path / "new").latest()
    expected = reference_totals(all_events(files))
    assert {key: row["n"] for key, row in latest.items()} == {
        key: expected[key][0] for key in latest
    }
