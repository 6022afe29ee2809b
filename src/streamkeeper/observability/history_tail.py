"""The last rows of a checkpoint history table, read from the tail of its Delta log.

`CheckpointHistory.read(last=N)` opens the table, which loads the add action of every
data file (a lineage's history grows by one file per flush, forever): fine for a chart,
too much for a status asked for every few seconds of every job. The runner only ever
appends, one small file per commit, so the last rows are in the files the newest commits
added. This reader lists the log's commit files after a point below the last log
checkpoint (`_last_checkpoint` says where it is), reads the newest commits' add actions,
and then only those data files, moving the point down geometrically until it has enough
rows. Anything other than a plain append in that tail (a remove: compaction, a delete),
a log cleaned up below it, or a data file gone sends it to the full reader, which is
always right.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from streamkeeper.observability.history import CheckpointHistory, normalize
from streamkeeper.storage.parquet import open_parquet_whole

if TYPE_CHECKING:
    from streamkeeper.storage import Location, ObjectStore

_COMMIT = re.compile(r"(\d{20})\.json")
_VERSION_WIDTH = 20


class _NotAPlainAppendTail(Exception):
    """The tail holds something other than appends; the full reader decides."""


class HistoryTail:
    """Reads the newest rows of the history table at `location` (key `prefix` in `store`)."""

    def __init__(self, store: ObjectStore, prefix: str, location: Location) -> None:
        self.store = store
        self.log = f"{prefix}/_delta_log"
        self.location = location

    def read(self, last: int) -> list[dict[str, Any]]:
        """The last `last` checkpoints, ordered by id (as `CheckpointHistory.read`)."""
        try:
            rows = self._tail(last)
        except (_NotAPlainAppendTail, OSError):  # OSError: a file vacuumed meanwhile
            rows = None
        if rows is None:
            return CheckpointHistory(self.location).read(last=last)
        return rows

    def _tail(self, last: int) -> list[dict[str, Any]] | None:
        top = self._checkpoint_version()
        if top is None and not self.store.exists(f"{self.log}/{0:0{_VERSION_WIDTH}d}.json"):
            return []  # no table yet
        step = max(last, 16)  # at least one row per commit: `last` commits usually do
        while True:
            start = None if top is None else top - step
            after = None if start is None or start < 0 else f"{self.log}/{start:0{_VERSION_WIDTH}d}"
            versions = self._commits(after)
            rows = self._rows_of(versions, last)
            if len(rows) >= last or after is None:
                if after is None and versions and versions[0][0] != 0 and len(rows) < last:
                    return None  # the log was cleaned up below: only the table knows more
                ordered = [rows[i] for i in sorted(rows)]
                return ordered[-last:]
            step *= 16

    def _checkpoint_version(self) -> int | None:
        pointer = self.store.read_json(f"{self.log}/_last_checkpoint")
        return None if pointer is None else int(pointer["version"])

    def _commits(self, after: str | None) -> list[tuple[int, str]]:
        """(version, key) of the log's commit files after `after`, oldest first."""
        found = []
        for key in self.store.list(self.log, start_after=after):
            match = _COMMIT.fullmatch(key.rsplit("/", 1)[-1])
            if match:
                found.append((int(match.group(1)), key))
        return found

    def _rows_of(self, versions: list[tuple[int, str]], last: int) -> dict[int, dict[str, Any]]:
        """Rows by checkpoint id from the newest commits' files, until `last` are found."""
        rows: dict[int, dict[str, Any]] = {}
        for _, key in reversed(versions):
            for path in self._added_files(key):
                for raw in self._read_file(path):
                    row = normalize(raw)
                    if row is not None:
                        rows.setdefault(row["checkpoint_id"], row)  # a newer file's row wins
            if len(rows) >= last:
                break
        return rows

    def _added_files(self, key: str) -> list[str]:
        paths = []
        with self._open(key) as stream:
            for line in stream.read().decode().splitlines():
                action = json.loads(line) if line.strip() else {}
                if "remove" in action:
                    raise _NotAPlainAppendTail(key)
                if "add" in action:
                    paths.append(unquote(action["add"]["path"]))
        return paths

    def _open(self, key: str) -> Any:
        name = key.rsplit("/", 1)[-1]
        path = f"{self.location.fs_path}/_delta_log/{name}"
        return self.location.arrow_filesystem().open_input_stream(path)

    def _read_file(self, path: str) -> list[dict[str, Any]]:
        # One small file: read it as a file (no dataset discovery) on this thread (no
        # thread pool hand-offs); both cost more than the rows for a file this size.
        full = f"{self.location.fs_path}/{path}"
        file = open_parquet_whole(self.location.arrow_filesystem(), full)
        return file.read(use_threads=False).to_pylist()
