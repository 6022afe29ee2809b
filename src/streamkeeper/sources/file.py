"""Spark's built-in file and rate sources."""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamkeeper.errors import SpecError
from streamkeeper.spec import SourceSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def build_file_source(spark: SparkSession, source: SourceSpec) -> DataFrame:
    """Spark's file source over `source.path` (or the rate source)."""
    if source.type == "rate":
        return spark.readStream.format("rate").options(**source.options).load()
    reader = spark.readStream.format(source.format).options(**source.options)
    try:
        reader = reader.schema(source.schema_ddl or "")
    except Exception as error:  # noqa: BLE001 - Spark's parse errors are verbose
        raise SpecError(
            f"source.schema {source.schema_ddl!r} is not a valid DDL schema ({error}); "
            "expected e.g. 'key STRING, value BIGINT'"
        ) from None
    return reader.load(source.path)
