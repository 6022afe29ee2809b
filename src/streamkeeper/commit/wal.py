"""Write-ahead-log manifests: which pre-committed files belong to which batch and table.

A manifest is keyed by the lineage's commit sequence number (seq), which is also the
Delta app transaction version used to commit it. It is written twice per micro-batch:
first as a *claim* (state `writing`, put-if-absent: the seq belongs to exactly one
runner, and recovery finds every batch that may have left files behind without
listing any table), then *sealed* (state `complete`, with the files the executors
wrote) before the batch returns to Spark, so before `commits/N`. See PROTOCOL.md.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from streamkeeper.errors import CorruptManifestError, FencedError
from streamkeeper.lineage.layout import LineageLayout, seq_of
from streamkeeper.storage import ObjectStore
from streamkeeper.storage.confine import (
    SINK_NAME_PATTERN,
    checked_name,
    confined_key,
    confined_uri,
)

MANIFEST_FORMAT = 1


@dataclass(frozen=True)
class DataFile:
    """One Parquet file written by an executor."""

    path: str  # relative to the table (append) or absolute location (merge staging)
    size: int
    rows: int
    stats: str
    writer: str  # "executor-id/pid" of the task that wrote it
    attempt: int = 0  # > 0: a retried task or stage; earlier attempts may have left files


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
    # writing: claimed, files being written | complete: sealed | void: swept by a newer
    # owner while unsealed (its runner's seal is refused)
    state: str = "complete"
    offsets_sha256: str | None = None  # of offsets/N: which batch N this is, exactly
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    created_at: float = field(default_factory=time.time)
    format: int = MANIFEST_FORMAT
    version: str | None = field(default=None, compare=False)  # the stored object's, if ours
    # Tables committed inside the batch (idempotent, at_least_once) -> the version holding it.
    versions: dict[str, int] = field(default_factory=dict, compare=False)
    epoch_voided: int | None = None  # void: the owner that swept it

    @property
    def complete(self) -> bool:
        return self.state == "complete"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        del data["version"], data["versions"]
        if self.epoch_voided is None:
            del data["epoch_voided"]
        return data

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
                    files=[DataFile(**f) for f in s.get("files", [])],
                    order_by=s.get("order_by"),
                )
                for name, s in data["sinks"].items()
            }
            fields = {k: data[k] for k in ("lineage", "seq", "query_id", "batch_id")}
            state = data.get("state", "complete")
            if state not in ("writing", "complete", "void"):
                raise ValueError(f"unknown state {state!r}")
            return cls(
                **fields,
                checkpoint_dir=data["checkpoint_dir"],
                epoch=data["epoch"],
                sinks=sinks,
                state=state,
                offsets_sha256=data.get("offsets_sha256"),
                token=data.get("token", ""),
                created_at=data["created_at"],
                epoch_voided=data.get("epoch_voided"),
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

    def claim(self, manifest: Manifest) -> bool:
        """Take `manifest.seq` for this batch (put-if-absent); False if another runner has it.

        The claim is written before any file of the batch, so a crash at any later point
        leaves a manifest that tells recovery where to look.
        """
        manifest.state = "writing"
        key = self.layout.manifest(manifest.seq)
        version = self.store.write_if(key, manifest.to_json(), None)
        if version is None:
            return False
        manifest.version = version
        return True

    def seal(self, manifest: Manifest) -> None:
        """Record the batch's files in its claimed manifest (compare-and-swap).

        Raises:
            FencedError: the claim is gone or changed: a newer runner's recovery resolved it.
        """
        manifest.state = "complete"
        key = self.layout.manifest(manifest.seq)
        version = self.store.write_if(key, manifest.to_json(), manifest.version)
        if version is None:
            raise FencedError(
                f"WAL manifest {key} was resolved by a newer runner of lineage "
                f"{self.layout.lineage!r} while this one (epoch {manifest.epoch}) wrote its "
                "batch; this runner stops without committing"
            )
        manifest.version = version

    def void(self, claim: Manifest, epoch: int) -> bool:
        """Make an unsealed claim unsealable before its files are swept (compare-and-swap
        on the version read): its runner's seal then fails, however late it comes.

        Returns:
            False if the claim changed since it was read (sealed, or voided by another).
        """
        if claim.version is None:
            return False
        claim.state = "void"
        claim.epoch_voided = epoch
        version = self.store.write_if(
            self.layout.manifest(claim.seq), claim.to_json(), claim.version
        )
        if version is None:
            return False
        claim.version = version
        return True

    def write(self, manifest: Manifest) -> None:
        """Rewrite a manifest this runner owns (recovery keeping part of one)."""
        self.store.write_json(self.layout.manifest(manifest.seq), manifest.to_json())

    def read(self, seq: int) -> Manifest | None:
        return self._load(self.layout.manifest(seq))

    def pending(self) -> list[Manifest]:
        """Every manifest not yet retired, in commit-sequence order."""
        manifests = [self._load(key) for key in self.store.list(self.layout.manifests)]
        return sorted((m for m in manifests if m is not None), key=lambda m: m.seq)

    def _load(self, key: str) -> Manifest | None:
        try:
            data, version = self.store.read_versioned(key)
        except ValueError as error:
            raise CorruptManifestError(
                f"WAL manifest {key} is not valid JSON ({error}); inspect it, and delete it "
                "only if its batch's checkpoint never completed"
            ) from None
        if data is None:
            return None
        if not isinstance(data, dict):
            raise CorruptManifestError(f"WAL manifest {key} is not a JSON object; inspect it")
        manifest = self._parse(data, key)
        manifest.version = version
        return manifest

    def pending_seqs(self) -> list[int]:
        return [seq_of(k) for k in self.store.list(self.layout.manifests)]

    def retire(self, seq: int) -> None:
        """Drop a manifest once its batch is committed everywhere or discarded."""
        # Staged rows first: a crash in between leaves a manifest that recovery resolves
        # again, never staged files that nothing points to.
        self.store.delete(self.store.list(self.layout.staging_prefix(seq)))
        self.store.delete([self.layout.manifest(seq)])

    def _parse(self, data: dict[str, Any], key: str) -> Manifest:
        manifest = Manifest.from_json(data, source=key)
        if manifest.lineage != self.layout.lineage:
            raise CorruptManifestError(
                f"WAL manifest {key} belongs to lineage {manifest.lineage!r}, not "
                f"{self.layout.lineage!r}; two jobs share one lineage directory: give them "
                "distinct lineage names"
            )
        self._confine(manifest, f"WAL manifest {key!r}")
        return manifest

    def _confine(self, manifest: Manifest, source: str) -> None:
        """Every file a manifest lists lies in its batch's own folder: an append file in
        the table's `sk-{lineage}/{seq}/`, a merge file in the WAL's staging folder of the
        seq and sink. A commit adds them to a table and a merge reads them: one planted
        elsewhere would make a table reference (and a vacuum delete) a file not ours.

        Raises:
            UnsafePathError: naming the first file (or sink) outside, and `source`.
        """
        for name, part in manifest.sinks.items():
            checked_name(
                name, SINK_NAME_PATTERN, what="sink", source=source, expected="a sink name"
            )
            if part.output == "append":
                folder = self.layout.precommit_dir(manifest.seq)
                for file in part.files:
                    confined_key(folder, file.path, what="file", source=source)
            else:
                folder = self.layout.staging(manifest.seq, name).uri
                for file in part.files:
                    confined_uri(folder, file.path, what="staged file", source=source)
