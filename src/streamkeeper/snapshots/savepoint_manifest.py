"""A savepoint's manifest: `lineages/{lineage}/savepoints/{id}/manifest.json`.

Written last when a savepoint is taken: a savepoint exists once its manifest does (and
the registry marks it complete). It says what the savepoint captured, so that its
state, its source offsets and each table's commit seq agree, and what a restore must
match: the job and lineage, the state operators (uid, Spark operator id, key and value
schemas, partitions), the state backend and partition count.

Files (`files`) are the captured checkpoint's files, each with its sha256 and where it
is stored: a *pinned* savepoint's keys are the content-addressed checkpoint store's
(relative to the storage root; the checkpoint index pins them), a *self-contained*
one's are relative to the savepoint's own folder (`checkpoint/{path}`), so the folder
can be copied anywhere and restored from there. A canonical savepoint keeps its state
as Delta tables per operator uid (`state/{uid}`, written by `streamkeeper.state`) and
its source positions; its manifest is also canonical state's `CanonicalManifest` (the
same file, each side reading its own fields).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from streamkeeper.errors import BrokenSavepointError, SavepointError
from streamkeeper.snapshots.manifest import CheckpointFile
from streamkeeper.storage import ObjectStore
from streamkeeper.storage.confine import confined_key

MANIFEST_VERSION = 1
SavepointFormat = Literal["native", "canonical"]
SavepointStorage = Literal["pinned", "self_contained"]
SELF_CONTAINED_FOLDER = "checkpoint"


@dataclass(frozen=True)
class StateOperatorInfo:
    """A stateful operator as Spark's `state-metadata` reader describes it.

    The same fields as canonical state's `OperatorState` (streamkeeper.state.format),
    so one manifest serves both: a native savepoint leaves `table`, `rows` and `bytes`
    empty; schemas are those of the operator's first store.
    """

    uid: str  # the spec's operator uid (state.operators), or `op-{operator_id}`
    operator_id: int  # Spark's operator id: its position in the query plan
    operator_name: str  # e.g. stateStoreSave, dedupe, symmetricHashJoin
    store_names: list[str]
    partitions: int
    key_schema: str  # Spark's schema JSON of the key struct
    value_schema: str
    table: str | None = None  # canonical: its Delta table, relative to the savepoint folder
    rows: int | None = None
    bytes: int | None = None

    def key_names(self) -> tuple[str, ...]:
        return tuple(f["name"] for f in json.loads(self.key_schema).get("fields", []))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StateOperatorInfo:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class TableSeq:
    """Where one target table stood when the savepoint was taken."""

    table: str  # URI
    seq: int  # the lineage's commit seq the table holds (its app-transaction version)
    version: int | None  # the Delta version holding that seq


@dataclass
class SavepointManifest:
    """Everything a restore needs, and everything it must check first."""

    id: str
    job: str
    lineage: str
    format: SavepointFormat
    storage: SavepointStorage
    seq: int  # the lineage's commit seq of the last batch captured (its head then)
    batch_id: int  # Spark's batch id of that batch: a restore resumes after it
    query_id: str
    spark_version: str
    spec_hash: str
    code_version: str  # sha256 of the transform's source
    state_backend: str  # hdfs | rocksdb
    partitions: int  # state partitions (spark.sql.shuffle.partitions when the state began)
    operators: list[StateOperatorInfo]
    source_offsets: list[Any]  # one entry per source, as Spark recorded them in offsets/N
    tables: dict[str, TableSeq]
    files: list[CheckpointFile]  # native: checkpoint N's files; canonical: none
    checkpoint_id: int | None = None  # the checkpoint captured (= seq); pinned: what it pins
    source: dict[str, Any] | None = None  # canonical: source positions {"offsets", "log"}
    sink_seqs: dict[str, int] = field(default_factory=dict)  # canonical: sink -> seq
    epoch: int = 0  # the runner that took it
    command_id: str | None = None
    started_at: float = field(default_factory=time.time)  # when the command was picked up
    ended_at: float | None = None
    created_at: float | None = None  # = started_at (canonical state's name for it)
    manifest_version: int = MANIFEST_VERSION

    def __post_init__(self) -> None:
        if self.created_at is None:
            self.created_at = self.started_at

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str) -> SavepointManifest:
        """Raises BrokenSavepointError naming `source` if `data` is no manifest we can read."""
        if data.get("manifest_version") != MANIFEST_VERSION:
            raise BrokenSavepointError(
                f"savepoint manifest {source} has version {data.get('manifest_version')!r}, "
                f"expected {MANIFEST_VERSION}; it was written by another streamkeeper version "
                "or is not a savepoint manifest"
            )
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        parsed = {
            "operators": lambda v: [StateOperatorInfo.from_json(o) for o in v],
            "tables": lambda v: {n: TableSeq(**t) for n, t in v.items()},
            "files": lambda v: [CheckpointFile(**f) for f in v],
        }
        for name, parse in parsed.items():
            if name not in data:
                raise BrokenSavepointError(
                    f"savepoint manifest {source} is corrupt: it has no {name!r}; restore "
                    "another savepoint"
                )
            try:
                known[name] = parse(data[name])
            except (AttributeError, KeyError, TypeError, ValueError) as error:
                shown = repr(data[name])
                shown = shown if len(shown) <= 200 else shown[:200] + "..."
                raise BrokenSavepointError(
                    f"savepoint manifest {source} is corrupt: its {name!r} ({shown}) cannot be "
                    f"read ({type(error).__name__}: {error}); restore another savepoint"
                ) from None
        try:
            return cls(**known)
        except TypeError as error:
            raise BrokenSavepointError(
                f"savepoint manifest {source} is corrupt ({type(error).__name__}: {error}); "
                "restore another savepoint"
            ) from None

    def operator(self, uid: str) -> StateOperatorInfo:
        """The operator with this uid.

        Raises:
            SavepointError: naming the uids the savepoint has.
        """
        for op in self.operators:
            if op.uid == uid:
                return op
        raise SavepointError(
            f"savepoint {self.id!r} has no operator uid {uid!r}; its operators: "
            f"{[o.uid for o in self.operators]}"
        )


@dataclass(frozen=True)
class SavepointPlace:
    """Where a savepoint's manifest lives: a store and the folder's key in it."""

    store: ObjectStore
    folder: str  # "" when the store is rooted at the savepoint's folder (a copied one)

    @property
    def manifest_key(self) -> str:
        return self.key("manifest.json")

    def key(self, relative: str) -> str:
        return f"{self.folder}/{relative}" if self.folder else relative

    def file_key(self, manifest: SavepointManifest, file: CheckpointFile) -> str:
        """The storage key of one captured file (checked by `savepoint_check.unsafe_paths`
        first; confined here again)."""
        source = f"savepoint manifest {self.manifest_key!r}"
        if manifest.storage == "self_contained":
            folder = SELF_CONTAINED_FOLDER
            return self.key(confined_key(folder, file.key, what="file key", source=source))
        folder = f"lineages/{manifest.lineage}/checkpoints/files"
        return confined_key(folder, file.key, what="file key", source=source)

    def read(self) -> SavepointManifest | None:
        """The manifest, or None if there is none here.

        Raises:
            BrokenSavepointError: it exists but cannot be read.
        """
        try:
            data = self.store.read_json(self.manifest_key)
        except ValueError as error:  # not JSON, or not an object
            raise BrokenSavepointError(
                f"savepoint manifest {self.manifest_key!r} cannot be read: {error}; restore "
                "another savepoint"
            ) from None
        return None if data is None else SavepointManifest.from_json(data, repr(self.manifest_key))
