"""Source positions of a completed batch: what a restored query resumes from.

Spark keeps them in its checkpoint: `offsets/N` (one line per source, after the batch's
metadata: watermark, timestamp, confs), `commits/N` (the next watermark) and, per
source, a metadata log `sources/{i}/`: the file source lists there every file it
processed (its offset `{"logOffset": n}` only counts log entries); the rate source
keeps its start time. A savepoint carries all of it; a restore writes it into the fresh
checkpoint as batch 1 (batch 0 is the bootstrap over an empty input, see restore.py):

- file source: every file processed up to the savepoint, those of the savepoint's own
  batch in `sources/{i}/1` and the earlier ones in `sources/{i}/0` (the source's seen
  files are all of them; `split_last_batch` says why not all in 1), offsets
  `{"logOffset": 0}` then `{"logOffset": 1}`;
- any other source (rate, nats, delta): offsets 0 and 1 are the savepoint's offset (so
  batch 1 is empty), `sources/{i}/` files are copied as they were.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamkeeper.errors import CheckpointRestoreError
from streamkeeper.storage.confine import confined_path

_LOG_VERSION = "v1"


@dataclass(frozen=True)
class SourcePositions:
    """Where every source of a query stood after batch `batch_id`."""

    batch_id: int
    offsets: list[str | None]  # per source: its offset JSON as Spark wrote it (None: "-")
    batch_watermark_ms: int
    batch_timestamp_ms: int
    next_watermark_ms: int  # from commits/N: the watermark the next batch starts with
    # per source index: processed files (file source) or raw metadata-log files
    logs: dict[int, dict[str, Any]] = field(default_factory=dict)

    def to_manifest(self) -> dict[str, Any]:
        """The savepoint manifest's `source` field: {"offsets": ..., "log": ...}."""
        return {
            "offsets": {
                "batch_id": self.batch_id,
                "sources": self.offsets,
                "batch_watermark_ms": self.batch_watermark_ms,
                "batch_timestamp_ms": self.batch_timestamp_ms,
                "next_watermark_ms": self.next_watermark_ms,
            },
            "log": {str(index): log for index, log in self.logs.items()},
        }

    @classmethod
    def from_beginning(cls, sources: int) -> SourcePositions:
        """Before any input: for state written without a job's positions (file sources)."""
        return cls(
            batch_id=-1,
            offsets=[json.dumps({"logOffset": -1})] * sources,
            batch_watermark_ms=0,
            batch_timestamp_ms=0,
            next_watermark_ms=0,
            logs={i: {"kind": "file", "entries": []} for i in range(sources)},
        )

    @classmethod
    def from_manifest(
        cls, offsets: dict[str, Any] | None, log: dict[str, Any] | None
    ) -> SourcePositions | None:
        """Parse the manifest's `source.offsets` and `source.log` (None: no positions).

        Raises:
            CheckpointRestoreError: naming the missing field.
        """
        if offsets is None or offsets.get("sources") is None:
            return None
        try:
            return cls(
                batch_id=int(offsets["batch_id"]),
                offsets=list(offsets["sources"]),
                batch_watermark_ms=int(offsets["batch_watermark_ms"]),
                batch_timestamp_ms=int(offsets["batch_timestamp_ms"]),
                next_watermark_ms=int(offsets["next_watermark_ms"]),
                logs={int(index): value for index, value in (log or {}).items()},
            )
        except (KeyError, TypeError, ValueError) as error:
            raise CheckpointRestoreError(
                f"the savepoint's source positions are malformed ({type(error).__name__}: "
                f"{error}) in {offsets!r}; take the savepoint again"
            ) from None


def read_source_positions(checkpoint_dir: Path, batch_id: int) -> SourcePositions:
    """The positions after completed batch `batch_id` of a local Spark checkpoint.

    Raises:
        CheckpointRestoreError: the batch did not complete or its log entries are gone.
    """
    commit = _read_log(checkpoint_dir / "commits" / str(batch_id))
    offsets = _read_log(checkpoint_dir / "offsets" / str(batch_id))
    if commit is None or offsets is None:
        raise CheckpointRestoreError(
            f"batch {batch_id} of checkpoint {str(checkpoint_dir)!r} is not complete (or "
            "Spark purged its offsets/commits entries); take the savepoint of a completed "
            "batch that is still kept (spark.sql.streaming.minBatchesToRetain)"
        )
    metadata = json.loads(offsets[0]) if offsets else {}
    sources = [None if line == "-" else line for line in offsets[1:]]
    next_watermark = json.loads(commit[0]).get("nextBatchWatermarkMs", 0) if commit else 0
    logs = {}
    for index, offset in enumerate(sources):
        log = _source_log(checkpoint_dir / "sources" / str(index), offset, batch_id)
        if log is not None:
            logs[index] = log
    return SourcePositions(
        batch_id=batch_id,
        offsets=sources,
        batch_watermark_ms=int(metadata.get("batchWatermarkMs", 0)),
        batch_timestamp_ms=int(metadata.get("batchTimestampMs", 0)),
        next_watermark_ms=int(next_watermark),
        logs=logs,
    )


