"""Write-ahead-log manifests: which pre-committed files belong to which batch and table.

A manifest is written once per micro-batch, after the executors have written the
batch's Parquet files and before the batch returns to Spark (so before `commits/N`).
It is keyed by the lineage's commit sequence number, which is also the Delta app
transaction version used to commit it. See PROTOCOL.md.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from streamkeeper.errors import CorruptManifestError
from streamkeeper.lineage.layout import LineageLayout, seq_of
from streamkeeper.storage import ObjectStore

MANIFEST_FORMAT = 1


@dataclass(frozen=True)
class DataFile:
    """One Parquet file written by an executor."""

    path: str  # relative to the table (append) or absolute location (merge staging)
    size: int
    rows: int
    stats: str
    writer: str  # "executor-id/pid" of the task that wrote it


@dataclass
class SinkBatch:
    """The part of a batch destined for one table."""

    table: str
    output: str  # append | merge
    mode: str  # exactly_once | idempotent | at_least_once
    key: list[str] = field(default_factory=list)
    files: list[DataFile] = field(default_factory=list)
    order_by: str | None = None  # merge: the greatest value wins per key

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)


@dataclass
class Manifest:
    """The WAL entry of one micro-batch."""

    lineage: str
    seq: int
    query_id: str
    batch_id: int
    checkpoint_dir: str
    epoch: int
    sinks: dict[str, SinkBatch]
    created_at: float = field(default_factory=time.time)
    format: int = MANIFEST_FORMAT

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str) -> Manifest:
        try:
            if data.get("format") != MANIFEST_FORMAT:
                raise ValueError(f"unknown format {data.get('format')!r}")
            sinks = {
                name: SinkBatch(
                    table=s["table"],
                    output=s["output"],
                    mode=s["mode"],
                    key=list(s.get("key", [])),
                    files=[DataFile(**f) for f in s["files"]],
                    order_by=s.get("order_by"),
                )
                for name, s in data["sinks"].items()
            }
            fields = {k: data[k] for k in ("lineage", "seq", "query_id", "batch_id")}
            return cls(
                **fields,
                checkpoint_dir=data["checkpoint_dir"],
                epoch=data["epoch"],
                sinks=sinks,
                created_at=data["created_at"],
            )
        except (AttributeError, KeyError, TypeError, ValueError) as error:
            raise CorruptManifestError(
                f"WAL manifest {source} is corrupt ({type(error).__name__}: {error}); "
                "inspect it, and delete it only if its batch's checkpoint never completed"
            ) from None


class WriteAheadLog:
    """Manifests of one lineage in the object store."""

    def __init__(self, store: ObjectStore, layout: LineageLayout) -> None:
        self.store = store
        self.layout = layout

    def write(self, manifest: Manifest) -> None:
        self.store.write_json(self.layout.manifest(manifest.seq), manifest.to_json())

    def read(self, seq: int) -> Manifest | None:
        return self._load(self.layout.manifest(seq))

    def pending(self) -> list[Manifest]:
        """Every manifest not yet retired, in commit-sequence order."""
        manifests = [self._load(key) for key in self.store.list(self.layout.manifests)]
        return sorted((m for m in manifests if m is not None), key=lambda m: m.seq)

    def _load(self, key: str) -> Manifest | None:
        try:
            data = self.store.read_json(key)
        except ValueError as error:
            raise CorruptManifestError(
                f"WAL manifest {key} is not valid JSON ({error}); inspect it, and delete it "
                "only if its batch's checkpoint never completed"
            ) from None
        if data is None:
            return None
        if not isinstance(data, dict):
            raise CorruptManifestError(f"WAL manifest {key} is not a JSON object; inspect it")
        return self._parse(data, key)

    def pending_seqs(self) -> list[int]:
        return [seq_of(k) for k in self.store.list(self.layout.manifests)]

    def retire(self, seq: int) -> None:
        """Drop a manifest once its batch is committed everywhere or discarded."""
        staged = self.store.list(self.layout.staging_prefix(seq))
        self.store.delete([self.layout.manifest(seq)])
        self.store.delete(staged)

    def _parse(self, data: dict[str, Any], key: str) -> Manifest:
        manifest = Manifest.from_json(data, source=key)
        if manifest.lineage != self.layout.lineage:
            raise CorruptManifestError(
                f"WAL manifest {key} belongs to lineage {manifest.lineage!r}, not "
                f"{self.layout.lineage!r}; two jobs share one lineage directory: give them "
                "distinct lineage names"
            )
        return manifest
