"""A canonical restore's work folder, and the sweep of those a killed restore left.

A restore writes the new checkpoint in `.{checkpoint}.restore-{id}` beside it and
renames it into place when whole; a restore that fails removes its folder, but a killed
one cannot. Each folder names its owner (host and process id), so the next restore into
the same directory removes the folders of owners that are gone: restarting a crashing
job does not pile up copies of its state. A folder of another host is removed only when
older than `FOREIGN_STALE_SECONDS` (its owner's liveness cannot be seen from here), and
one whose process id now belongs to another process is kept until that one ends.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import time
import uuid
from pathlib import Path

log = logging.getLogger(__name__)

OWNER_FILE = "owner.json"
FOREIGN_STALE_SECONDS = 24 * 3600.0


def create_work_folder(checkpoint_dir: Path) -> Path:
    """A fresh work folder beside `checkpoint_dir` (same file system: one rename moves
    the finished checkpoint into place), owned by this process."""
    work = checkpoint_dir.parent / f"{_prefix(checkpoint_dir)}{uuid.uuid4().hex[:8]}"
    work.mkdir(parents=True)
    owner = {"host": socket.gethostname(), "pid": os.getpid(), "created_at": time.time()}
    (work / OWNER_FILE).write_text(json.dumps(owner))
    return work


def sweep_stale_work_folders(checkpoint_dir: Path, now: float | None = None) -> list[Path]:
    """Remove the work folders of restores into `checkpoint_dir` whose owner is gone;
    returns what was removed."""
    now = time.time() if now is None else now
    removed = []
    for folder in sorted(checkpoint_dir.parent.glob(f"{_prefix(checkpoint_dir)}*")):
        if folder.is_dir() and _is_stale(folder, now):
            shutil.rmtree(folder, ignore_errors=True)
            log.info("restore: removed %s, left by a restore that did not finish", folder)
            removed.append(folder)
    return removed


def _prefix(checkpoint_dir: Path) -> str:
    return f".{checkpoint_dir.name}.restore-"


def _is_stale(folder: Path, now: float) -> bool:
    try:
        owner = json.loads((folder / OWNER_FILE).read_text())
        host, pid = str(owner["host"]), int(owner["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        # Killed before it named its owner (or written by an older version): by age.
        return _age(folder, now) > FOREIGN_STALE_SECONDS
    if host != socket.gethostname():
        return _age(folder, now) > FOREIGN_STALE_SECONDS
    return pid != os.getpid() and not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _age(folder: Path, now: float) -> float:
    try:
        return now - folder.stat().st_mtime
    except FileNotFoundError:
        return 0.0
