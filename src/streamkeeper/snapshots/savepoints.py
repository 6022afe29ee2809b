"""The savepoint registry: `lineages/{lineage}/savepoints/registry.json`.

One object per lineage lists its savepoints (the single source of truth: nothing is
found by listing folders), each `pending` while it is taken, `complete` once its
manifest is written, `deleting` while its data is disposed of. An entry is forgotten
only after its data is gone. Every change is a compare-and-swap. A runner's change
carries its epoch and is refused below the registry's owner (a fenced runner can
neither register nor retire a savepoint); an operator's change (protect, delete from
the CLI) keeps the owner as it is.

What keeps a savepoint from deletion (retention, and `delete`): `protected` (a
rollback target, with a reason), `holds` (e.g. a pending upgrade that will restore
it), and any job record that says its job was restored from it. Pyspark-free.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from streamkeeper.errors import FencedError, SavepointError, UnknownSavepointError
from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.storage import ObjectStore
from streamkeeper.storage.confine import checked_name

REGISTRY_VERSION = 1
EntryState = Literal["pending", "complete", "deleting"]
SAVEPOINT_ID_PATTERN = r"sp-[0-9]{8}T[0-9]{6}-[0-9a-f]{8}"
# A rollback holds its target from before its first write until the start from it ran.
ROLLBACK_HOLDER = "rollback"
_SAVEPOINT_ID = re.compile(SAVEPOINT_ID_PATTERN)


def new_savepoint_id(now: float | None = None) -> str:
    """A fresh id that sorts by time and is unique across lineages."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"sp-{stamp}-{uuid.uuid4().hex[:8]}"


def check_savepoint_id(savepoint_id: str) -> str:
    """Raises UnknownSavepointError unless `savepoint_id` has a savepoint id's form."""
    if not _SAVEPOINT_ID.fullmatch(savepoint_id):
        raise UnknownSavepointError(
            f"{savepoint_id!r} is not a savepoint id (they look like sp-20270115T080000-1a2b3c4d;"
            " `streamkeeper savepoints JOB` lists a job's)"
        )
    return savepoint_id


@dataclass
class SavepointEntry:
    """One savepoint as the registry knows it."""

    id: str
    job: str
    lineage: str
    format: str  # native | canonical
    storage: str  # pinned | self_contained
    state: EntryState = "pending"
    epoch: int = 0  # the runner that took it
    created_at: float = field(default_factory=time.time)
    completed_at: float | None = None
    seq: int | None = None
    batch_id: int | None = None
    checkpoint_id: int | None = None  # pinned: the checkpoint it pins
    size: int | None = None
    command_id: str | None = None
    protected: bool = False
    protected_reason: str | None = None
    holds: dict[str, str] = field(default_factory=dict)  # holder -> why it needs it

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(
        cls, data: dict[str, Any], source: str = "a savepoint registry"
    ) -> SavepointEntry:
        """Raises UnsafePathError unless the id has the form ids are written with (it names
        the folder a delete removes: an empty one would be every savepoint's)."""
        checked_name(
            data.get("id"),
            SAVEPOINT_ID_PATTERN,
            what="savepoint",
            source=source,
            expected="a savepoint id (like sp-20270115T080000-1a2b3c4d)",
        )
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


@dataclass
class Registry:
    owner_epoch: int = 0
    savepoints: list[SavepointEntry] = field(default_factory=list)
    updated_at: float = 0.0
    version: int = REGISTRY_VERSION

    def find(self, savepoint_id: str) -> SavepointEntry | None:
        return next((e for e in self.savepoints if e.id == savepoint_id), None)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str = "a savepoint registry") -> Registry:
        return cls(
            owner_epoch=int(data.get("owner_epoch", 0)),
            savepoints=[SavepointEntry.from_json(e, source) for e in data.get("savepoints", [])],
            updated_at=float(data.get("updated_at", 0.0)),
        )


