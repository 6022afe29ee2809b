"""The declarative job spec: one YAML file per job, validated on load.

Checkpoint knobs carry Flink's names and meaning (see README, "Concepts"). Every
validation error names the field, the bad value and the expected form.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from streamkeeper.errors import SpecError
from streamkeeper.storage.confine import NAME_PATTERN, SINK_NAME_PATTERN

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}

DeliveryMode = Literal["exactly_once", "idempotent", "at_least_once"]
CheckpointMode = Literal["exactly_once", "at_least_once"]


def parse_duration(value: Any) -> float:
    """Parse '500ms', '2s', '1.5m', '1h', '30d' or a number of seconds into seconds."""
    if isinstance(value, bool):
        raise ValueError(f"invalid duration {value!r}; expected e.g. '500ms', '10s', '5m', '1h'")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ValueError(
                f"invalid duration {value!r}; expected e.g. '500ms', '10s', '5m', '1h'"
            )
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if seconds < 0:
        raise ValueError(f"invalid duration {value!r}; it must not be negative")
    return seconds


Duration = Annotated[float, BeforeValidator(parse_duration)]


def _job_name(value: str) -> str:
    """A job or lineage name: it names folders below the storage root."""
    if not re.match(NAME_PATTERN, value):
        raise ValueError(
            "must be 1 to 63 characters of a-z, 0-9 and '-', starting with a letter or digit, "
            "e.g. 'keyed-totals' (it names folders below the storage root)"
        )
    return value


def _sink_name(value: str) -> str:
    if not re.match(SINK_NAME_PATTERN, value):
        raise ValueError(
            "must be 1 to 63 characters of a-z, 0-9 and '_', starting with a letter, "
            "e.g. 'totals' (it names the table's folder)"
        )
    return value


JobName = Annotated[str, AfterValidator(_job_name)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StorageSpec(_Strict):
    """Where durable things live: tables, the write-ahead log, the control plane."""

    root: str = ".streamkeeper/data"
    endpoint_url: str | None = None
    region: str | None = None
    allow_http: bool | None = None


class SourceSpec(_Strict):
    """A replayable source.

    `file`: Spark's file source over a directory (`path`, `format`, `schema`).
    `nats`: a NATS JetStream stream (`url`, `stream`, `subject`); offsets are stream sequences.
    `delta`: a Delta table (`table`, a URI); offsets are table versions, so jobs can chain tables.
    `rate`: Spark's rate source, for benchmarks.
    """

    type: Literal["file", "rate", "nats", "delta"] = "file"
    path: str | None = None
    format: Literal["json", "csv", "parquet", "text"] = "json"
    schema_ddl: str | None = Field(default=None, alias="schema")
    url: str | None = None
    stream: str | None = None
    subject: str | None = None
    table: str | None = None
    options: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _required_fields(self) -> SourceSpec:
        required = {
            "file": {"path": "a directory", "schema_ddl": "a DDL string such as 'key STRING'"},
            "nats": {"url": "e.g. nats://127.0.0.1:4222", "stream": "a JetStream stream name"},
            "delta": {"table": "a Delta table URI"},
            "rate": {},
        }[self.type]
        for name, example in required.items():
            if not getattr(self, name):
                field = "schema" if name == "schema_ddl" else name
                raise ValueError(
                    f"source.{field} is required for a {self.type} source; set it to {example}"
                )
        return self

    @field_validator("options", mode="before")
    @classmethod
    def _stringify_options(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {
                str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()
            }
        return value


class SinkSpec(_Strict):
    """One target Delta table fed from the job's output stream."""

    name: Annotated[str, AfterValidator(_sink_name)]
    table: str | None = None  # relative: below the storage root; or an absolute path or URI
    output: Literal["append", "merge"] = "append"
    key: list[str] = Field(default_factory=list)
    columns: list[str] | None = None
    where: str | None = None
    mode: DeliveryMode | None = None
    # Several jobs may append to one table only if each says so (else: refused at start).
    shared: bool = False
    # merge: of a batch's rows for one key, the one with the greatest value here wins.
    order_by: str | None = None

    @property
    def table_path(self) -> str:
        """The table below the storage root (relative), or its absolute path or URI."""
        return self.table or f"tables/{self.name}"

    @field_validator("table")
    @classmethod
    def _table_inside_the_root(cls, value: str | None) -> str | None:
        if value is None or "://" in value or value.startswith("/"):
            return value
        normalized = posixpath.normpath(value)
        if normalized in (".", "..") or normalized.startswith("../"):
            raise ValueError(
                "a relative table path is below the storage root, and this one escapes the "
                "storage root; use a path inside it, e.g. 'tables/totals', or an absolute "
                "path or URI"
            )
        return value

    @model_validator(mode="after")
    def _merge_needs_key(self) -> SinkSpec:
        if self.output == "merge" and not self.key:
            raise ValueError(
                f"sink {self.name!r} has output 'merge' but no key; list the key columns, "
                "e.g. key: [customer_id]"
            )
        if self.columns is not None and self.key:
            missing = [k for k in self.key if k not in self.columns]
            if missing:
                raise ValueError(f"sink {self.name!r}: key columns {missing} are not in columns")
        return self

    @model_validator(mode="after")
    def _order_by_orders_merge_rows(self) -> SinkSpec:
        if self.order_by is None:
            return self
        if self.output != "merge":
            raise ValueError(
                f"sink {self.name!r}: order_by {self.order_by!r} only applies to output "
                "'merge' (it picks the row per key); remove it or set output: merge"
            )
        if self.order_by in self.key:
            raise ValueError(
                f"sink {self.name!r}: order_by {self.order_by!r} is a key column, so it is the "
                "same for all of a key's rows; order by a column that differs between them, "
                "e.g. an event time"
            )
        if self.columns is not None and self.order_by not in self.columns:
            raise ValueError(
                f"sink {self.name!r}: order_by {self.order_by!r} is not in columns "
                f"{self.columns}; add it to columns or order by one of them"
            )
        return self


