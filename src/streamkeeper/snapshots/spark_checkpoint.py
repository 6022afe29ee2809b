"""Read-only view of Spark's checkpoint directory: the commit log is our barrier.

Spark writes `offsets/N` before batch N runs and `commits/N` after its sink returned,
so "checkpoint N complete" means `commits/N` exists, or that a later batch completed:
Spark purges log entries older than `spark.sql.streaming.minBatchesToRetain`, and
batches complete in order.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from streamkeeper.snapshots.manifest import is_temporary


class SparkCheckpoint:
    """A local (or mounted) Spark checkpoint directory."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def query_id(self) -> str | None:
        """The id Spark persists in `metadata`; it is the same across restarts."""
        try:
            return json.loads((self.directory / "metadata").read_text().splitlines()[0])["id"]
        except (FileNotFoundError, IndexError, KeyError, ValueError):
            return None

    def commit_path(self, batch_id: int) -> Path:
        return self.directory / "commits" / str(batch_id)

    def is_complete(self, batch_id: int) -> bool:
        return self.completed_at(batch_id) is not None

    def completed_at(self, batch_id: int) -> float | None:
        """When batch N ended (`commits/N` written), or None if it has not completed.

        A batch whose `commits/N` Spark already purged completed before the oldest one
        kept: its end time is no longer known, so the oldest kept entry's time stands in.
        """
        try:
            return os.stat(self.commit_path(batch_id)).st_mtime
        except FileNotFoundError:
            pass
        kept = self._commit_ids()
        if kept and batch_id < kept[0]:
            return os.stat(self.commit_path(kept[0])).st_mtime
        return None

    def _commit_ids(self) -> list[int]:
        folder = self.directory / "commits"
        try:
            return sorted(int(name) for name in os.listdir(folder) if name.isdigit())
        except FileNotFoundError:
            return []

    def offsets_sha256(self, batch_id: int) -> str | None:
        """The hash of `offsets/N`: which batch N this is (two runs may plan N differently)."""
        try:
            return hashlib.sha256(
                (self.directory / "offsets" / str(batch_id)).read_bytes()
            ).hexdigest()
        except FileNotFoundError:
            return None

    def latest_complete(self) -> int | None:
        ids = self._commit_ids()
        return ids[-1] if ids else None

    def belongs_to(self, query_id: str) -> bool:
        return self.query_id() == query_id

    def sweep_unfinished_writes(self) -> list[str]:
        """Delete the temp files of log writes a killed driver left; their names.

        Spark writes `offsets/N` and `commits/N` as `.N.<uuid>.tmp` (and its checksum)
        renamed into place. Its logs skip such files when they read, but a new query's check
        that `offsets/` and `commits/` are empty (`verifyCheckpointDirectoryEmptyOnStart`,
        on by default) counts them: a driver killed while it wrote `offsets/0` could never
        start again. Call it only while holding the lineage: nobody else writes these logs.
        """
        removed = []
        for log_name in ("offsets", "commits"):
            folder = self.directory / log_name
            try:
                names = os.listdir(folder)
            except FileNotFoundError:
                continue
            for name in sorted(names):
                if is_temporary(name):
                    (folder / name).unlink(missing_ok=True)
                    removed.append(f"{log_name}/{name}")
        return removed