class SavepointRegistry:
    """Reads and changes one lineage's registry by compare-and-swap."""

    def __init__(self, store: ObjectStore, layout: LineageLayout) -> None:
        self.store = store
        self.layout = layout

    def read(self) -> Registry:
        data = self.store.read_json(self.layout.savepoint_registry)
        return Registry() if data is None else Registry.from_json(data, self._source)

    @property
    def _source(self) -> str:
        return f"the savepoint registry {self.layout.savepoint_registry!r}"

    def entry(self, savepoint_id: str) -> SavepointEntry:
        """Raises UnknownSavepointError naming the lineage's savepoints."""
        registry = self.read()
        found = registry.find(savepoint_id)
        if found is None:
            known = [e.id for e in registry.savepoints] or "none"
            raise UnknownSavepointError(
                f"no savepoint {savepoint_id!r} in lineage {self.layout.lineage!r} under "
                f"{self.layout.root.uri!r}; its savepoints: {known}"
            )
        return found

    def update(self, change: Callable[[Registry], None], epoch: int | None = None) -> Registry:
        """Apply `change` and store it (retried when someone wrote in between).

        Args:
            epoch: the runner's epoch (refused below the owner's, then the new owner);
                None for an operator's change, which keeps the owner.

        Raises:
            FencedError: a newer runner owns the registry.
        """
        while True:
            data, version = self.store.read_versioned(self.layout.savepoint_registry)
            registry = Registry() if data is None else Registry.from_json(data, self._source)
            if epoch is not None and registry.owner_epoch > epoch:
                raise FencedError(
                    f"runner epoch {epoch} of lineage {self.layout.lineage!r} is fenced: epoch "
                    f"{registry.owner_epoch} owns its savepoint registry; this runner stops "
                    "without changing its savepoints"
                )
            change(registry)
            if epoch is not None:
                registry.owner_epoch = epoch
            registry.updated_at = time.time()
            if self.store.write_if(self.layout.savepoint_registry, registry.to_json(), version):
                return registry

    def edit(self, savepoint_id: str, change: Callable[[SavepointEntry], None]) -> SavepointEntry:
        """Change one entry as an operator.

        Raises:
            UnknownSavepointError: no such entry.
        """
        self.entry(savepoint_id)  # a clear error before any write
        changed: list[SavepointEntry] = []

        def apply(registry: Registry) -> None:
            found = registry.find(savepoint_id)
            if found is None:
                raise UnknownSavepointError(f"savepoint {savepoint_id!r} was deleted meanwhile")
            change(found)
            changed.append(found)

        self.update(apply)
        return changed[-1]

    def protect(self, savepoint_id: str, reason: str) -> SavepointEntry:
        """Mark a savepoint as a rollback target: retention and delete leave it alone."""
        if not reason.strip():
            raise SavepointError(
                f"protecting {savepoint_id!r} needs a reason, e.g. --reason 'rollback target "
                "of the 2.3 upgrade'"
            )

        def mark(entry: SavepointEntry) -> None:
            entry.protected, entry.protected_reason = True, reason

        return self.edit(savepoint_id, mark)

    def unprotect(self, savepoint_id: str) -> SavepointEntry:
        def clear(entry: SavepointEntry) -> None:
            entry.protected, entry.protected_reason = False, None

        return self.edit(savepoint_id, clear)

    def hold(self, savepoint_id: str, holder: str, reason: str) -> SavepointEntry:
        """Keep a savepoint for `holder` (e.g. `upgrade:{run id}`) until it releases it."""
        return self.edit(savepoint_id, lambda entry: entry.holds.update({holder: reason}))

    def release(self, savepoint_id: str, holder: str) -> SavepointEntry:
        return self.edit(savepoint_id, lambda entry: entry.holds.pop(holder, None))


def savepoints_in_use(store: ObjectStore) -> dict[str, str]:
    """Savepoint id -> why a job still needs it: its job record says it was restored from
    it, or a rollback of it restored the tables to it and has not started it yet.

    A job record is rewritten at every start, so this names what the latest start of
    each job under the root was restored from (one listing of `jobs/`, two reads each).
    """
    used: dict[str, str] = {}
    for job in store.children("jobs"):
        record = store.read_json(f"jobs/{job}/job.json") or {}
        restored = record.get("restored_from_savepoint") or {}
        if restored.get("id"):
            used[str(restored["id"])] = f"job {job!r} was restored from it (its job record)"
        pending = store.read_json(f"jobs/{job}/rewind-pending.json") or {}
        if pending.get("savepoint"):
            used[str(pending["savepoint"])] = (
                f"a rollback of job {job!r} restores it and has not finished"
            )
    return used


def reasons_to_keep(entry: SavepointEntry, in_use: dict[str, str]) -> list[str]:
    """Why a savepoint must not be deleted (empty: it may be)."""
    reasons = []
    if entry.protected:
        reasons.append(f"it is protected ({entry.protected_reason})")
    reasons += [f"{holder} holds it ({why})" for holder, why in sorted(entry.holds.items())]
    if entry.id in in_use:
        reasons.append(in_use[entry.id])
    return reasons


def expired(
    entries: list[SavepointEntry],
    *,
    retained: int | None,
    max_age: float | None,
    now: float,
    in_use: dict[str, str],
) -> list[str]:
    """Ids of the complete savepoints retention deletes, oldest first.

    Beyond the newest `retained`, or older than `max_age`; never the newest, never one
    with a reason to keep it.
    """
    complete = sorted((e for e in entries if e.state == "complete"), key=lambda e: e.created_at)
    if not complete:
        return []
    kept_by_count = {e.id for e in complete[-retained:]} if retained else {e.id for e in complete}
    chosen = []
    for entry in complete[:-1]:
        too_many = entry.id not in kept_by_count
        too_old = max_age is not None and now - entry.created_at > max_age
        if (too_many or too_old) and not reasons_to_keep(entry, in_use):
            chosen.append(entry.id)
    return chosen


def locate(store: ObjectStore, savepoint_id: str) -> tuple[str, SavepointEntry]:
    """Find a savepoint by id under a storage root: (its lineage, its entry).

    One listing of `lineages/` and one registry read per lineage.

    Raises:
        UnknownSavepointError: no lineage has it.
    """
    check_savepoint_id(savepoint_id)
    for lineage in store.children("lineages"):
        key = f"lineages/{lineage}/savepoints/registry.json"
        data = store.read_json(key)
        found = None if data is None else Registry.from_json(data, repr(key)).find(savepoint_id)
        if found is not None:
            return lineage, found
    raise UnknownSavepointError(
        f"no savepoint {savepoint_id!r} under this root; `streamkeeper savepoints JOB` lists "
        "a job's savepoints (check --root: the spec's storage.root)"
    )
