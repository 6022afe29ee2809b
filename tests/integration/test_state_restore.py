"""Canonical savepoints on real Spark: export, then restore into changed code.

Each test runs a job on part of its input, exports its state at the last completed
batch, restores it into a fresh checkpoint for changed code (another partition count,
another state store, a renamed operator, ...), runs the rest of the input, and compares
the output with a reference computed over all the input.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from streamkeeper.spec import StateBackendSpec
from streamkeeper.state.errors import OperatorUidError, StateSchemaError
from streamkeeper.state.export import export_canonical
from streamkeeper.state.format import OperatorState
from streamkeeper.state.positions import read_source_positions
from streamkeeper.state.restore import RestoreReport, restore_canonical
from streamkeeper.state.spark_state import session_conf, state_frame
from streamkeeper.storage import Location
from tests.integration.jobs import state_jobs
from tests.support.state import (
    Output,
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
    session = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session


class Savepoint:
    """An exported savepoint: the operators and positions a manifest would carry."""

    def __init__(self, location: Location, operators: list[OperatorState], source: dict):
        self.location = location
        self.operators = operators
        self.source = source

    def restore(self, spark: SparkSession, output: Any, checkpoint: Path, **kwargs: Any):
        options: dict[str, Any] = {
            "new_uids": None,
            "shuffle_partitions": 3,
            "state_backend": StateBackendSpec(type="hdfs"),
            **kwargs,
        }
        return restore_canonical(
            spark,
            savepoint_location=self.location,
            operators=self.operators,
            source_offsets=self.source["offsets"],
            source_log=self.source["log"],
            new_output=output,
            checkpoint_dir=checkpoint,
            **options,
        )


def take_savepoint(
    spark: SparkSession, checkpoint: Path, target: Location, uids: dict[int, str]
) -> Savepoint:
    batch = completed_batches(checkpoint)[-1]
    operators = export_canonical(spark, checkpoint, batch, uids, target)
    return Savepoint(target, operators, read_source_positions(checkpoint, batch).to_manifest())


def totals_of(output: Output) -> dict[str, tuple[int, int]]:
    return {key: (row["events"], row["total"]) for key, row in output.latest().items()}


@pytest.mark.parametrize(
    ("backend", "partitions"),
    [("hdfs", 3), ("hdfs", 7), ("rocksdb", 3), ("rocksdb", 7)],
)
def test_changed_code_on_another_partition_count_continues_exactly(
    spark: SparkSession, tmp_path: Path, backend: str, partitions: int
) -> None:
    events = tmp_path / "events"
    files = write_events(events, files=3, per_file=300)
    with state_store(spark, backend, 4):
        before = run_query(state_jobs.totals(stream(spark, events)), tmp_path / "old")
    savepoint = take_savepoint(spark, tmp_path / "old", Location(str(tmp_path / "sp")), {0: "t"})
    assert [op.rows for op in savepoint.operators] == [len(reference_totals(all_events(files)))]

    files += write_events(events, files=3, per_file=300, first_file=3)
    new_output = state_jobs.totals_with_mean(stream(spark, events))
    report = savepoint.restore(
        spark,
        new_output,
        tmp_path / "new",
        new_uids={0: "t"},
        shuffle_partitions=partitions,
        state_backend=StateBackendSpec(type=backend),
    )
    assert (report.partitions, report.operators[0].restored_from) == (partitions, "t")
    with state_store(spark, backend, 5):  # the checkpoint pins its own partition count
        after = run_query(new_output, tmp_path / "new")

    assert {row["_batch"] for row in after.rows} == {2, 3, 4}  # only the new files
    assert totals_of(before) | totals_of(after) == reference_totals(all_events(files))
    assert all(row["mean"] == row["total"] / row["events"] for row in after.rows)
    state = state_frame(spark, tmp_path / "new", 4, 0)
    misplaced = state.where(f"partition_id != pmod(hash(key), {partitions})").count()
    assert (misplaced, state.count()) == (0, 40)


@pytest.mark.parametrize(
    ("codec", "small", "hashed_by"),
    [
        ("lz4", False, "numpy"),
        ("lz4", False, "spark"),
        ("lz4", True, "numpy"),
        ("lz4", True, "spark"),
        ("zstd", False, "numpy"),
    ],
    ids=[
        "lz4-on-the-executors",
        "lz4-on-the-executors-partitioned-by-spark",
        "lz4-small-on-the-driver",
        "lz4-small-on-the-driver-partitioned-by-spark",
        "zstd-through-spark",
    ],
)
def test_the_restored_files_are_in_the_checkpoints_codec(
    spark: SparkSession,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    codec: str,
    small: bool,
    hashed_by: str,
) -> None:
    """lz4 (Spark's default): the tasks write each partition's file, partitioned in the
    same Python pass (murmur3.py) or, for a key type it does not hash, by Spark between
    two; the driver writes them for a small savepoint (partitioned there, no Spark job,
    or by Spark); any other codec goes through the driver and Spark's own codec. All
    continue exactly."""
    from streamkeeper.state import murmur3, restore, writers
    from streamkeeper.state.hdfs_files import decompress, parse_records

    # The savepoint below is small: the executors' path is taken with the limit at 0.
    monkeypatch.setattr(restore, "DRIVER_STATE_BYTES", writers.DRIVER_STATE_BYTES if small else 0)
    if hashed_by == "spark":
        monkeypatch.setattr(murmur3, "supports", lambda spark_type: False)
    through_driver, one_pass = [], []
    on_driver, convert_and_write = writers._write_hdfs_on_driver, writers._ConvertAndWrite
    monkeypatch.setattr(
        writers,
        "_write_hdfs_on_driver",
        lambda *args: through_driver.append(1) or on_driver(*args),
    )
    monkeypatch.setattr(
        writers, "_ConvertAndWrite", lambda *args: one_pass.append(1) or convert_and_write(*args)
    )
    framed, frame = [], writers.SavepointRows.frame
    monkeypatch.setattr(
        writers.SavepointRows, "frame", lambda *args: framed.append(1) or frame(*args)
    )
    warmed, warm = [], restore.warm_python_workers
    monkeypatch.setattr(restore, "warm_python_workers", lambda s: warmed.append(1) or warm(s))

    events = tmp_path / "events"
    files = write_events(events, files=3, per_file=200)
    with state_store(spark, "hdfs", 2):
        before = run_query(state_jobs.totals(stream(spark, events)), tmp_path / "old")
    savepoint = take_savepoint(spark, tmp_path / "old", Location(str(tmp_path / "sp")), {0: "t"})
    files += write_events(events, files=2, per_file=200, first_file=3)
    new_output = state_jobs.totals(stream(spark, events))
    codec_key = "spark.sql.streaming.stateStore.compression.codec"
    with session_conf(spark, {codec_key: codec}):
        savepoint.restore(spark, new_output, tmp_path / "new", new_uids={0: "t"})
    with state_store(spark, "hdfs", 5):
        after = run_query(new_output, tmp_path / "new")

    assert totals_of(before) | totals_of(after) == reference_totals(all_events(files))
    # Every partition's restored version holds its share of the savepoint's keys.
    restored = [tmp_path / "new" / "state" / "0" / str(p) / "2.delta" for p in range(3)]
    keys = [len(parse_records(decompress(f.read_bytes(), codec))[0]) for f in restored]
    assert sum(keys) == savepoint.operators[0].rows and all(keys), keys
    assert bool(through_driver) == (small or codec != "lz4")
    assert bool(one_pass) == (hashed_by == "numpy" and codec == "lz4" and not small)
    # A Spark job converts or partitions the rows only where numpy cannot do it alone.
    assert bool(framed) == (hashed_by == "spark" or codec != "lz4")
    assert bool(warmed) == (not small)  # the workers the tasks use, during the bootstrap
    # The tasks' pieces (a task per savepoint file, each with rows of every partition)
    # were joined and removed.
    assert len(list((tmp_path / "sp").rglob("part-*.parquet"))) == 2
    left = [f.name for f in (tmp_path / "new" / "state").rglob(".2.delta.*") if "crc" not in f.name]
    assert left == [], left


def test_a_bootstrap_prepared_before_the_savepoint_is_taken_by_the_restore(
    spark: SparkSession, tmp_path: Path
) -> None:
    """An upgrade's green bootstraps while blue runs; the restore then starts at step 3.
    A prepared bootstrap that does not fit (another partition count) is run again."""
    from streamkeeper.state.restore import prepare_bootstrap

    events = tmp_path / "events"
    files = write_events(events, files=3, per_file=200)
    new_output = state_jobs.totals_with_mean(stream(spark, events))
    hdfs = StateBackendSpec(type="hdfs")
    # Prepared before the savepoint exists, while the old job still runs.
    prepared = prepare_bootstrap(
        spark, new_output, tmp_path / "new", tmp_path / "new.up1.bootstrap",
        shuffle_partitions=3, state_backend=hdfs,
    )  # fmt: skip
    misfit = prepare_bootstrap(
        spark, new_output, tmp_path / "other", tmp_path / "other.up1.bootstrap",
        shuffle_partitions=5, state_backend=hdfs,
    )  # fmt: skip
    with state_store(spark, "hdfs", 4):
        before = run_query(state_jobs.totals(stream(spark, events)), tmp_path / "old")
    savepoint = take_savepoint(spark, tmp_path / "old", Location(str(tmp_path / "sp")), {0: "t"})
    files += write_events(events, files=2, per_file=200, first_file=3)

    def query_id(checkpoint: Path) -> str:
        return json.loads((checkpoint / "metadata").read_text())["id"]

    prepared_id = query_id(prepared.work / "checkpoint")
    misfit_id = query_id(misfit.work / "checkpoint")
    savepoint.restore(spark, new_output, tmp_path / "new", new_uids={0: "t"}, bootstrap=prepared)
    again = savepoint.restore(
        spark, new_output, tmp_path / "other", new_uids={0: "t"}, bootstrap=misfit
    )
    # Taken: the restored checkpoint is the prepared bootstrap's query; the misfit was
    # discarded and bootstrapped again (a new query, the restore's partition count).
    assert query_id(tmp_path / "new") == prepared_id
    assert query_id(tmp_path / "other") != misfit_id and again.partitions == 3
    assert not prepared.work.exists() and not misfit.work.exists()
    with state_store(spark, "hdfs", 5):
        after = run_query(new_output, tmp_path / "new")
    assert {row["_batch"] for row in after.rows} == {2, 3}  # only the new files
    assert totals_of(before) | totals_of(after) == reference_totals(all_events(files))


@pytest.mark.parametrize("backend", ["hdfs", "rocksdb"])
def test_deduplication_with_watermark_keeps_its_seen_events(
    spark: SparkSession, tmp_path: Path, backend: str
) -> None:
    events = tmp_path / "events"
    files = write_events(events, files=3, per_file=200, repeats=50)
    with state_store(spark, backend, 4):
        before = run_query(
            state_jobs.unique_events(stream(spark, events)), tmp_path / "old", mode="append"
        )
    savepoint = take_savepoint(spark, tmp_path / "old", Location(str(tmp_path / "sp")), {0: "d"})
    assert savepoint.source["offsets"]["next_watermark_ms"] > 0

    files += write_events(events, files=3, per_file=200, first_file=3, repeats=80)
    new_output = state_jobs.unique_events_tagged(stream(spark, events))
    savepoint.restore(
        spark,
        new_output,
        tmp_path / "new",
        new_uids={0: "d"},
        shuffle_partitions=3,
        state_backend=StateBackendSpec(type=backend),
        output_mode="append",
    )
    restored_commit = (tmp_path / "new" / "commits" / "1").read_text().splitlines()[1]
    assert (
        json.loads(restored_commit)["nextBatchWatermarkMs"]
        == (savepoint.source["offsets"]["next_watermark_ms"])
    )
    after = run_query(new_output, tmp_path / "new", mode="append")

    emitted = [row["event_id"] for row in before.rows + after.rows]
    assert sorted(emitted) == sorted({e["event_id"] for e in all_events(files)})
    assert {row["tag"] for row in after.rows} == {"v2"}


@pytest.mark.parametrize("backend", ["hdfs", "rocksdb"])
def test_two_operators_one_renamed_through_the_uid_mapping(
    spark: SparkSession, tmp_path: Path, backend: str
) -> None:
    events = tmp_path / "events"
    files = write_events(events, files=3, per_file=200, repeats=60)
    with state_store(spark, backend, 4):
        before = run_query(state_jobs.unique_totals(stream(spark, events)), tmp_path / "old")
    uids = {0: "totals", 1: "dedup"}  # Spark numbers operators from the sink down
    savepoint = take_savepoint(spark, tmp_path / "old", Location(str(tmp_path / "sp")), uids)
    assert [op.operator_name for op in savepoint.operators] == ["stateStoreSave", "dedupe"]

    files += write_events(events, files=3, per_file=200, first_file=3, repeats=120)
    new_output = state_jobs.unique_totals_by_upper_key(stream(spark, events))
    report = savepoint.restore(
        spark,
        new_output,
        tmp_path / "new",
        new_uids={0: "sums", 1: "dedup"},
        uid_mapping={"totals": "sums"},
        state_backend=StateBackendSpec(type=backend),
    )
    assert [(op.uid, op.restored_from) for op in report.operators] == [
        ("sums", "totals"),
        ("dedup", "dedup"),
    ]
    after = run_query(new_output, tmp_path / "new")

    expected = reference_totals(all_events(files), unique=True)
    assert totals_of(before) | totals_of(after) == expected
    assert all(row["key_upper"] == row["key"].upper() for row in after.rows)


def test_a_new_nullable_value_field_starts_null(spark: SparkSession, tmp_path: Path) -> None:
    events = tmp_path / "events"
    files = write_events(events, files=2, per_file=300)
    with state_store(spark, "rocksdb", 4):
        run_query(state_jobs.totals(stream(spark, events)), tmp_path / "old")
    savepoint = take_savepoint(spark, tmp_path / "old", Location(str(tmp_path / "sp")), {0: "t"})

    new_files = write_events(events, files=1, per_file=5, first_file=2)
    new_output = state_jobs.totals_with_max(stream(spark, events))
    report = savepoint.restore(
        spark,
        new_output,
        tmp_path / "new",
        new_uids={0: "t"},
        state_backend=StateBackendSpec(type="rocksdb"),
    )
    assert any("'max'" in w and "start with null" in w for w in report.warnings), report.warnings
    after = run_query(new_output, tmp_path / "new")

    totals = reference_totals(all_events(files + new_files))
    for key, row in after.latest().items():
        assert (row["events"], row["total"]) == totals[key]
        # max() saw only the events after the restore: the savepoint had no max.
        assert row["largest"] == max(e["value"] for e in all_events(new_files) if e["key"] == key)


def _restore_work_dirs(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if ".restore-" in p.name]


def test_an_incompatible_state_schema_fails_and_writes_nothing(
    spark: SparkSession, tmp_path: Path
) -> None:
    events = tmp_path / "events"
    write_events(events, files=2, per_file=100)
    with state_store(spark, "hdfs", 4):
        run_query(state_jobs.totals(stream(spark, events)), tmp_path / "old")
    savepoint = take_savepoint(
        spark, tmp_path / "old", Location(str(tmp_path / "sp")), {0: "totals"}
    )

    with pytest.raises(StateSchemaError) as failure:
        savepoint.restore(
            spark,
            state_jobs.totals_of_doubles(stream(spark, events)),
            tmp_path / "new",
            new_uids={0: "totals"},
        )
    message = str(failure.value)
    for part in ("'totals'", "'sum'", "bigint", "double", "state processor API"):
        assert part in message, message
    assert not (tmp_path / "new").exists()
    assert _restore_work_dirs(tmp_path) == []


def test_a_savepoint_uid_missing_from_the_new_job(spark: SparkSession, tmp_path: Path) -> None:
    events = tmp_path / "events"
    files = write_events(events, files=2, per_file=200, repeats=40)
    with state_store(spark, "rocksdb", 4):
        run_query(state_jobs.unique_totals(stream(spark, events)), tmp_path / "old")
    savepoint = take_savepoint(
        spark, tmp_path / "old", Location(str(tmp_path / "sp")), {0: "totals", 1: "dedup"}
    )
    new_output = state_jobs.only_dedup(stream(spark, events))
    options: dict[str, Any] = {
        "new_uids": {0: "dedup"},
        "state_backend": StateBackendSpec(type="rocksdb"),
    }

    with pytest.raises(OperatorUidError) as failure:
        savepoint.restore(spark, new_output, tmp_path / "new", **options)
    for part in ("'totals'", "uid_mapping", "allow_non_restored_state"):
        assert part in str(failure.value), str(failure.value)
    assert not (tmp_path / "new").exists()

    report = savepoint.restore(
        spark, new_output, tmp_path / "new", allow_non_restored_state=True, **options
    )
    assert report.not_restored == ["totals"]
    assert any("dropped" in w for w in report.warnings)
    new_files = write_events(events, files=1, per_file=100, first_file=2, repeats=60)
    after = run_query(new_output, tmp_path / "new", mode="append")
    old_ids = {e["event_id"] for e in all_events(files)}
    new_ids = {e["event_id"] for e in all_events(new_files)} - old_ids
    assert sorted(row["event_id"] for row in after.rows) == sorted(new_ids)


def test_a_new_uid_starts_empty_with_a_warning(spark: SparkSession, tmp_path: Path) -> None:
    events = tmp_path / "events"
    files = write_events(events, files=2, per_file=200)
    with state_store(spark, "hdfs", 4):
        before = run_query(state_jobs.totals(stream(spark, events)), tmp_path / "old")
    savepoint = take_savepoint(
        spark, tmp_path / "old", Location(str(tmp_path / "sp")), {0: "totals"}
    )

    files += write_events(events, files=2, per_file=200, first_file=2)
    new_output = state_jobs.unique_totals(stream(spark, events))
    report: RestoreReport = savepoint.restore(
        spark, new_output, tmp_path / "new", new_uids={0: "totals", 1: "dedup"}
    )
    assert [(op.uid, op.restored_from) for op in report.operators] == [
        ("totals", "totals"),
        ("dedup", None),
    ]
    assert any("'dedup'" in w and "starts empty" in w for w in report.warnings)
    after = run_query(new_output, tmp_path / "new")
    assert totals_of(before) | totals_of(after) == reference_totals(all_events(files))