class ExternalizedSpec(_Strict):
    """Externalized checkpoints (Flink's ExternalizedCheckpointRetention)."""

    enabled: bool = False
    retention: Literal["retain_on_cancellation", "delete_on_cancellation"] = (
        "retain_on_cancellation"
    )
    retained: Annotated[int, Field(ge=1)] = 3


class CheckpointSpec(_Strict):
    """Flink's checkpoint knobs, mapped onto Spark's micro-batches."""

    dir: str | None = None
    interval: Duration = 1.0
    mode: CheckpointMode = "exactly_once"
    timeout: Duration = 600.0
    min_pause: Duration = 0.0
    tolerable_failures: Annotated[int, Field(ge=0)] = 0
    # Completed checkpoints whose commit may be pending at once; one more makes the next
    # batch wait at its end (backpressure). Flink's max concurrent checkpoints.
    max_concurrent: Annotated[int, Field(ge=1, le=16)] = 2
    externalized: ExternalizedSpec = Field(default_factory=ExternalizedSpec)

    @model_validator(mode="after")
    def _positive_timeout(self) -> CheckpointSpec:
        if self.timeout <= 0:
            raise ValueError("checkpoint.timeout must be positive, e.g. '10m'")
        return self


class SavepointsSpec(_Strict):
    """Savepoint retention, applied by the running job after each savepoint it takes.

    None keeps every savepoint (Flink's default: savepoints belong to the user). A
    protected savepoint, one a job was restored from, or one an upgrade holds is never
    deleted by retention.
    """

    retained: Annotated[int | None, Field(ge=1)] = None  # keep the newest N
    max_age: Duration | None = None  # delete older ones (the newest is always kept)

    @field_validator("max_age")
    @classmethod
    def _positive_age(cls, value: float | None) -> float | None:
        if value is not None and value <= 0:
            raise ValueError("savepoints.max_age must be positive, e.g. '30d' or '720h'")
        return value