def file_log_offset(offset: str | None) -> int | None:
    """The file source's log offset, or None for any other source's offset."""
    if offset is None:
        return None
    try:
        parsed = json.loads(offset)
    except ValueError:
        return None
    if isinstance(parsed, dict) and set(parsed) == {"logOffset"}:
        return int(parsed["logOffset"])
    return None


def _source_log(folder: Path, offset: str | None, batch_id: int) -> dict[str, Any] | None:
    if not folder.is_dir():
        return None
    log_offset = file_log_offset(offset)
    if log_offset is None:  # e.g. the rate source's start time: copied verbatim
        files = {
            name: (folder / name).read_text()
            for name in sorted(os.listdir(folder))
            if name.isdigit() and int(name) <= batch_id
        }
        return {"kind": "files", "files": files}
    entries: dict[str, dict[str, Any]] = {}
    for name in sorted(os.listdir(folder), key=_log_order):
        number = name.removesuffix(".compact")
        if not number.isdigit() or int(number) > log_offset:
            continue
        for line in _read_log(folder / name) or []:
            entry = json.loads(line)
            if int(entry.get("batchId", 0)) <= log_offset:
                entries[entry["path"]] = entry
    return {"kind": "file", "entries": sorted(entries.values(), key=lambda e: e["path"])}


def _log_order(name: str) -> int:
    number = name.removesuffix(".compact")
    return int(number) if number.isdigit() else -1


def _read_log(path: Path) -> list[str] | None:
    """The lines after a metadata log entry's version line, or None if it is missing."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return None
    if not lines or lines[0] != _LOG_VERSION:
        raise CheckpointRestoreError(
            f"{str(path)!r} is not a Spark log entry of version {_LOG_VERSION} (first line "
            f"{lines[:1]!r}); the checkpoint was written by another Spark version"
        )
    return [line for line in lines[1:] if line]


def write_log(path: Path, lines: list[str]) -> None:
    """Write a Spark metadata log entry atomically (temp file, then rename).

    A Hadoop checksum (`.name.crc`) of an earlier version of the file is removed: it
    would no longer match.
    """
    write_text_atomically(path, "\n".join([_LOG_VERSION, *lines]))


def write_text_atomically(path: Path, text: str) -> None:
    """Write a checkpoint file as Spark does (temp file, rename); drop a stale checksum."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
    temp.write_text(text)
    (path.parent / f".{path.name}.crc").unlink(missing_ok=True)
    os.replace(temp, path)


def check_sources(positions: SourcePositions | None, kinds: list[str]) -> SourcePositions:
    """The positions to restore, checked against the new job's sources (in order).

    Args:
        positions: the savepoint's, or None (state written without positions).
        kinds: each new source's kind, "file" or "other" (bootstrap.run_bootstrap).

    Raises:
        CheckpointRestoreError: the sources do not match, naming the first that differs.
    """
    if positions is None:
        if any(kind != "file" for kind in kinds):
            raise CheckpointRestoreError(
                "the savepoint has no source positions (its state was written by the state "
                "processor API without based_on), so only file sources can start from the "
                "beginning, but the new job reads another source; write the savepoint with "
                "based_on=<a savepoint of this job> to carry its positions"
            )
        return SourcePositions.from_beginning(len(kinds))
    if len(kinds) != len(positions.offsets):
        raise CheckpointRestoreError(
            f"the savepoint has {len(positions.offsets)} source(s) but the new job reads "
            f"{len(kinds)}; restore into a job with the same sources"
        )
    for index, (kind, offset) in enumerate(zip(kinds, positions.offsets, strict=True)):
        if (kind == "file") != (file_log_offset(offset) is not None):
            was = "a file source" if file_log_offset(offset) is not None else "not a file source"
            raise CheckpointRestoreError(
                f"source {index} of the savepoint was {was} (offset {offset}) but the new "
                f"job's source {index} is {'a file source' if kind == 'file' else 'not'}; "
                "restore into a job that reads the same sources"
            )
    return positions


