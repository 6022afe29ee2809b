"""The sweep of work folders a killed canonical restore left beside its checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamkeeper.state.work_folders import (
    FOREIGN_STALE_SECONDS,
    OWNER_FILE,
    create_work_folder,
    sweep_stale_work_folders,
)


@pytest.fixture
def ended_pid() -> int:
    """The id of a process that has ended (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.fixture
def running_pid() -> Iterator[int]:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield child.pid
    finally:
        child.kill()
        child.wait()


def _owned_by(folder: Path, pid: int, host: str | None = None) -> Path:
    owner = json.loads((folder / OWNER_FILE).read_text())
    owner.update(pid=pid, **({} if host is None else {"host": host}))
    (folder / OWNER_FILE).write_text(json.dumps(owner))
    (folder / "checkpoint").mkdir()  # what a restore writes there
    return folder


def test_a_folder_whose_owner_ended_is_removed_and_live_owners_keep_theirs(
    tmp_path: Path, ended_pid: int, running_pid: int
) -> None:
    checkpoint = tmp_path / "ck"
    dead = _owned_by(create_work_folder(checkpoint), ended_pid)
    live = _owned_by(create_work_folder(checkpoint), running_pid)
    mine = create_work_folder(checkpoint)
    other_checkpoint = _owned_by(create_work_folder(tmp_path / "ck2"), ended_pid)

    assert sweep_stale_work_folders(checkpoint) == [dead]
    assert not dead.exists()
    assert live.is_dir() and mine.is_dir() and other_checkpoint.is_dir()
    assert dead.name.startswith(".ck.restore-")


def test_a_folder_of_another_host_or_of_no_named_owner_goes_only_when_old(
    tmp_path: Path, ended_pid: int
) -> None:
    checkpoint = tmp_path / "ck"
    foreign = _owned_by(create_work_folder(checkpoint), ended_pid, host="another-host")
    unnamed = create_work_folder(checkpoint)
    (unnamed / OWNER_FILE).unlink()  # killed between creating it and naming its owner
    now = time.time()

    assert sweep_stale_work_folders(checkpoint, now=now) == []
    old = now - FOREIGN_STALE_SECONDS - 60
    os.utime(foreign, (old, old))
    assert sweep_stale_work_folders(checkpoint, now=now) == [foreign]
    assert unnamed.is_dir()
    assert sweep_stale_work_folders(checkpoint, now=now + FOREIGN_STALE_SECONDS + 60) == [unnamed]


def test_no_folder_no_parent_is_nothing_to_sweep(tmp_path: Path) -> None:
    assert sweep_stale_work_folders(tmp_path / "absent" / "ck") == []
