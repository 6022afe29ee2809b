"""A Delta table as a replayable source: offsets are table versions.

Batch (start, end] holds the rows that commits start+1..end appended. The planner walks
those versions' snapshots (delta-rs, no delta-spark) and keeps the files each commit
added; tasks read exactly those Parquet files. Versions are immutable, so a replay of a
batch reads the same files. A commit that removed files (DELETE, UPDATE, MERGE,
overwrite) has no append-only meaning: the stream stops and names its version, unless
`skipChangeCommits` is set. OPTIMIZE only rewrites rows already read and is skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)

from streamkeeper.errors import SourceError, SpecError
from streamkeeper.sources.offsets import parse_int_offset
from streamkeeper.spec import SourceSpec
from streamkeeper.storage import Location, S3Settings, resolve_root

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

FORMAT = "streamkeeper_delta"
USER_OPTIONS = ("maxFilesPerTrigger", "startingVersion", "skipChangeCommits")
# Commits that only rearrange rows already in the table (dataChange=false).
REARRANGING_OPERATIONS = frozenset({"OPTIMIZE"})
PARTITION_BYTES = 128 * 1024 * 1024  # files per Spark task, by size
# Storage settings travel as options; Spark redacts keys matching secret|access.?key.
_S3_KEYS = ("s3.endpoint", "s3.region", "s3.allowHttp", "s3.accessKey", "s3.secretKey")


class NotAppendOnlyError(SourceError):
    """A commit in a batch's range removed files: its rows are not appends."""

    def __init__(self, table: str, version: int, operation: str | None, removed: int) -> None:
        self.version = version
        super().__init__(
            f"Delta table {table!r} is not append-only: version {version} "
            f"({operation or 'unknown operation'}) removed {removed} file(s), so it cannot be "
            "streamed as appends. Stream an append-only table, set "
            "source.options.skipChangeCommits: true to skip such commits (their changes are "
            "not streamed), or start a new checkpoint with "
            f"source.options.startingVersion: {version + 1}"
        )


@dataclass(frozen=True)
class DeltaConfig:
    """Everything a reader needs; plain values, so readers pickle to executors."""

    location: Location
    max_files: int | None = None  # maxFilesPerTrigger (whole commits; at least one)
    starting_version: int | None = None  # first version to stream; default 0
    skip_change_commits: bool = False

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> DeltaConfig:
        """Parse the data source options (case-insensitive).

        Raises:
            SpecError: naming an unknown or malformed option.
        """
        given = {key.lower(): value for key, value in options.items()}
        internal = {"table", *(key.lower() for key in _S3_KEYS)}
        valid = internal | {name.lower() for name in USER_OPTIONS}
        unknown = sorted(key for key in options if key.lower() not in valid)
        if unknown:
            raise SpecError(
                f"unknown Delta source option(s) {unknown} in source.options; "
                f"valid options are {list(USER_OPTIONS)}"
            )
        if not given.get("table"):
            raise SpecError("a Delta source needs source.table, e.g. s3://bucket/tables/events")
        s3 = None
        if given.get("s3.region"):
            s3 = S3Settings(
                endpoint_url=given.get("s3.endpoint") or None,
                region=given["s3.region"],
                access_key=given.get("s3.accesskey") or None,
                secret_key=given.get("s3.secretkey") or None,
                allow_http=given.get("s3.allowhttp") == "true",
            )
        starting = _int_option(given, "startingVersion", minimum=0)
        return cls(
            location=Location(given["table"], s3),
            max_files=_int_option(given, "maxFilesPerTrigger", minimum=1),
            starting_version=starting,
            skip_change_commits=_bool_option(given, "skipChangeCommits"),
        )


def location_options(location: Location) -> dict[str, str]:
    """The data source options that carry `location` (the table and its S3 settings)."""
    options = {"table": location.uri}
    s3 = location.s3
    if location.is_s3 and s3 is not None:
        options |= {"s3.region": s3.region, "s3.allowHttp": str(s3.allow_http).lower()}
        for key, value in (
            ("s3.endpoint", s3.endpoint_url),
            ("s3.accessKey", s3.access_key),
            ("s3.secretKey", s3.secret_key),
        ):
            if value:
                options[key] = value
    return options


def _int_option(given: Mapping[str, str], name: str, *, minimum: int) -> int | None:
    raw = given.get(name.lower())
    if raw is None:
        return None
    if not raw.strip().isdigit() or int(raw) < minimum:
        raise SpecError(
            f"source option {name}={raw!r} must be an integer >= {minimum}, e.g. {name}: 10"
        )
    return int(raw)


def _bool_option(given: Mapping[str, str], name: str) -> bool:
    raw = given.get(name.lower(), "false").strip().lower()
    if raw not in ("true", "false"):
        raise SpecError(f"source option {name}={raw!r} must be true or false")
    return raw == "true"


