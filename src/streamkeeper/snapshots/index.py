"""The checkpoint index: which externalized checkpoints a lineage keeps, and who owns them.

`lineages/{lineage}/checkpoints/index.json` lists the retained checkpoints (by id, the
commit seq of the batch that completed them) and the savepoints that pin some of them,
and names the epoch that owns it. It is the single source of truth for what is
referenced: a restore reads it instead of listing manifests, and a file is deleted only
after a compare-and-swap of the index removed the last checkpoint that referenced it.

Every change is a compare-and-swap, refused to any runner whose epoch is below the
owner's: a new owner takes the index over at start, after which a fenced runner can
neither add a checkpoint nor drop one. Keys of newly uploaded files carry the epoch that
uploaded them (`files/{sha256}.e{epoch}`): a file some older runner committed to delete
can never be a file a newer one just uploaded.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from streamkeeper.errors import FencedError, UnsafePathError
from streamkeeper.lineage.layout import SEQ_WIDTH, LineageLayout, seq_of
from streamkeeper.snapshots.savepoints import SAVEPOINT_ID_PATTERN
from streamkeeper.storage import ObjectStore
from streamkeeper.storage.confine import PLANTED_FIX, checked_name

INDEX_FORMAT = 1


@dataclass
class IndexEntry:
    """One retained checkpoint."""

    id: int
    batch_id: int
    epoch: int
    created_at: float = field(default_factory=time.time)


@dataclass
class CheckpointIndex:
    """The retained checkpoints, oldest first, and the savepoints pinning checkpoints."""

    owner_epoch: int = 0
    checkpoints: list[IndexEntry] = field(default_factory=list)
    pins: dict[str, int] = field(default_factory=dict)  # savepoint id -> checkpoint id
    updated_at: float = 0.0
    format: int = INDEX_FORMAT

    @property
    def ids(self) -> list[int]:
        return [entry.id for entry in self.checkpoints]

    def latest(self) -> IndexEntry | None:
        return self.checkpoints[-1] if self.checkpoints else None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def add(self, entry: IndexEntry) -> None:
        """Index a checkpoint; one uploaded again (a commit retried after a crash) replaces
        its entry: ids are unique, so retention counts checkpoints, not uploads."""
        self.checkpoints = unique_entries([*self.checkpoints, entry])

    @classmethod
    def from_json(
        cls, data: dict[str, Any], source: str = "the checkpoint index"
    ) -> CheckpointIndex:
        """Raises UnsafePathError for an entry that is no checkpoint id or a pin that is no
        savepoint id (they name keys to read and delete)."""
        entries = [IndexEntry(**entry) for entry in data.get("checkpoints", [])]
        for entry in entries:
            _checked_id(entry.id, source)
        return cls(
            owner_epoch=int(data.get("owner_epoch", 0)),
            checkpoints=unique_entries(entries),
            pins={
                checked_name(k, SAVEPOINT_ID_PATTERN, **_pin(source)): _checked_id(v, source)
                for k, v in data.get("pins", {}).items()
            },
            updated_at=float(data.get("updated_at", 0.0)),
        )


def _checked_id(value: object, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UnsafePathError(
            f"{source} names checkpoint {value!r}, which is not a checkpoint id (a number "
            f"of at most {SEQ_WIDTH} digits); {PLANTED_FIX}"
        )
    if len(str(value)) > SEQ_WIDTH:
        raise UnsafePathError(f"{source} names checkpoint {value!r}, too long; {PLANTED_FIX}")
    return value


def _pin(source: str) -> dict[str, str]:
    return {"what": "a pinning savepoint", "source": source, "expected": "a savepoint id"}


def unique_entries(entries: Iterable[IndexEntry]) -> list[IndexEntry]:
    """One entry per checkpoint id (the last one written wins), oldest id first."""
    by_id = {entry.id: entry for entry in entries}
    return [by_id[i] for i in sorted(by_id)]


def _from_manifests(store: ObjectStore, layout: LineageLayout) -> CheckpointIndex:
    """An index for a lineage externalized before indexes existed: its manifests, listed."""
    index = CheckpointIndex()
    for key in store.list(layout.checkpoint_manifests):
        data = store.read_json(key) if key.endswith(".json") else None
        if data is not None:
            index.checkpoints.append(
                IndexEntry(seq_of(key), int(data.get("batch_id", -1)), 0, data.get("created_at", 0))
            )
    return index


def read_index(store: ObjectStore, layout: LineageLayout) -> CheckpointIndex:
    """The lineage's checkpoint index (empty if it never externalized a checkpoint)."""
    key = layout.checkpoint_index
    data = store.read_json(key)
    if data is None:
        return _from_manifests(store, layout)
    return CheckpointIndex.from_json(data, f"the checkpoint index {key!r}")


class IndexWriter:
    """Changes the index by compare-and-swap, as the runner of epoch `epoch`."""

    def __init__(self, store: ObjectStore, layout: LineageLayout, epoch: int) -> None:
        self.store = store
        self.layout = layout
        self.epoch = epoch
        self._cached: tuple[CheckpointIndex, str | None] | None = None

    def read(self) -> CheckpointIndex:
        """The index as this writer last wrote or read it."""
        if self._cached is None:
            self._cached = self._read_fresh()
        return self._cached[0]

    def _read_fresh(self) -> tuple[CheckpointIndex, str | None]:
        data, version = self.store.read_versioned(self.layout.checkpoint_index)
        if data is None:
            return _from_manifests(self.store, self.layout), None
        source = f"the checkpoint index {self.layout.checkpoint_index!r}"
        return CheckpointIndex.from_json(data, source), version

    def update(self, change: Callable[[CheckpointIndex], None]) -> CheckpointIndex:
        """Apply `change` to the current index and store it (retried on a concurrent write).

        Raises:
            FencedError: a newer epoch owns the index.
        """
        while True:
            index, version = self._cached or self._read_fresh()
            if index.owner_epoch > self.epoch:
                raise FencedError(
                    f"runner epoch {self.epoch} of lineage {self.layout.lineage!r} is fenced: "
                    f"epoch {index.owner_epoch} owns its checkpoint index; this runner stops "
                    "without changing its checkpoints"
                )
            changed = CheckpointIndex.from_json(index.to_json())
            change(changed)
            changed.owner_epoch = self.epoch
            changed.updated_at = time.time()
            written = self.store.write_if(self.layout.checkpoint_index, changed.to_json(), version)
            if written is not None:
                self._cached = (changed, written)
                return changed
            self._cached = None  # changed under us: read it again
