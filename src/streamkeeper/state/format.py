"""The stored form of a canonical savepoint: one Delta table per operator uid, a manifest.

A canonical savepoint folder holds

    manifest.json            what the savepoint is (`CanonicalManifest`)
    state/{uid}/             one Delta table per stateful operator: columns `key`, `value`
    state/{uid}/{variable}/  transformWithState: one table per state variable, with `key`
                             and `value` (ValueState), `list_element` (ListState, a row
                             per element) or `user_map_key`, `user_map_value` (MapState)

Rows are the operator's state at one completed batch, as Spark's `statestore` reader
shows them (`key` and `value` structs), independent of the state store (HDFS-backed or
RocksDB) and of the number of state partitions: a restore recomputes each key's
partition. Types Delta cannot store are kept in a storable form and described exactly
by the operator's `key_schema` / `value_schema` (Spark's schema JSON): a `null`-typed
field (deduplication's placeholder value) is stored as a null boolean, and a struct's
repeated field names (aggregation buffers: `avg` and `sum` both keep a `sum`) are
stored with `__2`, `__3`, ... on their second, third, ... occurrence.

The manifest format belongs to the savepoint lifecycle; this module reads and writes the
fields canonical state needs and carries every other field through unchanged.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from streamkeeper.state.errors import CanonicalManifestError
from streamkeeper.storage import Location

CANONICAL_FORMAT = "canonical"
MANIFEST_NAME = "manifest.json"
STATE_FOLDER = "state"


def state_table_path(uid: str) -> str:
    """Where an operator's table lives, relative to the savepoint folder."""
    return f"{STATE_FOLDER}/{uid}"


def state_variable_path(uid: str, variable: str) -> str:
    """transformWithState: one table per state variable, below the operator's folder."""
    return f"{STATE_FOLDER}/{uid}/{variable}"


@dataclass(frozen=True)
class OperatorState:
    """One stateful operator's state in a canonical savepoint."""

    uid: str
    operator_id: int
    operator_name: str  # Spark's name: stateStoreSave, dedupe, dedupeWithinWatermark, ...
    store_names: list[str]  # transformWithState: its state variables
    partitions: int  # state partitions when exported (informative: a restore rescales)
    key_schema: str  # Spark's schema JSON of the key struct
    # Spark's schema JSON of the value struct; transformWithState: {"stateVariables":
    # [{"name", "type" (ValueState, ListState, MapState), "columns": {name: schema}, "rows"}]}
    value_schema: str
    table: str  # the Delta table, relative to the savepoint folder
    rows: int
    bytes: int  # of the table's data files

    def key_type(self) -> dict[str, Any]:
        return json.loads(self.key_schema)

    def value_type(self) -> dict[str, Any]:
        return json.loads(self.value_schema)

    @property
    def is_transform_with_state(self) -> bool:
        return self.operator_name.startswith("transformWithState")

    def state_variables(self) -> list[dict[str, Any]]:
        """transformWithState's variables as exported (empty for other operators)."""
        return self.value_type().get("stateVariables", []) if self.is_transform_with_state else []

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OperatorState:
        """Raises CanonicalManifestError naming a missing or malformed field."""
        _require(data, _OPERATOR_FIELDS, "operator")
        return cls(**{name: data[name] for name in _OPERATOR_FIELDS})


_OPERATOR_FIELDS = tuple(OperatorState.__dataclass_fields__)


@dataclass(frozen=True)
class CanonicalManifest:
    """A canonical savepoint: which job and batch, its operators and source positions."""

    id: str
    job: str
    lineage: str
    batch_id: int  # the Spark batch whose completed state this is
    checkpoint_id: int | None  # the lineage's commit seq of that batch
    operators: list[OperatorState]
    source: dict[str, Any]  # SourcePositions.to_manifest(): {"offsets": ..., "log": ...}
    sink_seqs: dict[str, int]
    spark_version: str
    created_at: float
    format: str = CANONICAL_FORMAT
    extra: dict[str, Any] = field(default_factory=dict)  # fields owned by the lifecycle

    def operator(self, uid: str) -> OperatorState:
        """The operator with this uid; the error lists the uids there are."""
        for op in self.operators:
            if op.uid == uid:
                return op
        raise CanonicalManifestError(
            f"savepoint {self.id!r} has no operator uid {uid!r}; its uids are "
            f"{[op.uid for op in self.operators]}"
        )

    def to_dict(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in _MANIFEST_FIELDS}
        data["operators"] = [op.to_dict() for op in self.operators]
        return {**self.extra, **data}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CanonicalManifest:
        """Raises CanonicalManifestError naming a missing field or another format."""
        if not isinstance(data, dict):
            raise CanonicalManifestError(f"a savepoint manifest is a JSON object, got {data!r}")
        if data.get("format") != CANONICAL_FORMAT:
            raise CanonicalManifestError(
                f"savepoint {data.get('id')!r} has format {data.get('format')!r}, not "
                f"{CANONICAL_FORMAT!r}; restore it as a native savepoint or take a canonical one"
            )
        _require(data, _MANIFEST_FIELDS, "manifest")
        if not isinstance(data["operators"], list):
            raise CanonicalManifestError(
                f"savepoint {data['id']!r}: 'operators' must be a list, got {data['operators']!r}"
            )
        values = {name: data[name] for name in _MANIFEST_FIELDS}
        values["operators"] = [OperatorState.from_dict(op) for op in data["operators"]]
        extra = {k: v for k, v in data.items() if k not in _MANIFEST_FIELDS}
        return cls(**values, extra=extra)


_MANIFEST_FIELDS = tuple(n for n in CanonicalManifest.__dataclass_fields__ if n != "extra")


def _require(data: Any, names: tuple[str, ...], what: str) -> None:
    if not isinstance(data, dict):
        raise CanonicalManifestError(f"a savepoint {what} is a JSON object, got {data!r}")
    missing = [name for name in names if name not in data]
    if missing:
        raise CanonicalManifestError(
            f"savepoint {what} {data.get('id') or data.get('uid')!r} lacks {missing}; it was "
            "not written by this version of streamkeeper, or was cut short: take the "
            "savepoint again"
        )


def write_canonical_manifest(savepoint: Location, manifest: CanonicalManifest) -> None:
    """Write `manifest.json` into the savepoint folder (atomically); write it last."""
    savepoint.store().write_json(MANIFEST_NAME, manifest.to_dict())


def read_canonical_manifest(savepoint: Location) -> CanonicalManifest:
    """Read a savepoint's manifest.

    Raises:
        CanonicalManifestError: it is missing, malformed or not canonical.
    """
    try:
        data = savepoint.store().read_json(MANIFEST_NAME)
    except ValueError as error:
        raise CanonicalManifestError(
            f"savepoint {savepoint.uri!r}: {MANIFEST_NAME} is not valid JSON ({error}); the "
            "savepoint is damaged: take it again"
        ) from None
    if data is None:
        raise CanonicalManifestError(
            f"no savepoint at {savepoint.uri!r} ({MANIFEST_NAME} is missing); pass the folder "
            "of a completed savepoint"
        )
    return CanonicalManifest.from_dict(data)