class MaintenanceSpec(_Strict):
    """Delta table maintenance (commit/maintenance.py): checkpoints, log expiry, the
    retirement of commit markers nothing needs (lineage/markers.py), and the checkpoint
    history's upkeep (observability/history_upkeep.py).

    Versions the lineage may need (retained checkpoints, savepoints, the head) are always
    kept; `history_retention` keeps more history for readers outside the lineage.
    """

    every: Annotated[int, Field(ge=1)] = 100  # commits to a table between two passes
    history_retention: Duration = 3600.0
    # The newest commit markers, always kept (the upgrade comparison reads back 200).
    markers_kept: Annotated[int, Field(ge=200)] = 1000
    # Checkpoints the history table keeps (the page's longest chart shows 1 000).
    history_checkpoints: Annotated[int, Field(ge=1000)] = 10000


class StateBackendSpec(_Strict):
    """hdfs: Spark's HDFS-backed store (in memory, files on checkpoint); rocksdb: RocksDB."""

    type: Literal["hdfs", "rocksdb"] = "hdfs"
    changelog: bool = False

    @model_validator(mode="after")
    def _changelog_is_rocksdb_only(self) -> StateBackendSpec:
        if self.changelog and self.type != "rocksdb":
            raise ValueError(
                "state_backend.changelog needs type 'rocksdb'; set type: rocksdb or drop changelog"
            )
        return self


UID_PATTERN = r"^[a-z0-9_-]{1,64}$"


class OperatorUidSpec(_Strict):
    """A stateful operator's stable name (Flink's uid), by Spark's operator id.

    Without `operator_id` the operator is the one at this item's position in the list
    (Spark numbers a query's stateful operators 0, 1, ... in plan order).
    """

    uid: str
    operator_id: Annotated[int | None, Field(ge=0)] = None

    @field_validator("uid")
    @classmethod
    def _uid_form(cls, value: str) -> str:
        if not re.match(UID_PATTERN, value):
            raise ValueError(
                f"uid {value!r} must be 1 to 64 characters of a-z, 0-9, '_' and '-', "
                "e.g. 'totals' or 'dedup-events'"
            )
        return value


