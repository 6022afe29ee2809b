"""Bootstrap: let Spark lay out a fresh checkpoint for the new code, over an empty input.

The new job's output stream is planned as it will run, with each of its sources
swapped for a file source over one empty file (same columns, same attribute ids, so
everything above the sources is unchanged). One batch over it writes what only Spark
knows how to write for this plan and this partition count: `metadata`, `offsets/0`
(with the confs the query is pinned to), the stateful operators' metadata and state
schemas, and an empty state version 1 in every partition. The restore then adds the
savepoint's state as version 2 and the source positions as batch 1.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamkeeper.errors import CheckpointRestoreError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# Leaves of a streaming plan that read a source (v1, v2, and 4.x's named wrapper).
_SOURCE_LEAVES = ("StreamingRelation", "StreamingRelationV2", "NamedStreamingRelation")


def empty_input_twin(
    spark: SparkSession, output: DataFrame, work_dir: Path
) -> tuple[DataFrame, list[str]]:
    """`output` with every streaming source replaced by an empty file source.

    Returns:
        The twin, and each replaced source's kind in plan order: "file" (Spark's file
        source) or "other".

    Raises:
        CheckpointRestoreError: `output` is not a streaming DataFrame.
    """
    from pyspark.sql import DataFrame

    if not output.isStreaming:
        raise CheckpointRestoreError(
            "the new job's output is not a streaming DataFrame; pass the output stream "
            "built from the new code (runtime.job.build_output)"
        )
    empty = work_dir / f"empty-input-{uuid.uuid4().hex[:8]}"
    empty.mkdir(parents=True)
    (empty / "empty.json").write_text("")
    plan = output._jdf.queryExecution().analyzed()  # the JVM plan
    kinds: list[str] = []
    swapped = _swap_sources(spark, plan, str(empty), kinds)
    jvm = spark._jvm
    dataset = jvm.org.apache.spark.sql.classic.Dataset.ofRows(
        spark._jsparkSession,
        swapped,
    )
    return DataFrame(dataset, spark), kinds


def _swap_sources(spark: SparkSession, plan: Any, empty_dir: str, kinds: list[str]) -> Any:
    """Replace the source leaves in plan order (the order of a checkpoint's sources)."""
    if plan.getClass().getSimpleName() in _SOURCE_LEAVES:
        kinds.append(_source_kind(plan))
        return _empty_source(spark, plan, empty_dir)
    children = plan.children()
    if children.size() == 0:
        return plan
    swapped = [
        _swap_sources(spark, children.apply(i), empty_dir, kinds) for i in range(children.size())
    ]
    jvm = spark._jvm
    return plan.withNewChildren(jvm.scala.jdk.javaapi.CollectionConverters.asScala(swapped).toSeq())


def _source_kind(leaf: Any) -> str:
    if leaf.getClass().getSimpleName() == "NamedStreamingRelation":
        leaf = leaf.child()
    is_file = leaf.getClass().getSimpleName() == "StreamingRelation" and str(
        leaf.sourceName()
    ).startswith("FileSource[")
    return "file" if is_file else "other"


def _empty_source(spark: SparkSession, leaf: Any, empty_dir: str) -> Any:
    """A file source over `empty_dir` that outputs `leaf`'s very attributes."""
    from pyspark.sql.types import StructType

    schema = StructType.fromJson(json.loads(leaf.schema().json()))
    twin = spark.readStream.schema(schema).json(empty_dir)
    relation = twin._jdf.queryExecution().analyzed()
    if relation.getClass().getSimpleName() == "NamedStreamingRelation":
        relation = relation.child()
    return relation.copy(
        relation.dataSource(),
        relation.sourceName(),
        leaf.output(),
        relation.sourceIdentifyingName(),
    )


def run_bootstrap(
    spark: SparkSession, output: DataFrame, checkpoint_dir: Path, output_mode: str, work_dir: Path
) -> list[str]:
    """Run batch 0 of `output`'s empty twin into `checkpoint_dir`, then stop.

    The session's confs (state store, shuffle partitions) are the ones Spark pins into
    the checkpoint; the caller sets them. The empty input goes below `work_dir`.

    Returns:
        The kind of each of the job's sources ("file" or "other"), in checkpoint order.

    Raises:
        CheckpointRestoreError: the bootstrap batch failed (with Spark's first line).
    """
    from pyspark.errors import PySparkException

    twin, kinds = empty_input_twin(spark, output, work_dir)
    try:
        query = (
            twin.writeStream.format("noop")
            .queryName(f"streamkeeper-restore-{uuid.uuid4().hex[:8]}")
            .outputMode(output_mode)
            .option("checkpointLocation", str(checkpoint_dir))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    except PySparkException as error:
        first = str(error).strip().splitlines()[0]
        raise CheckpointRestoreError(
            f"the new job's query cannot start over an empty input ({first}); check that the "
            f"new code runs in output mode {output_mode!r}"
        ) from None
    if not (checkpoint_dir / "commits" / "0").exists():
        raise CheckpointRestoreError(
            f"the bootstrap batch did not complete in {str(checkpoint_dir)!r}; see the Spark log"
        )
    return kinds