def write_restored_positions(
    checkpoint_dir: Path, positions: SourcePositions, bootstrap_offsets: list[str]
) -> None:
    """Turn the bootstrapped checkpoint (batch 0) into one that resumes at the savepoint.

    Writes `sources/`, `offsets/0` and `offsets/1`; `commits/1` comes after the state
    (write_restored_commit).

    Args:
        positions: checked by `check_sources`.
        bootstrap_offsets: the lines of the bootstrap's `offsets/0`: its metadata (the new
            job's confs) and one line per source of the empty input.
    """
    first, second = [], []
    for index, offset in enumerate(positions.offsets):
        folder = checkpoint_dir / "sources" / str(index)
        for stale in os.listdir(folder) if folder.is_dir() else []:
            (folder / stale).unlink()  # the empty bootstrap input's log (and its checksums)
        log = positions.logs.get(index)
        log_offset = file_log_offset(offset)
        if log_offset is not None:
            earlier, last = split_last_batch((log or {}).get("entries", []), log_offset)
            write_log(folder / "0", [json.dumps({**e, "batchId": 0}) for e in earlier])
            write_log(folder / "1", [json.dumps({**e, "batchId": 1}) for e in last])
            first.append(json.dumps({"logOffset": 0}))
            second.append(json.dumps({"logOffset": 1}))
            continue
        for name, text in ((log or {}).get("files") or {}).items():
            # The name comes from the savepoint's manifest: it stays in the source's folder.
            where = confined_path(folder, name, what="source log file", source="the savepoint")
            write_text_atomically(where, text)
        first.append("-" if offset is None else offset)
        second.append("-" if offset is None else offset)
    metadata = json.loads(bootstrap_offsets[0])
    restored = {
        **metadata,
        "batchWatermarkMs": positions.batch_watermark_ms,
        "batchTimestampMs": positions.batch_timestamp_ms,
    }
    write_log(checkpoint_dir / "offsets" / "0", [bootstrap_offsets[0], *first])
    write_log(checkpoint_dir / "offsets" / "1", [json.dumps(restored), *second])


def split_last_batch(
    entries: list[dict[str, Any]], log_offset: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A file source's processed files: (read before the savepoint's batch, read by it).

    The restored log keeps the first part under batch 0 and the second under batch 1.
    Spark, resuming after batch 1, builds batch 1's DataFrame once (`getBatch(0, 1)`: a V1
    source is primed with its last batch), over every file logged under 1: with all of a
    long-running job's files there, that was a listing of thousands of files (a Spark
    job above 32 paths) before the first new batch. The newest file (`batch_input`'s
    position) stays under batch 1 even when an earlier batch read it.
    """
    if not entries:
        return [], []
    newest = max(entries, key=lambda e: (e.get("timestamp", 0), e["path"]))
    earlier: list[dict[str, Any]] = []
    last: list[dict[str, Any]] = []
    for entry in entries:
        read_last = int(entry.get("batchId", log_offset)) >= log_offset or entry is newest
        (last if read_last else earlier).append(entry)
    return earlier, last


def write_restored_commit(checkpoint_dir: Path, positions: SourcePositions) -> None:
    """`commits/1`: the restored batch is complete; the query resumes at batch 2."""
    body = json.dumps({"nextBatchWatermarkMs": positions.next_watermark_ms})
    write_log(checkpoint_dir / "commits" / "1", [body])


def read_offsets_lines(checkpoint_dir: Path, batch_id: int) -> list[str]:
    """The lines of `offsets/N` after the version line."""
    lines = _read_log(checkpoint_dir / "offsets" / str(batch_id))
    if lines is None:
        raise CheckpointRestoreError(
            f"{str(checkpoint_dir)!r} has no offsets/{batch_id}; the bootstrap batch did not run"
        )
    return lines


def batch_input(checkpoint_dir: Path, batch_id: int) -> list[str | None]:
    """Where each source's input stood after batch `batch_id`, comparable across restores.

    A file source's offset counts entries of its own metadata log, which a canonical
    restore renumbers; its position here is the last file the batch read instead
    (`file:{path}`, by modification time then path, the order the source reads in). Any
    other source's offset (a NATS sequence, a Delta version) is its position as is. Reads
    `offsets/N` and, for file sources, only batch N's log entry (every tenth one is a
    compaction holding all entries, as the source itself reads it).
    """
    positions: list[str | None] = []
    for index, offset in enumerate(read_offsets_lines(checkpoint_dir, batch_id)[1:]):
        log_offset = file_log_offset(None if offset == "-" else offset)
        if log_offset is None:
            positions.append(None if offset == "-" else offset)
            continue
        folder = checkpoint_dir / "sources" / str(index)
        lines = _read_log(folder / str(log_offset))
        if lines is None:
            lines = _read_log(folder / f"{log_offset}.compact") or []
        entries = [json.loads(line) for line in lines]
        read = [e for e in entries if int(e.get("batchId", log_offset)) == log_offset]
        last = max(read, key=lambda e: (e.get("timestamp", 0), e["path"]), default=None)
        positions.append(None if last is None else f"file:{last['path']}")
    return positions