class StateSpec(_Strict):
    """The job's stateful operators, for savepoints and restore by uid."""

    operators: list[OperatorUidSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> StateSpec:
        uids = [op.uid for op in self.operators]
        repeated = sorted({u for u in uids if uids.count(u) > 1})
        if repeated:
            raise ValueError(
                f"state.operators: uid(s) {repeated} appear more than once; give each "
                "stateful operator its own uid"
            )
        ids = self._operator_ids()
        repeated_ids = sorted({i for i in ids if ids.count(i) > 1})
        if repeated_ids:
            raise ValueError(
                f"state.operators: operator_id {repeated_ids} is named by more than one entry "
                "(an entry without operator_id takes its position in the list); give each "
                "entry its own operator_id"
            )
        return self

    def _operator_ids(self) -> list[int]:
        return [
            position if op.operator_id is None else op.operator_id
            for position, op in enumerate(self.operators)
        ]

    def operator_uids(self) -> dict[int, str]:
        """operator id -> uid; an entry without operator_id takes its position."""
        return {i: op.uid for i, op in zip(self._operator_ids(), self.operators, strict=True)}


class SparkSpec(_Strict):
    """Spark session settings for the job's driver."""

    master: str = "local[*]"
    shuffle_partitions: Annotated[int, Field(ge=1)] = 4
    conf: dict[str, str] = Field(default_factory=dict)
    # A class-data sharing archive the driver's JVM maps at start (`streamkeeper
    # driver-archive PATH` makes one): an absolute path on the driver's host.
    class_data_archive: str | None = None

    @field_validator("class_data_archive")
    @classmethod
    def _archive_path(cls, value: str | None) -> str | None:
        if value is not None and (not value.startswith("/") or any(c.isspace() for c in value)):
            raise ValueError(
                f"spark.class_data_archive {value!r} must be an absolute path without spaces "
                "on the driver's host, e.g. /opt/streamkeeper/spark-driver.jsa"
            )
        return value


_CRON = re.compile(
    r"^(@(annually|yearly|monthly|weekly|daily|hourly|once)|(\S+\s+){4}\S+(\s+\S+)?)$"
)


class RestartSpec(_Strict):
    """How the Airflow monitor restarts a FAILED job: exponential back-off, then give up."""

    enabled: bool = False
    max_attempts: Annotated[int, Field(ge=1)] = 3
    backoff: Duration = 60.0  # wait before the second attempt; doubles for each one after
    max_backoff: Duration = 1800.0


class AirflowSpec(_Strict):
    """How Airflow runs the job (DAGs generated from the spec); the runtime ignores it."""

    conn_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,250}$")] = "streamkeeper_default"
    launcher: Literal["embedded", "spark_submit", "ssh", "kubernetes"] = "embedded"
    # Options of each launcher, by name (e.g. ssh: {ssh_conn_id, remote_python}): the
    # deployment's files, never a DAG run's Params (launchers/*.py document each option).
    launcher_options: dict[
        Literal["embedded", "spark_submit", "ssh", "kubernetes"], dict[str, Any]
    ] = Field(default_factory=dict)
    # The Celery queue of the tasks that launch drivers (start, restart, start_green,
    # rollback): served only by a worker on the Spark gateway host, so `embedded` and
    # `spark_submit` drivers run there (the rest run on any worker). None: the default.
    launch_queue: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]{1,200}$")] | None = None
    # events: the monitor runs on each health change (the triggerer watches the job every
    # monitor_poll_interval) and on monitor_safety_net; schedule: on monitor_schedule.
    monitor: Literal["events", "schedule"] = "events"
    monitor_schedule: str | None = "*/5 * * * *"  # `monitor: schedule` only
    monitor_safety_net: str | None = "@daily"  # `monitor: events`: catches a missed event
    monitor_poll_interval: Duration = 15.0
    savepoint_schedule: str | None = None
    savepoint_format: Literal["native", "canonical"] = "native"
    restart: RestartSpec = Field(default_factory=RestartSpec)
    # Override keys (shell-style patterns, e.g. `source.path`, `sinks.*.mode`) whoever
    # triggers the job's DAGs may set, beyond a few harmless knobs: the DAG author's choice
    # (streamkeeper_airflow/launch_policy.py; code-loading keys are refused whatever it says).
    trigger_overrides: list[str] = Field(default_factory=list)

    @field_validator("monitor_schedule", "monitor_safety_net", "savepoint_schedule")
    @classmethod
    def _cron(cls, value: str | None) -> str | None:
        if value is not None and not _CRON.match(value.strip()):
            raise ValueError(
                f"invalid schedule {value!r}; expected a cron expression such as "
                "'*/5 * * * *' or a preset such as '@hourly' (null: manual runs only)"
            )
        return value

    @field_validator("monitor_poll_interval")
    @classmethod
    def _positive_poll(cls, value: float) -> float:
        if value <= 0:
            raise ValueError(
                f"monitor_poll_interval {value!r} is not positive; expected a duration "
                "such as '15s' (how often the triggerer reads the job's health)"
            )
        return value


class JobSpec(_Strict):
    """A streaming job: source, transformation, sinks, checkpointing and state."""

    name: JobName
    lineage: JobName | None = None
    source: SourceSpec
    transform: Annotated[str, Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")]
    output_mode: Literal["append", "update", "complete"] = "update"
    sinks: Annotated[list[SinkSpec], Field(min_length=1)]
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    state_backend: StateBackendSpec = Field(default_factory=StateBackendSpec)
    savepoints: SavepointsSpec = Field(default_factory=SavepointsSpec)
    maintenance: MaintenanceSpec = Field(default_factory=MaintenanceSpec)
    storage: StorageSpec = Field(default_factory=StorageSpec)
    spark: SparkSpec = Field(default_factory=SparkSpec)
    airflow: AirflowSpec = Field(default_factory=AirflowSpec)
    # Operator uids for savepoints; without it operators get the uids op-0, op-1, ...
    state: StateSpec | None = None

    @property
    def lineage_id(self) -> str:
        """The job lineage: survives restarts, restores and upgrades (defaults to the name)."""
        return self.lineage or self.name

    @model_validator(mode="after")
    def _unique_sinks(self) -> JobSpec:
        names = [s.name for s in self.sinks]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"sink names must be unique; {duplicates} appear more than once")
        return self

    def sink_mode(self, sink: SinkSpec) -> DeliveryMode:
        """A sink's delivery mode: its own, else the checkpoint mode."""
        return sink.mode or self.checkpoint.mode


