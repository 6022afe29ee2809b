"""A job resolved and validated: where its things live, and its output, checked whole.

Everything here is read-only: a spec that cannot run is refused before the runner takes
an epoch, beats, creates a table or deletes anything.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamkeeper.commit.batch import check_sink_columns
from streamkeeper.commit.tables import TableTarget, check_table, check_table_ownership
from streamkeeper.errors import SpecError
from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.sources import build_source
from streamkeeper.spec import JobSpec
from streamkeeper.storage import Location, S3Settings, resolve_root

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


@dataclass(frozen=True)
class JobPaths:
    """Resolved locations of one job."""

    root: Location
    layout: LineageLayout
    checkpoint_dir: Path
    targets: dict[str, TableTarget]

    @property
    def history(self) -> Location:
        """The lineage's checkpoint history table."""
        return self.root.child(f"{self.layout.base}/history")


def resolve_paths(spec: JobSpec) -> JobPaths:
    """Resolve the storage root, checkpoint directory and every sink's table."""
    root = Location(resolve_root(spec.storage.root), S3Settings.from_env(spec.storage))
    layout = LineageLayout(root, spec.lineage_id, spec.name)
    checkpoint = Path(spec.checkpoint.dir or f".streamkeeper/checkpoints/{spec.lineage_id}")
    targets = {
        sink.name: TableTarget(
            sink=sink.name,
            location=root.child(sink.table_path),
            data_app_id=layout.data_app_id(sink.name),
            fence_app_id=layout.fence_app_id(),
        )
        for sink in spec.sinks
    }
    return JobPaths(root, layout, checkpoint.resolve(), targets)


def load_transform(spec: JobSpec, spec_dir: Path) -> Callable[[DataFrame], DataFrame]:
    """Import `module:function` or `file.py:function` (relative to the spec's folder)."""
    module_ref, function_name = spec.transform.split(":")
    try:
        if module_ref.endswith(".py"):
            path = (spec_dir / module_ref).resolve()
            module_spec = importlib.util.spec_from_file_location(f"_sk_{spec.name}", path)
            if module_spec is None or module_spec.loader is None or not path.is_file():
                raise FileNotFoundError(path)
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_ref)
        return getattr(module, function_name)
    except (ImportError, FileNotFoundError, AttributeError) as error:
        raise SpecError(
            f"transform {spec.transform!r} cannot be loaded ({type(error).__name__}: {error}); "
            "expected 'package.module:function' or 'file.py:function' next to the spec"
        ) from None


def sink_arrow_schema(output: DataFrame, columns: list[str]) -> Any:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(output.select(*columns).schema)


def _first_line(error: Exception) -> str:
    """Spark's analysis errors run to pages; their first line names the problem."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def check_where_predicates(spec: JobSpec, output: DataFrame) -> None:
    """Each sink's `where` must be a boolean SQL predicate over the output's columns."""
    from pyspark.errors import AnalysisException, ParseException
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType

    for sink in spec.sinks:
        if not sink.where:
            continue
        try:
            field = output.select(F.expr(sink.where).alias("where")).schema["where"]
        except (AnalysisException, ParseException) as error:
            first = _first_line(error)
            raise SpecError(
                f"sink {sink.name!r}: where {sink.where!r} is not a valid predicate over the "
                f"output columns {output.columns} ({first}); fix the expression"
            ) from None
        if not isinstance(field.dataType, BooleanType):
            raise SpecError(
                f"sink {sink.name!r}: where {sink.where!r} is of type "
                f"{field.dataType.simpleString()}, not boolean; write a condition, e.g. "
                "'amount > 0'"
            )


def build_output(spark: SparkSession, spec: JobSpec, spec_dir: Path) -> DataFrame:
    """The job's output stream, with every sink's columns and predicates checked."""
    from pyspark.errors import AnalysisException

    transform = load_transform(spec, spec_dir)
    try:
        source = build_source(spark, spec.source)
    except AnalysisException as error:
        first = _first_line(error)
        raise SpecError(
            f"source of job {spec.name!r} cannot be read ({first}); check source "
            f"{spec.source.path or spec.source.table or spec.source.url!r} exists"
        ) from None
    try:
        output = transform(source)
    except AnalysisException as error:
        first = _first_line(error)
        raise SpecError(
            f"transform {spec.transform!r} does not fit the source's columns "
            f"{source.columns} ({first}); fix the transformation or source.schema"
        ) from None
    check_sink_columns(spec, list(output.columns))
    check_where_predicates(spec, output)
    return output


def check_tables(spec: JobSpec, paths: JobPaths, output: DataFrame) -> dict[str, Any]:
    """Check every existing target table (schema, other writers); returns the schemas.

    Raises:
        SchemaMismatchError, SpecError: naming the table and the fix; nothing is written.
    """
    schemas = {}
    for sink in spec.sinks:
        target = paths.targets[sink.name]
        schemas[sink.name] = sink_arrow_schema(output, list(sink.columns or output.columns))
        if check_table(target, schemas[sink.name]):
            check_table_ownership(target, spec.name, sink.shared)
    return schemas
