"""Read-only view of Spark's checkpoint directory: the commit log is our barrier.

Spark writes `offsets/N` before batch N runs and `commits/N` after its sink returned,
so "checkpoint N complete" means `commits/N` exists.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


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
        return self.commit_path(batch_id).exists()

    def completed_at(self, batch_id: int) -> float | None:
        """When `commits/N` was written (the batch's end), or None."""
        try:
            return os.stat(self.commit_path(batch_id)).st_mtime
        except FileNotFoundError:
            return None

    def latest_complete(self) -> int | None:
        folder = self.directory / "commits"
        if not folder.is_dir():
            return None
        ids = [int(p.name) for p in folder.iterdir() if p.name.isdigit()]
        return max(ids) if ids else None

    def belongs_to(self, query_id: str) -> bool:
        return self.query_id() == query_id
