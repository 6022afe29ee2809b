"""A Delta table's commits read from its log, and what a stream of appends makes of them.

Pyspark-free: the Delta source plans batches with it, and the stable view
(`streamkeeper.stable`) checks with it whether a table was restored.

A RESTORE to version t, committed as version r, makes the table what it was at t: the
versions between t and r are retracted. Walking back from a batch's end, a reader jumps
from r to t, so a retracted version is never read (`visible_commits`). A restore to a
version below what a stream already read retracts rows it cannot un-read: the stream
stops (`RestoredBelowReadError`) unless it accepts that.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from streamkeeper.errors import SourceError
from streamkeeper.storage import Location

# Commits that only rearrange rows already in the table (dataChange=false).
REARRANGING_OPERATIONS = frozenset({"OPTIMIZE"})
RESTORE = "RESTORE"


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


class DeletionVectorError(SourceError):
    """A commit in a batch's range marked rows deleted with deletion vectors."""

    def __init__(self, table: str, version: int, operation: str | None, files: int) -> None:
        self.version = version
        super().__init__(
            f"Delta table {table!r} version {version} ({operation or 'unknown operation'}) "
            f"wrote deletion vectors for {files} file(s): rows were deleted in place, which "
            "cannot be streamed as appends (this source reads whole Parquet files). Stream a "
            "table without deletion vectors (delta.enableDeletionVectors=false), set "
            "source.options.skipChangeCommits: true to skip such commits (their changes are "
            "not streamed), or start a new checkpoint with "
            f"source.options.startingVersion: {version + 1}"
        )


class RestoredBelowReadError(SourceError):
    """The table was restored to a version below rows this stream already read."""

    def __init__(
        self, table: str, version: int, target: int | None, read_from: int, read_to: int, files: int
    ) -> None:
        self.version = version
        self.target = target
        to = "an unrecorded version" if target is None else f"version {target}"
        super().__init__(
            f"Delta table {table!r} was restored at version {version} to {to}, below what "
            f"this stream already read: {files} file(s) that versions {read_from}..{read_to} "
            "appended were retracted after it read them (a rollback of the job writing the "
            "table), and a stream cannot un-read them. Roll this job back too, to a "
            "savepoint or checkpoint of its own taken before it read past "
            f"{to} (its source offset), and restart it from there; or, to keep what it read "
            "and go on with what the table holds after the restore (those rows may then "
            "come twice), set source.options.acceptRestores: true"
        )


@dataclass(frozen=True)
class DataFile:
    """One Parquet file a commit added."""

    uri: str
    size: int
    partition_values: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Commit:
    """What one table version did, from its commit file."""

    version: int
    operation: str | None = None
    added: tuple[DataFile, ...] = ()  # in path order
    removed: int = 0  # remove actions
    deletion_vectors: int = 0  # add actions carrying a deletion vector
    restored_to: int | None = None  # a RESTORE's target version (None: not recorded)

    @property
    def is_restore(self) -> bool:
        return self.operation == RESTORE


def parse_commit(root: str, version: int, lines: Iterable[str]) -> Commit:
    """The actions of commit file `version` (one JSON action per line) of table `root`."""
    operation: str | None = None
    restored_to: int | None = None
    added: dict[str, DataFile] = {}
    removed = deletion_vectors = 0
    for line in lines:
        if not line.strip():
            continue
        action = json.loads(line)
        if "commitInfo" in action:
            info = action["commitInfo"] or {}
            operation = info.get("operation")
            restored_to = _restore_target(info.get("operationParameters"))
        elif "remove" in action:
            removed += 1
        elif "add" in action:
            add = action["add"]
            if add.get("deletionVector"):
                deletion_vectors += 1
            values = tuple(sorted((add.get("partitionValues") or {}).items()))
            added[add["path"]] = DataFile(_file_uri(root, add["path"]), add["size"], values)
    return Commit(
        version=version,
        operation=operation,
        added=tuple(added[path] for path in sorted(added)),
        removed=removed,
        deletion_vectors=deletion_vectors,
        restored_to=restored_to if operation == RESTORE else None,
    )


