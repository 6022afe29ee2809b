"""A Delta table as a replayable source: offsets are table versions.

Batch (start, end] holds the rows that commits start+1..end appended and the table still
holds at `end`. The planner reads those versions' commit files (`_delta_log/{version}.json`,
no delta-spark) and keeps the files each commit added; tasks read exactly those Parquet
files. Versions are immutable, so a replay of a batch reads the same files, and planning
costs one small read per new commit, never a rebuild of the table's file list. A commit
that removed files (DELETE, UPDATE, MERGE, overwrite) or marked rows deleted with deletion
vectors has no append-only meaning: the stream stops and names its version, unless
`skipChangeCommits` is set. OPTIMIZE only rewrites rows already read and is skipped.

A RESTORE (a rollback of the job writing the table) retracts the versions after its
target: a stream that has not read them yet never does (`delta_log.visible_commits`; the
planner looks ahead to the latest version it may read, so a batch never ends inside a
retracted range); a stream that has read them stops with `RestoredBelowReadError` unless
`acceptRestores`. A RESTORE is never skipped silently, not even with `skipChangeCommits`.

`stablePointOf` (a job) with `stablePointRoot` (its storage root) reads only up to that
job's stable point (`streamkeeper.stable`): never the output of an upgrade's green on
probation, so after a rollback the stream sees only blue's output, once.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)

from streamkeeper.errors import SourceError, SpecError, StreamkeeperError
from streamkeeper.sources.delta_log import (
    Commit,
    DataFile,
    DeletionVectorError,
    NotAppendOnlyError,
    RestoredBelowReadError,
    appended_files,
    files_read_before,
    first_line,
    parse_commit,
    read_commit,
    visible_commits,
)
from streamkeeper.sources.offsets import parse_int_offset
from streamkeeper.spec import SourceSpec
from streamkeeper.storage import Location, S3Settings, resolve_root

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from streamkeeper.stable import StableView

__all__ = [  # the log's side lives in delta_log; re-exported for the source's users
    "Commit",
    "DataFile",
    "DeletionVectorError",
    "DeltaConfig",
    "DeltaDataSource",
    "DeltaStreamReader",
    "NotAppendOnlyError",
    "RestoredBelowReadError",
    "appended_files",
    "build_delta_source",
    "parse_commit",
]

FORMAT = "streamkeeper_delta"
USER_OPTIONS = (
    "maxFilesPerTrigger",
    "startingVersion",
    "skipChangeCommits",
    "acceptRestores",
    "stablePointOf",
    "stablePointRoot",
)
_JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
PARTITION_BYTES = 128 * 1024 * 1024  # files per Spark task, by size
# Storage settings travel as options; Spark redacts keys matching secret|access.?key.
_S3_KEYS = ("s3.endpoint", "s3.region", "s3.allowHttp", "s3.accessKey", "s3.secretKey")
_S3_KEYS += ("s3.sessionToken", "s3.roleArn")


@dataclass(frozen=True)
class DeltaConfig:
    """Everything a reader needs; plain values, so readers pickle to executors."""

    location: Location
    max_files: int | None = None  # maxFilesPerTrigger (whole commits; at least one)
    starting_version: int | None = None  # first version to stream; default 0
    skip_change_commits: bool = False
    accept_restores: bool = False  # go on past a RESTORE of rows already read
    stable_job: str | None = None  # stablePointOf: read only up to this job's stable point
    stable_root: str | None = None  # stablePointRoot: that job's storage root

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
                session_token=given.get("s3.sessiontoken") or None,
                role_arn=given.get("s3.rolearn") or None,
            )
        starting = _int_option(given, "startingVersion", minimum=0)
        stable_job, stable_root = _stable_options(given)
        return cls(
            location=Location(given["table"], s3),
            max_files=_int_option(given, "maxFilesPerTrigger", minimum=1),
            starting_version=starting,
            skip_change_commits=_bool_option(given, "skipChangeCommits"),
            accept_restores=_bool_option(given, "acceptRestores"),
            stable_job=stable_job,
            stable_root=stable_root,
        )

    def stable_view(self) -> StableView | None:
        """The producing job's stable view (driver side), if the stream follows it."""
        if self.stable_job is None or self.stable_root is None:
            return None
        from streamkeeper.stable import StableView

        return StableView(Location(self.stable_root, self.location.s3), self.stable_job)