def _format_validation_error(source: str, error: ValidationError) -> str:
    lines = [f"invalid job spec {source}:"]
    for item in error.errors():
        field = ".".join(str(p) for p in item["loc"]) or "<root>"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown field; remove it or check its spelling"
        elif item["type"] == "missing":
            message = "required field is missing"
        given = item.get("input")
        shown = (
            f" (got {given!r})"
            if item["type"] not in ("missing",) and not isinstance(given, dict)
            else ""
        )
        lines.append(f"  {field}: {message}{shown}")
    return "\n".join(lines)


def parse_spec(data: Any, source: str = "<spec>") -> JobSpec:
    """Validate a spec given as a mapping.

    Args:
        data: the parsed YAML document.
        source: where it came from, for error messages.

    Returns:
        The validated spec.

    Raises:
        SpecError: naming every bad field and the fix.
    """
    if not isinstance(data, dict):
        raise SpecError(
            f"invalid job spec {source}: expected a mapping at the top level, got {data!r}"
        )
    try:
        return JobSpec.model_validate(data)
    except ValidationError as error:
        raise SpecError(_format_validation_error(source, error)) from None


# libyaml's safe loader where PyYAML was built with it: the pure-Python one was 85% of
# the DAG files' parse time at 100 specs (benchmarks/dag_parse.py).
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_spec(path: str | Path, overrides: dict[str, Any] | None = None) -> JobSpec:
    """Load and validate a job spec file, applying dotted-key overrides (e.g. storage.root).

    Raises:
        SpecError: the file is missing, not YAML, or not a valid spec.
    """
    spec_path = Path(path)
    if not spec_path.is_file():
        raise SpecError(f"job spec {str(path)!r} not found; pass the path to a job's YAML file")
    try:
        data = yaml.load(spec_path.read_text(), Loader=SAFE_LOADER)
    except yaml.YAMLError as error:
        raise SpecError(f"job spec {str(path)!r} is not valid YAML: {error}") from None
    if isinstance(data, dict):
        for dotted, value in (overrides or {}).items():
            _set_dotted(data, dotted, value)
    return parse_spec(data, source=repr(str(path)))


_MAPPING_FIELDS = ("spark.conf", "source.options")


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `a.b.c` (list items by index, e.g. `sinks.0.mode`) in a parsed spec."""
    node: Any = data
    for mapping_field in _MAPPING_FIELDS:  # their keys hold dots: spark.conf.spark.sql.x
        if dotted.startswith(mapping_field + "."):
            section, name = mapping_field.split(".")
            data.setdefault(section, {}).setdefault(name, {})[dotted[len(mapping_field) + 1 :]] = (
                value
            )
            return
    *parents, leaf = dotted.split(".")
    for part in parents:
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict):
            node = node.setdefault(part, {})
        else:
            raise SpecError(_not_a_field(dotted, part, node))
    if isinstance(node, list) and leaf.isdigit() and int(leaf) < len(node):
        node[int(leaf)] = value
    elif isinstance(node, dict):
        node[leaf] = value
    else:
        raise SpecError(_not_a_field(dotted, leaf, node))


def _not_a_field(dotted: str, part: str, node: Any) -> str:
    if isinstance(node, list):
        return (
            f"override {dotted!r}: {part!r} is not an item of a list of {len(node)}; use an "
            f"index from 0 to {len(node) - 1}"
        )
    return f"override {dotted!r}: {part!r} is not a field of the spec"
