"""Downstream streams of a streamkeeper table across an upgrade and its rollback, on Spark.

The producer lineage is written by the real commit path (`tests/support/producer.py`),
its rollback is the real `restore_tables`, and the downstream is this project's Delta
source built as a job builds it (`build_delta_source`), run by a real local Spark session
with a checkpoint, Trigger.AvailableNow and a foreachBatch that keeps each batch's rows
by batch id (a replayed batch replaces itself). What the downstream read is compared
with the rows each side produced. docs/downstream-readers.md names these tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streamkeeper.client import StreamkeeperClient
from streamkeeper.errors import SpecError
from streamkeeper.sources.delta import build_delta_source
from streamkeeper.spec import SourceSpec
from streamkeeper.upgrade.rollback import restore_tables
from tests.support.producer import Producer, Row

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def blue(values: range) -> list[Row]:
    return [(f"k{v % 3}", v, "blue") for v in values]


def green(values: range) -> list[Row]:
    return [(f"k{v % 3}", v * 10, "green") for v in values]  # green computes differently


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[1]")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .getOrCreate()
    )
    yield session
    session.stop()


class Downstream:
    """A downstream query over the producer's table; its rows by batch id."""

    def __init__(self, spark: Any, producer: Producer, checkpoint: Path) -> None:
        self.spark, self.producer, self.checkpoint = spark, producer, checkpoint
        self.batches: dict[int, list[Row]] = {}

    def run(self, **options: str) -> list[Row]:
        """Every batch there is now (AvailableNow); returns the rows of the new batches."""
        before = set(self.batches)
        source = SourceSpec(type="delta", table=self.producer.table, options=options)

        def keep(frame: Any, batch_id: int) -> None:
            self.batches[batch_id] = [(r.key, r.value, r.version) for r in frame.collect()]

        query = (
            build_delta_source(self.spark, source)
            .writeStream.foreachBatch(keep)
            .option("checkpointLocation", str(self.checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        return sorted(row for b in sorted(set(self.batches) - before) for row in self.batches[b])

    @property
    def rows(self) -> list[Row]:
        return sorted(row for rows in self.batches.values() for row in rows)


def test_a_stream_on_the_stable_point_sees_blue_only_and_once_across_a_rollback(
    spark: Any, tmp_path: Path
) -> None:
    producer = Producer(tmp_path / "data")
    producer.start()
    for first in range(0, 6, 2):
        producer.commit(blue(range(first, first + 2)))
    record, s1 = producer.hand_over()
    producer.start()  # green goes live, on probation
    producer.commit(green(range(6, 8)))
    producer.commit(green(range(8, 10)))

    follow = {"stablePointOf": producer.job, "stablePointRoot": producer.location.uri}
    stable = Downstream(spark, producer, tmp_path / "stable")
    plain = Downstream(spark, producer, tmp_path / "plain")  # the option off
    assert stable.run(maxFilesPerTrigger="1", **follow) == sorted(blue(range(6)))
    assert plain.run() == sorted(blue(range(6)) + green(range(6, 10)))  # green's, on probation

    restored = producer.roll_back(record, s1)  # probation failed: the real RESTORE to S1
    assert stable.run(maxFilesPerTrigger="1", **follow) == []  # held at S1
    producer.restart_from(s1)
    producer.commit(blue(range(6, 8)))  # blue processes green's input again
    producer.finish(record, "rolled_back")
    producer.commit(blue(range(8, 12)))
    assert stable.run(maxFilesPerTrigger="1", **follow) == sorted(blue(range(6, 12)))
    assert stable.rows == sorted(blue(range(12))), "the downstream is not exactly blue's output"
    assert len(stable.batches) >= 4  # one commit per batch: the look-ahead was exercised

    with pytest.raises(Exception, match="RestoredBelowReadError") as caught:
        plain.run()
    version = restored["tables"][producer.sink]["now"]
    target = s1.tables[producer.sink].version
    assert f"restored at version {version} to version {target}" in str(caught.value)
    assert "acceptRestores: true" in str(caught.value)


def test_an_on_demand_rollback_below_what_a_stream_read_stops_it_until_accepted(
    spark: Any, tmp_path: Path
) -> None:
    producer = Producer(tmp_path / "data")
    producer.start()
    producer.commit(blue(range(0, 4)))
    savepoint = producer.savepoint()
    producer.commit(blue(range(4, 6)))  # retracted on purpose below
    follow = {"stablePointOf": producer.job, "stablePointRoot": producer.location.uri}
    stream = Downstream(spark, producer, tmp_path / "stream")
    assert stream.run(**follow) == sorted(blue(range(6)))  # no upgrade: the head is stable

    restored = restore_tables(StreamkeeperClient(producer.location.uri), producer.job, savepoint)
    producer.restart_from(savepoint)
    producer.commit(blue(range(4, 8)))  # the restart reprocesses 4..5, then goes on
    with pytest.raises(Exception, match="RestoredBelowReadError") as caught:
        stream.run(**follow)
    message = str(caught.value)
    version = restored.tables[producer.sink]["now"]
    assert f"{producer.table!r} was restored at version {version}" in message
    assert "Roll this job back too" in message

    # Accepted explicitly: what it read stays read, the restart's output follows (4..5 twice).
    assert stream.run(acceptRestores="true", **follow) == sorted(blue(range(4, 8)))
    assert stream.rows == sorted(blue(range(6)) + blue(range(4, 8)))


def test_a_stable_point_option_naming_no_writer_of_the_table_fails_before_spark(
    tmp_path: Path,
) -> None:
    producer = Producer(tmp_path / "data")
    producer.start()
    producer.commit(blue(range(2)))
    root = producer.location.uri
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    cases = {
        "nope": (producer.table, r"stablePointOf='nope'.*no job 'nope'.*jobs there: orders"),
        "orders": (str(tmp_path / "other"), r"is not one of job 'orders'.*events: "),
    }
    for job, (table, match) in cases.items():
        if table != producer.table:
            Path(table).mkdir()
        source = SourceSpec(
            type="delta", table=table, options={"stablePointOf": job, "stablePointRoot": root}
        )
        with pytest.raises(SpecError, match=match):
            build_delta_source(None, source)  # type: ignore[arg-type] - never reached
    after = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert [p for p in after if p not in before] == [Path("other")]  # the test's own folder


@pytest.mark.s3
def test_a_restore_is_found_in_a_log_on_s3(s3_root: str) -> None:
    """The stable view and the planner probe the log past its end: S3 says 'no such key'."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    from streamkeeper.sources.delta_log import read_commit_if_any
    from streamkeeper.storage import Location, S3Settings

    location = Location(f"{s3_root}/tables/events", S3Settings.from_env())
    options = location.storage_options()
    for value in range(3):
        write_deltalake(
            location.uri, pa.table({"v": [value]}), mode="append", storage_options=options
        )
    DeltaTable(location.uri, storage_options=options).restore(0)
    restore = read_commit_if_any(location, 3)
    assert restore is not None and (restore.is_restore, restore.restored_to) == (True, 0)
    assert read_commit_if_any(location, 4) is None
