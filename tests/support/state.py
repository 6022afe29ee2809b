"""Helpers of the canonical savepoint tests: event files with repeats, queries run in-process.

Queries run directly on Spark (not the runner) with a foreachBatch sink that keeps
every row, so a test can compare the output of a job cut by a savepoint with the
reference over all input.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from jobs.keyed_totals.sample_events import read_events
from streamkeeper.runtime.session import HDFS_PROVIDER, ROCKSDB_PROVIDER
from streamkeeper.state.spark_state import session_conf

EVENT_SCHEMA = "event_id BIGINT, key STRING, value BIGINT"
Transform = Callable[[DataFrame], DataFrame]


def write_events(
    directory: Path, *, files: int, per_file: int, first_file: int = 0, repeats: int = 0
) -> list[Path]:
    """Event files in batch order; each file also repeats `repeats` earlier events."""
    directory.mkdir(parents=True, exist_ok=True)
    earlier = [e for p in sorted(directory.glob("events-*.json")) for e in read_events(p)]
    paths = []
    for index in range(first_file, first_file + files):
        rng = random.Random(index)
        fresh = [
            {"event_id": index * per_file + n, "key": f"k{rng.randrange(40):03d}", "value": n % 97}
            for n in range(per_file)
        ]
        repeated = rng.sample(earlier, min(repeats, len(earlier)))
        path = directory / f"events-{index:05d}.json"
        temp = directory / f".events-{index:05d}.json.tmp"
        temp.write_text("".join(json.dumps(e) + "\n" for e in repeated + fresh))
        stamp = 1_700_000_000 + index * 10  # one file per batch, in order
        os.utime(temp, (stamp, stamp))
        os.replace(temp, path)
        earlier.extend(fresh)
        paths.append(path)
    return paths


def all_events(paths: list[Path]) -> list[dict[str, Any]]:
    return [event for path in paths for event in read_events(path)]


def reference_totals(events: list[dict[str, Any]], *, unique: bool = False) -> dict[str, tuple]:
    """(count, sum) per key over the events (each event id once if `unique`)."""
    seen, totals = set(), {}
    for event in events:
        if unique and event["event_id"] in seen:
            continue
        seen.add(event["event_id"])
        count, total = totals.get(event["key"], (0, 0))
        totals[event["key"]] = (count + 1, total + event["value"])
    return totals


@dataclass
class Output:
    """Every row a query emitted, with its batch id."""

    rows: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        self.rows.extend({**row.asDict(), "_batch": batch_id} for row in frame.collect())

    def latest(self, key: str = "key") -> dict[Any, dict[str, Any]]:
        """The last row emitted per key (update mode: the current value)."""
        latest = {}
        for row in sorted(self.rows, key=lambda r: r["_batch"]):
            latest[row[key]] = row
        return latest


def stream(spark: SparkSession, events: Path) -> DataFrame:
    return spark.readStream.schema(EVENT_SCHEMA).option("maxFilesPerTrigger", 1).json(str(events))


def run_query(
    output: DataFrame, checkpoint: Path, *, mode: str = "update", sink: Output | None = None
) -> Output:
    """Run a query until its input is processed; returns what it emitted."""
    sink = sink or Output()
    query = (
        output.writeStream.foreachBatch(sink)
        .outputMode(mode)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return sink


@contextmanager
def state_store(spark: SparkSession, backend: str, partitions: int) -> Iterator[None]:
    """The session's state store and partition count for the queries of a block."""
    provider = ROCKSDB_PROVIDER if backend == "rocksdb" else HDFS_PROVIDER
    with session_conf(
        spark,
        {
            "spark.sql.streaming.stateStore.providerClass": provider,
            "spark.sql.shuffle.partitions": str(partitions),
        },
    ):
        yield


def completed_batches(checkpoint: Path) -> list[int]:
    return sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())


def write_manifest(
    spark: SparkSession, folder: Any, operators: list, checkpoint: Path, batch: int
) -> Any:
    """A minimal canonical manifest for an exported savepoint (the lifecycle writes its own)."""
    import time

    from streamkeeper.state.format import CanonicalManifest, write_canonical_manifest
    from streamkeeper.state.positions import read_source_positions

    manifest = CanonicalManifest(
        id=f"sp-{batch}",
        job="test",
        lineage="test",
        batch_id=batch,
        checkpoint_id=batch,
        operators=operators,
        source=read_source_positions(checkpoint, batch).to_manifest(),
        sink_seqs={},
        spark_version=spark.version,
        created_at=time.time(),
    )
    write_canonical_manifest(folder, manifest)
    return manifest