# -- offsets, commits and admission (pure) ---------------------------------------------


def version_offset(version: int) -> dict[str, int]:
    """The offset JSON Spark checkpoints: the last table version a batch covers."""
    return {"version": version}


def parse_version(offset: Mapping[str, Any]) -> int:
    """The version in an offset (-1: before the first commit).

    Raises:
        SourceError: the offset is not a Delta offset (the checkpoint belongs to another source).
    """
    return parse_int_offset(offset, "version", -1, "Delta")


@dataclass(frozen=True)
class DataFile:
    """One Parquet file a commit added."""

    uri: str
    size: int
    partition_values: tuple[tuple[str, Any], ...] = ()


def appended_files(
    table: str,
    version: int,
    before: Mapping[str, DataFile],
    after: Mapping[str, DataFile],
    operation_of: Callable[[int], str | None],
    *,
    skip_change_commits: bool = False,
) -> list[DataFile]:
    """The files commit `version` appended, given the snapshots before and after it.

    Raises:
        NotAppendOnlyError: the commit removed files and is neither a rearrangement
            (OPTIMIZE) nor skipped by `skip_change_commits`.
    """
    removed = before.keys() - after.keys()
    added = [after[path] for path in sorted(after.keys() - before.keys())]
    if not removed:
        return added
    operation = operation_of(version)  # only asked on this rare path: it reads history
    if operation in REARRANGING_OPERATIONS or skip_change_commits:
        return []
    raise NotAppendOnlyError(table, version, operation, len(removed))


def admit(start: int, cap: int, max_files: int | None, counts: Iterator[tuple[int, int]]) -> int:
    """The next batch's end version: `cap`, or earlier once `max_files` files are admitted.

    Args:
        start: the batch's start (exclusive).
        cap: the latest version it may reach.
        max_files: files per batch; whole commits, at least one.
        counts: (version, files appended) for start+1..cap, in order, consumed lazily.
    """
    if cap <= start or max_files is None:
        return max(start, cap)
    total = 0
    for version, count in counts:
        total += count
        if total >= max_files:
            return version
    return cap


def group_files(files: list[DataFile], target_bytes: int) -> list[tuple[DataFile, ...]]:
    """Consecutive groups of about `target_bytes`, one per Spark task (order kept)."""
    groups: list[tuple[DataFile, ...]] = []
    current: list[DataFile] = []
    size = 0
    for file in files:
        if current and size + file.size > target_bytes:
            groups.append(tuple(current))
            current, size = [], 0
        current.append(file)
        size += file.size
    if current:
        groups.append(tuple(current))
    return groups