def _restore_target(parameters: Any) -> int | None:
    """delta-rs and Delta on Spark both record `{"version": "4"}` (a restore by time may not)."""
    raw = (parameters or {}).get("version") if isinstance(parameters, dict) else None
    text = str(raw).strip() if raw is not None else ""
    return int(text) if text.isdigit() else None


def _file_uri(root: str, path: str) -> str:
    decoded = unquote(path)  # log paths are URL-encoded; storage keys are not
    if "://" in decoded or decoded.startswith("/"):
        return decoded
    return root.rstrip("/") + "/" + decoded


def first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def read_commit(location: Location, version: int) -> Commit:
    """Commit `version` of the table, from `_delta_log/{version:020}.json`.

    Raises:
        SourceError: the commit file is gone (the log was cleaned up) or unreadable.
    """
    try:
        return _read(location, version)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise SourceError(
            f"cannot read version {version} of Delta table {location.uri!r} "
            f"({type(error).__name__}: {first_line(error)}); if its log was cleaned up, "
            "start a new checkpoint with a later source.options.startingVersion"
        ) from None


def read_commit_if_any(location: Location, version: int) -> Commit | None:
    """Commit `version`, or None if the table has no such version (yet)."""
    try:
        return _read(location, version)
    except FileNotFoundError:
        return None


def _read(location: Location, version: int) -> Commit:
    path = f"{location.fs_path}/_delta_log/{version:020d}.json"
    with location.arrow_filesystem().open_input_stream(path) as stream:
        text = stream.read().decode("utf-8")
    return parse_commit(location.uri, version, text.splitlines())


def appended_files(
    table: str, commit: Commit, *, skip_change_commits: bool = False
) -> list[DataFile]:
    """The files `commit` appended (a RESTORE appends none: it only brings back old files).

    Raises:
        DeletionVectorError: the commit marked rows deleted with deletion vectors.
        NotAppendOnlyError: the commit removed files and is neither a rearrangement
            (OPTIMIZE) nor skipped by `skip_change_commits`.
    """
    if commit.is_restore:
        return []
    if not commit.removed and not commit.deletion_vectors:
        return list(commit.added)
    if commit.operation in REARRANGING_OPERATIONS or skip_change_commits:
        return []
    if commit.deletion_vectors:
        raise DeletionVectorError(table, commit.version, commit.operation, commit.deletion_vectors)
    raise NotAppendOnlyError(table, commit.version, commit.operation, commit.removed)


def visible_commits(
    start: int,
    end: int,
    commit_at: Callable[[int], Commit],
    on_restore_below: Callable[[Commit], None] | None = None,
) -> list[Commit]:
    """The commits in (start, end] that the table still holds at `end`, oldest first.

    Walks back from `end`: a RESTORE to version t takes the walk to t, so the versions it
    retracted are neither read nor returned (the RESTORE itself is, as a valid batch end
    that appends nothing). The walk from any returned version visits exactly the returned
    versions below it, so a batch may end at any of them and be planned again the same way.

    Args:
        commit_at: reads (or remembers) one commit.
        on_restore_below: called with a RESTORE whose target lies below `start` (or is not
            recorded): it retracted versions a stream at `start` has already passed. It
            raises to stop; if it returns, the walk ends there.
    """
    visited: list[Commit] = []
    version = end
    while version > start:
        commit = commit_at(version)
        visited.append(commit)
        if not commit.is_restore:
            version -= 1
            continue
        target = commit.restored_to
        if target is None or target < start:
            if on_restore_below is not None:
                on_restore_below(commit)
            break
        version = min(target, commit.version - 1)
    visited.reverse()
    return visited


def files_read_before(
    table: str, restore: Commit, start: int, first: int, commit_at: Callable[[int], Commit]
) -> tuple[int, list[DataFile]]:
    """What a stream at `start` (which began at version `first`) read of what `restore`
    retracted: the first version retracted, and the files of the versions it read."""
    floor = max(-1 if restore.restored_to is None else restore.restored_to, first - 1)
    read = visible_commits(floor, start, commit_at)
    files = [f for c in read for f in appended_files(table, c, skip_change_commits=True)]
    return floor + 1, files