def _stable_options(given: Mapping[str, str]) -> tuple[str | None, str | None]:
    job = (given.get("stablepointof") or "").strip() or None
    root = (given.get("stablepointroot") or "").strip() or None
    if (job is None) != (root is None):
        raise SpecError(
            "source options stablePointOf and stablePointRoot go together: name the job "
            "writing source.table and its storage root, e.g. stablePointOf: orders, "
            f"stablePointRoot: s3://bucket/prefix (got {job!r} and {root!r})"
        )
    if job is not None and not _JOB_NAME.fullmatch(job):
        raise SpecError(
            f"source option stablePointOf={job!r} is not a job name; use the producing "
            "job's spec `name`, e.g. stablePointOf: orders"
        )
    return job, root


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
            ("s3.sessionToken", s3.session_token),
            ("s3.roleArn", s3.role_arn),
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
            value = partition_scalar(partition_values[field.name], field.type)
            arrays.append(pa.repeat(value, rows))
        else:  # a column added after this file was written, or a null partition value
            arrays.append(pa.nulls(rows, field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def partition_scalar(value: Any, data_type: pa.DataType) -> pa.Scalar:
    """A partition value as `data_type`; the log writes them as strings ('1', '2024-05-01').

    Timestamps are written in UTC without an offset ('2024-05-01 12:30:01.123456'), which
    Arrow will not cast to a zoned timestamp directly.
    """
    import pyarrow as pa

    raw = pa.array([value])
    if pa.types.is_string(raw.type) and pa.types.is_timestamp(data_type) and data_type.tz:
        try:
            return raw.cast(data_type)[0]  # ISO 8601 with an offset or 'Z'
        except pa.ArrowInvalid:
            return raw.cast(pa.timestamp(data_type.unit)).cast(data_type)[0]
    return raw.cast(data_type)[0]


# -- the table through delta-rs (driver side) ------------------------------------------


def open_table(location: Location) -> DeltaTable:
    """The table at its latest version.

    Raises:
        SourceError: it is not a Delta table, or it cannot be loaded.
    """
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError, TableNotFoundError

    try:
        return DeltaTable(location.uri, storage_options=location.storage_options())
    except TableNotFoundError as error:
        raise SourceError(
            f"source.table {location.uri!r} is not a Delta table ({first_line(error)}); "
            "create it first or fix source.table"
        ) from None
    except DeltaError as error:
        raise SourceError(
            f"cannot load Delta table {location.uri!r} ({first_line(error)}); check "
            "source.table and that the table's log is readable"
        ) from None


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


# -- the Spark data source -------------------------------------------------------------


class DeltaPartition(InputPartition):
    """The files one task reads."""

    def __init__(self, files: tuple[DataFile, ...]) -> None:
        super().__init__(files)
        self.files = files


class DeltaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans batches on the driver (commit files) and reads Parquet on executors (pyarrow)."""

    def __init__(self, config: DeltaConfig, schema: StructType) -> None:
        self.config = config
        self.schema = schema
        self.target: int | None = None  # Trigger.AvailableNow stops here
        self._commits: dict[int, Commit] = {}  # commits read, until their batch is done
        self._table: DeltaTable | None = None  # kept up to date incrementally
        self._stable: StableView | None = None  # the producing job's, if followed
        self._stable_sink = ""

    def __getstate__(self) -> dict[str, Any]:
        # Executors need the config and schema only; a DeltaTable does not pickle.
        return {**self.__dict__, "_commits": {}, "_table": None, "_stable": None}

    def _latest_version(self) -> int:
        """The table's latest version; after the first call, reads only new commits."""
        if self._table is None:
            self._table = open_table(self.config.location)
        else:
            self._table.update_incremental()
        return self._table.version()

    def _stable_version(self) -> int | None:
        """The table's version at the producing job's stable point (-1: none; None: not
        followed). Read on every trigger: an upgrade may start or end at any time."""
        if self.config.stable_job is None:
            return None
        if self._stable is None:
            self._stable = self.config.stable_view()
            assert self._stable is not None
            self._stable_sink = self._stable.sink_of(self.config.location.uri)
        point = self._stable.point()
        return -1 if point is None else point.versions.get(self._stable_sink, -1)

    def _cap(self) -> int:
        """The latest version the next batch may reach."""
        latest = self._latest_version()
        cap = latest if self.target is None else min(latest, self.target)
        stable = self._stable_version()
        return cap if stable is None else min(cap, stable)

    def _commit_at(self, version: int) -> Commit:
        commit = self._commits.get(version)
        if commit is None:
            commit = self._commits[version] = read_commit(self.config.location, version)
        return commit

    def _visible(self, start: int, end: int) -> list[Commit]:
        """The commits of (start, end] the table still holds at `end`; stops the stream at a
        RESTORE of versions it read (unless acceptRestores)."""
        table = self.config.location.uri

        def restored_below(restore: Commit) -> None:
            first = self.config.starting_version or 0
            read_from, read = files_read_before(table, restore, start, first, self._commit_at)
            if read and not self.config.accept_restores:
                raise RestoredBelowReadError(
                    table, restore.version, restore.restored_to, read_from, start, len(read)
                )

        return visible_commits(start, end, self._commit_at, restored_below)

    def _appended(self, commit: Commit) -> list[DataFile]:
        return appended_files(
            self.config.location.uri, commit, skip_change_commits=self.config.skip_change_commits
        )

    def initialOffset(self) -> dict:
        return version_offset((self.config.starting_version or 0) - 1)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.config.max_files:
            return ReadMaxFiles(self.config.max_files)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._cap()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = parse_version(start)
        cap = self._cap()
        if cap <= begin:  # nothing new, or held at the stable point
            return version_offset(begin)
        max_files = limit.max_files if isinstance(limit, ReadMaxFiles) else None
        # Walked back from the cap, not forward from the start: a batch must never end
        # inside a range that a later RESTORE (up to the cap) retracted.
        counts = ((c.version, len(self._appended(c))) for c in self._visible(begin, cap))
        return version_offset(admit(begin, cap, max_files, counts))

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        visible = self._visible(parse_version(start), parse_version(end))
        files = [file for commit in visible for file in self._appended(commit)]
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
        """Forget planned versions up to `end`; the table's versions stay readable."""
        done = parse_version(end)
        self._commits = {v: c for v, c in self._commits.items() if v > done}


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
        SpecError: a bad option, or stablePointOf names no job writing the table.
        SourceError: the table does not exist or cannot be streamed.
    """
    location = Location(resolve_root(source.table or ""), S3Settings.from_env())
    options = {**source.options, **location_options(location)}
    config = DeltaConfig.from_options(options)  # fail here, with the fix, not in a Spark task
    if config.stable_root is not None:
        options = {**options, **_stable_root_option(options, config)}
        check_stable_source(DeltaConfig.from_options(options))
    schema = table_schema(location)
    spark.dataSource.register(DeltaDataSource)
    return spark.readStream.format(FORMAT).schema(schema).options(**options).load()


def _stable_root_option(options: Mapping[str, str], config: DeltaConfig) -> dict[str, str]:
    """stablePointRoot as an absolute root (a local one is relative to the working dir)."""
    keys = [k for k in options if k.lower() == "stablepointroot"]
    return {key: resolve_root(config.stable_root or "") for key in keys}


def check_stable_source(config: DeltaConfig) -> None:
    """The job stablePointOf names exists under stablePointRoot and writes source.table.

    Raises:
        SpecError: naming the bad value and the fix (reads only).
    """
    try:
        view = config.stable_view()
        if view is not None:
            view.sink_of(config.location.uri)
            view.point()  # its records are readable
    except SpecError:
        raise
    except StreamkeeperError as error:
        raise SpecError(
            f"source option stablePointOf={config.stable_job!r} with stablePointRoot="
            f"{config.stable_root!r}: {error}"
        ) from None
