"""The control plane on a local store: epochs, fencing, live-runner detection, heartbeats."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamkeeper.errors import AlreadyRunningError, FencedError
from streamkeeper.lineage.control import ControlPlane, Heartbeat, Lease
from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.storage import LocalStore, Location


@pytest.fixture
def control(tmp_path: Path) -> ControlPlane:
    layout = LineageLayout(Location(str(tmp_path)), "lin", "job")
    return ControlPlane(LocalStore(tmp_path), layout)


def write_heartbeat(control: ControlPlane, **fields: object) -> None:
    beat = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "state": "RUNNING",
        "time": time.time(),
        "epoch": 1,
    }
    beat.update(fields)
    control.store.write_json(control.layout.heartbeat, beat)


def dead_pid() -> int:
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(child.stdout)


def test_acquire_takes_increasing_epochs(control: ControlPlane) -> None:
    assert control.latest_epoch() == 0
    leases = [control.acquire() for _ in range(3)]
    assert [lease.epoch for lease in leases] == [1, 2, 3]
    assert control.latest_epoch() == 3
    assert all(lease.pid == os.getpid() for lease in leases)
    runner = control.store.read_json(control.layout.runner)
    assert runner["epoch"] == 3 and runner["job"] == "job"


def test_older_lease_is_fenced(control: ControlPlane) -> None:
    old = control.acquire()
    control.check_not_fenced(old)  # nobody newer yet
    new = control.acquire()
    with pytest.raises(FencedError) as caught:
        control.check_not_fenced(old)
    message = str(caught.value)
    assert "epoch 1" in message and "epoch 2" in message and "'lin'" in message
    control.check_not_fenced(new)


def test_epoch_race_skips_a_taken_epoch(control: ControlPlane) -> None:
    control.acquire()
    # Another runner took epoch 2 between our list and our put: create must not overwrite it.
    assert control.store.create_json(control.layout.epoch(2), {"pid": -7}) is True
    assert control.acquire().epoch == 3
    assert control.store.read_json(control.layout.epoch(2)) == {"pid": -7}


def test_live_runner_blocks_acquire(control: ControlPlane) -> None:
    control.acquire()
    write_heartbeat(control, epoch=1)
    with pytest.raises(AlreadyRunningError) as caught:
        control.acquire()
    message = str(caught.value)
    assert f"pid {os.getpid()}" in message and "epoch 1" in message and "--takeover" in message
    assert control.latest_epoch() == 1  # refused without taking an epoch


def test_takeover_fences_the_live_runner(control: ControlPlane) -> None:
    first = control.acquire()
    write_heartbeat(control, epoch=1)
    assert control.acquire(takeover=True).epoch == 2
    with pytest.raises(FencedError):
        control.check_not_fenced(first)


def test_dead_pid_does_not_block(control: ControlPlane) -> None:
    control.acquire()
    write_heartbeat(control, pid=dead_pid())
    assert control.acquire().epoch == 2


@pytest.mark.parametrize("state", ["STOPPED", "FAILED", "FINISHED"])
def test_ended_runner_does_not_block(control: ControlPlane, state: str) -> None:
    write_heartbeat(control, state=state)
    assert control.acquire().epoch == 1


def test_remote_runner_alive_until_heartbeat_is_stale(control: ControlPlane) -> None:
    write_heartbeat(control, host="some-other-host", pid=1)
    with pytest.raises(AlreadyRunningError, match="some-other-host"):
        control.acquire()
    write_heartbeat(control, host="some-other-host", pid=1, time=time.time() - 120)
    assert control.acquire().epoch == 1


def test_heartbeat_thread_reports_states_and_facts(control: ControlPlane) -> None:
    lease = Lease(epoch=4, pid=os.getpid(), host=socket.gethostname(), started_at=time.time())
    beat = Heartbeat(control, lease, facts=lambda: {"last_seq": 11}, interval=0.02)
    beat.start()
    assert control.heartbeat()["state"] in ("STARTING", "RUNNING")
    deadline = time.monotonic() + 5
    while control.heartbeat()["state"] != "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert control.heartbeat()["state"] == "RUNNING"
    beat.stop("FINISHED", reason="done")
    final = control.heartbeat()
    assert (final["state"], final["epoch"], final["last_seq"], final["reason"]) == (
        "FINISHED",
        4,
        11,
        "done",
    )
    assert control.acquire().epoch == 1  # a finished runner does not block
