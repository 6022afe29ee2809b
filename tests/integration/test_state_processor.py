"""The state processor API on real Spark: read a savepoint's state, change it, write a
new savepoint, restore a job from it; and a savepoint bootstrapped from a batch table."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from streamkeeper.spec import StateBackendSpec
from streamkeeper.state.export import export_canonical
from streamkeeper.state.format import (
    CanonicalManifest,
    read_canonical_manifest,
    write_canonical_manifest,
)
from streamkeeper.state.positions import read_source_positions
from streamkeeper.state.processor import read_state, state_uids, write_state
from streamkeeper.state.restore import restore_canonical
from streamkeeper.storage import Location
from tests.integration.jobs import state_jobs
from tests.support.state import (
    all_events,
    completed_batches,
    reference_totals,
    run_query,
    state_store,
    stream,
    write_events,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = SparkSession.builder.master("local[2]").getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session


def savepoint_of(spark: SparkSession, checkpoint: Path, folder: Location) -> CanonicalManifest:
    """A canonical savepoint of a checkpoint's last batch, with its manifest."""
    batch = completed_batches(checkpoint)[-1]
    manifest = CanonicalManifest(
        id="sp-test",
        job="totals",
        lineage="totals",
        batch_id=batch,
        checkpoint_id=batch,
        operators=export_canonical(spark, checkpoint, batch, {0: "totals"}, folder),
        source=read_source_positions(checkpoint, batch).to_manifest(),
        sink_seqs={},
        spark_version=spark.version,
        created_at=time.time(),
    )
    write_canonical_manifest(folder, manifest)
    return manifest


def restore(spark: SparkSession, folder: Location, output, checkpoint: Path, backend: str):
    manifest = read_canonical_manifest(folder)
    return restore_canonical(
        spark,
        savepoint_location=folder,
        operators=manifest.operators,
        source_offsets=manifest.source["offsets"],
        source_log=manifest.source["log"],
        new_output=output,
        new_uids={0: "totals"},
        checkpoint_dir=checkpoint,
        shuffle_partitions=3,
        state_backend=StateBackendSpec(type=backend),
    )


def test_read_change_write_and_restore(spark: SparkSession, tmp_path: Path) -> None:
    events = tmp_path / "events"
    old_files = write_events(events, files=2, per_file=300)
    with state_store(spark, "hdfs", 4):
        run_query(state_jobs.totals(stream(spark, events)), tmp_path / "old")
    original = Location(str(tmp_path / "sp1"))
    manifest = savepoint_of(spark, tmp_path / "old", original)

    state = read_state(spark, original, "totals")
    seen = {r.key.key: (r.value["count"], r.value["sum"]) for r in state.collect()}
    assert seen == reference_totals(all_events(old_files))
    assert state_uids(original) == ["totals"]

    fixed = state.withColumn(
        "value",
        F.when(
            F.col("key.key") == "k000", F.col("value").withField("count", F.lit(1000))
        ).otherwise(F.col("value")),
    ).where("key.key != 'k001'")
    changed = Location(str(tmp_path / "sp2"))
    written = write_state(spark, changed, {"totals": fixed}, based_on=manifest)
    assert written.source == manifest.source and written.extra == {"derived_from": "sp-test"}
    assert written.operators[0].rows == len(seen) - 1

    new_files = write_events(events, files=2, per_file=300, first_file=2)
    output = state_jobs.totals(stream(spark, events))
    restore(spark, changed, output, tmp_path / "new", "rocksdb")
    latest = run_query(output, tmp_path / "new").latest()

    after = reference_totals(all_events(new_files))
    before = reference_totals(all_events(old_files))
    assert (latest["k000"]["events"], latest["k000"]["total"]) == (
        1000 + after["k000"][0],
        before["k000"][1] + after["k000"][1],
    )
    assert (latest["k001"]["events"], latest["k001"]["total"]) == after["k001"]  # forgotten
    everything = reference_totals(all_events(old_files + new_files))
    for key in set(latest) - {"k000", "k001"}:
        assert (latest[key]["events"], latest[key]["total"]) == everything[key]


def test_state_bootstrapped_from_a_batch_table(spark: SparkSession, tmp_path: Path) -> None:
    """Flink's bootstrap transformation: seed a new job's state from a table."""
    seeds = spark.createDataFrame([("k000", 10, 500), ("zzz", 1, 7)], "id string, n long, s long")
    state = seeds.select(
        F.struct(F.col("id").alias("key")).alias("key"),
        F.struct(F.col("n").alias("count"), F.col("s").alias("sum")).alias("value"),
    )
    folder = Location(str(tmp_path / "seeded"))
    manifest = write_state(spark, folder, {"totals": state}, job="totals")
    assert manifest.source == {"offsets": None, "log": {}}

    events = tmp_path / "events"
    files = write_events(events, files=2, per_file=200)
    output = state_jobs.totals(stream(spark, events))
    restore(spark, folder, output, tmp_path / "new", "hdfs")
    latest = run_query(output, tmp_path / "new").latest()  # reads the files from the start

    totals = reference_totals(all_events(files))
    assert (latest["k000"]["events"], latest["k000"]["total"]) == (
        10 + totals["k000"][0],
        500 + totals["k000"][1],
    )
    assert "zzz" not in latest  # restored, but no event touched it
    assert {k: (r["events"], r["total"]) for k, r in latest.items() if k != "k000"} == {
        k: v for k, v in totals.items() if k != "k000"
    }