def conform(
    batch: pa.RecordBatch, schema: pa.Schema, partition_values: Mapping[str, Any]
) -> pa.RecordBatch:
    """`batch` in exactly `schema`: partition columns filled in, missing columns null."""
    import pyarrow as pa

    rows = batch.num_rows
    arrays = []
    for field in schema:
        if field.name in batch.schema.names:
            arrays.append(batch.column(field.name).cast(field.type))
        elif partition_values.get(field.name) is not None:
            value = pa.array([partition_values[field.name]]).cast(field.type)[0]
            arrays.append(pa.repeat(value, rows))
        else:  # a column added after this file was written, or a null partition value
            arrays.append(pa.nulls(rows, field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


# -- the table through delta-rs (driver side) ------------------------------------------


def open_table(location: Location, version: int | None = None) -> DeltaTable:
    """The table (at `version` if given).

    Raises:
        SourceError: it is not a Delta table, or the version cannot be loaded.
    """
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError, TableNotFoundError

    try:
        return DeltaTable(location.uri, version=version, storage_options=location.storage_options())
    except TableNotFoundError as error:
        raise SourceError(
            f"source.table {location.uri!r} is not a Delta table ({_first_line(error)}); "
            "create it first or fix source.table"
        ) from None
    except DeltaError as error:
        raise SourceError(
            f"cannot load version {version} of Delta table {location.uri!r} "
            f"({_first_line(error)}); if its log was cleaned up, start a new checkpoint "
            "with a later source.options.startingVersion"
        ) from None


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def table_schema(location: Location) -> StructType:
    """The table's schema as Spark's.

    Raises:
        SourceError: the table uses column mapping (physical names differ from the schema's).
    """
    import pyarrow as pa
    from pyspark.sql.pandas.types import from_arrow_schema

    table = open_table(location)
    mode = table.metadata().configuration.get("delta.columnMapping.mode", "none")
    if mode != "none":
        raise SourceError(
            f"Delta table {location.uri!r} uses column mapping mode {mode!r}, which this source "
            "cannot read; stream a table without column mapping"
        )
    return from_arrow_schema(pa.schema(table.schema().to_arrow()), prefer_timestamp_ntz=True)


def snapshot_files(table: DeltaTable, root: str) -> dict[str, DataFile]:
    """The snapshot's files by their log path."""
    import pyarrow as pa

    actions = pa.table(table.get_add_actions(flatten=True))
    partitions = [name for name in actions.column_names if name.startswith("partition.")]
    columns = actions.select(["path", "size_bytes", *partitions]).to_pydict()  # skip stats
    files = {}
    for row, path in enumerate(columns["path"]):
        values = tuple((name.removeprefix("partition."), columns[name][row]) for name in partitions)
        files[path] = DataFile(_file_uri(root, path), columns["size_bytes"][row], values)
    return files


def _file_uri(root: str, path: str) -> str:
    decoded = unquote(path)  # log paths are URL-encoded; storage keys are not
    if "://" in decoded or decoded.startswith("/"):
        return decoded
    return root.rstrip("/") + "/" + decoded


def walk(config: DeltaConfig, start: int, end: int) -> Iterator[tuple[int, list[DataFile]]]:
    """Each version in (start, end] with the files it appended, in version order."""
    if end <= start:
        return
    location, first = config.location, max(start, -1) + 1
    table = open_table(location, max(start, 0))
    before = {} if start < 0 else snapshot_files(table, location.uri)

    def operation_of(version: int) -> str | None:
        latest = open_table(location)
        for entry in latest.history(limit=latest.version() - version + 1):
            if entry.get("version") == version:
                return entry.get("operation")
        return None

    for version in range(first, end + 1):
        if table.version() != version:
            table.load_as_version(version)  # moves forward through the log incrementally
        after = snapshot_files(table, location.uri)
        yield (
            version,
            appended_files(
                location.uri,
                version,
                before,
                after,
                operation_of,
                skip_change_commits=config.skip_change_commits,
            ),
        )
        before = after


# -- the Spark data source -------------------------------------------------------------


class DeltaPartition(InputPartition):
    """The files one task reads."""

    def __init__(self, files: tuple[DataFile, ...]) -> None:
        super().__init__(files)
        self.files = files


class DeltaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans batches on the driver (delta-rs) and reads Parquet on executors (pyarrow)."""

    def __init__(self, config: DeltaConfig, schema: StructType) -> None:
        self.config = config
        self.schema = schema
        self.target: int | None = None  # Trigger.AvailableNow stops here

    def initialOffset(self) -> dict:
        return version_offset((self.config.starting_version or 0) - 1)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.config.max_files:
            return ReadMaxFiles(self.config.max_files)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = open_table(self.config.location).version()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = parse_version(start)
        latest = open_table(self.config.location).version()
        cap = latest if self.target is None else min(latest, self.target)
        max_files = limit.max_files if isinstance(limit, ReadMaxFiles) else None
        counts = ((v, len(files)) for v, files in walk(self.config, begin, cap))
        return version_offset(admit(begin, cap, max_files, counts))

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        added = walk(self.config, parse_version(start), parse_version(end))
        files = [file for _, appended in added for file in appended]
        return [DeltaPartition(group) for group in group_files(files, PARTITION_BYTES)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        import pyarrow.parquet as pq
        from pyspark.sql.pandas.types import to_arrow_schema

        assert isinstance(partition, DeltaPartition)
        # Spark checks batches against exactly this Arrow form of the schema.
        schema = to_arrow_schema(self.schema, timezone="UTC")
        filesystem = self.config.location.arrow_filesystem()
        for file in partition.files:
            path = Location(file.uri).fs_path
            with filesystem.open_input_file(path) as handle:
                parquet = pq.ParquetFile(handle)
                columns = [n for n in schema.names if n in parquet.schema_arrow.names]
                values = dict(file.partition_values)
                # use_threads=False: Python workers are one task each; no pool to leak.
                for batch in parquet.iter_batches(columns=columns, use_threads=False):
                    yield conform(batch, schema, values)

    def commit(self, end: dict) -> None:
        """Nothing to release: versions stay readable until the table is vacuumed."""


class DeltaDataSource(DataSource):
    """`spark.readStream.format("streamkeeper_delta")`: option table, and S3 settings."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return table_schema(DeltaConfig.from_options(self.options).location)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return DeltaStreamReader(DeltaConfig.from_options(self.options), schema)


def build_delta_source(spark: SparkSession, source: SourceSpec) -> DataFrame:
    """The rows appended to `source.table`, in the table's schema.

    A local `source.table` is relative to the working directory; s3:// URIs use the
    AWS_* environment (as sink tables do).

    Raises:
        SpecError: a bad option.
        SourceError: the table does not exist or cannot be streamed.
    """
    location = Location(resolve_root(source.table or ""), S3Settings.from_env())
    options = {**source.options, **location_options(location)}
    DeltaConfig.from_options(options)  # fail here, with the fix, not in a Spark task
    schema = table_schema(location)
    spark.dataSource.register(DeltaDataSource)
    return spark.readStream.format(FORMAT).schema(schema).options(**options).load()
