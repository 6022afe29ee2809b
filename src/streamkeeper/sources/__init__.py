"""Streaming sources a job spec can name. Each is replayable from checkpointed offsets."""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamkeeper.spec import SourceSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def build_source(spark: SparkSession, source: SourceSpec) -> DataFrame:
    """The source's streaming DataFrame."""
    if source.type == "nats":
        from streamkeeper.sources.nats import build_nats_source

        return build_nats_source(spark, source)
    if source.type == "delta":
        from streamkeeper.sources.delta import build_delta_source

        return build_delta_source(spark, source)
    from streamkeeper.sources.file import build_file_source

    return build_file_source(spark, source)
