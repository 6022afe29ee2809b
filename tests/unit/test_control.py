"""The control plane on a local store: epochs, fencing, live-runner detection, heartbeats."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from streamkeeper.errors import AlreadyRunningError, FencedError
from streamkeeper.lineage.control import ControlPlane, Fence, Lease, pid_namespace
from streamkeeper.lineage.heartbeat import Heartbeat
from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.storage import LocalStore, Location


@pytest.fixture
def control(tmp_path: Path) -> ControlPlane:
    layout = LineageLayout(Location(str(tmp_path)), "lin", "job")
    return ControlPlane(LocalStore(tmp_path), layout)


def write_heartbeat(control: ControlPlane, **fields: object) -> None:
    """A heartbeat of this process, or of one on another host if `host` is given."""
    beat = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "pid_namespace": None if "host" in fields else pid_namespace(),
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
    leases = [control.acquire(takeover=True) for _ in range(3)]
    assert [lease.epoch for lease in leases] == [1, 2, 3]
    assert control.latest_epoch() == 3
    assert all(lease.pid == os.getpid() for lease in leases)
    assert control.epoch_record(3)["token"] == leases[2].token


def test_latest_epoch_probes_from_the_heartbeat_instead_of_listing(
    control: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    for _ in range(5):
        control.acquire(takeover=True)
    write_heartbeat(control, epoch=3)  # a lower bound: epochs 4 and 5 exist beyond it

    def no_listing(*_args: object, **_kwargs: object) -> list[str]:
        raise AssertionError("latest_epoch listed every epoch")

    monkeypatch.setattr(control.store, "list", no_listing)
    assert control.latest_epoch() == 5


def test_older_lease_is_fenced(control: ControlPlane) -> None:
    old = control.acquire()
    control.check_not_fenced(old)  # nobody newer yet
    new = control.acquire(takeover=True)
    with pytest.raises(FencedError) as caught:
        control.check_not_fenced(old)
    message = str(caught.value)
    assert "epoch 1" in message and "epoch 2" in message and "'lin'" in message
    control.check_not_fenced(new)


def test_epoch_race_skips_a_taken_epoch(control: ControlPlane) -> None:
    control.acquire()
    # Another runner took epoch 2 between our look and our put: create must not overwrite it.
    assert control.store.create_json(control.layout.epoch(2), {"pid": -7}) is True
    assert control.acquire(takeover=True).epoch == 3
    assert control.store.read_json(control.layout.epoch(2)) == {"pid": -7}


def test_live_runner_blocks_acquire(control: ControlPlane) -> None:
    control.acquire()
    write_heartbeat(control, epoch=1)
    with pytest.raises(AlreadyRunningError) as caught:
        control.acquire()
    message = str(caught.value)
    assert f"pid {os.getpid()}" in message and "epoch 1" in message and "--takeover" in message
    assert control.latest_epoch() == 1  # refused without taking an epoch


def test_a_starting_runner_blocks_before_its_first_heartbeat(control: ControlPlane) -> None:
    control.acquire()  # this (live) process took epoch 1 and has not beaten yet
    with pytest.raises(AlreadyRunningError):
        control.acquire()


def test_a_fenced_runners_final_state_does_not_free_the_lineage(control: ControlPlane) -> None:
    """Epoch 2 holds the lineage; epoch 1's STOPPED heartbeat says nothing about epoch 2."""
    control.acquire(takeover=True)
    control.acquire(takeover=True)
    write_heartbeat(control, epoch=1, state="STOPPED")
    with pytest.raises(AlreadyRunningError, match="epoch 2"):
        control.acquire()


def test_takeover_fences_the_live_runner(control: ControlPlane) -> None:
    first = control.acquire()
    write_heartbeat(control, epoch=1)
    assert control.acquire(takeover=True).epoch == 2
    with pytest.raises(FencedError):
        control.check_not_fenced(first)


def test_dead_pid_does_not_block(control: ControlPlane) -> None:
    control.store.create_json(control.layout.epoch(1), {"pid": dead_pid(), "host": "h"})
    write_heartbeat(control, pid=dead_pid())
    assert control.acquire().epoch == 2


def test_a_reused_pid_does_not_block(control: ControlPlane) -> None:
    """Our pid, but a process start time that is not ours: the recorded runner is gone."""
    write_heartbeat(control, process_started_at=12345.0)
    assert control.acquire().epoch == 1


@pytest.mark.parametrize("state", ["STOPPED", "FAILED", "FINISHED"])
def test_ended_runner_does_not_block(control: ControlPlane, state: str) -> None:
    control.store.create_json(control.layout.epoch(1), Lease.for_this_process(1).to_json())
    write_heartbeat(control, state=state)
    assert control.acquire().epoch == 2


def test_remote_runner_alive_until_heartbeat_is_stale(control: ControlPlane) -> None:
    control.store.create_json(control.layout.epoch(1), {"host": "some-other-host", "pid": 1})
    write_heartbeat(control, host="some-other-host", pid=1)
    with pytest.raises(AlreadyRunningError, match="some-other-host"):
        control.acquire()
    write_heartbeat(control, host="some-other-host", pid=1, time=time.time() - 120)
    assert control.acquire().epoch == 2


def test_a_host_of_the_same_name_is_told_apart_by_its_pid_namespace(
    control: ControlPlane,
) -> None:
    """Network namespaces and containers repeat hostnames: a runner that names this host
    but another pid namespace is judged by its heartbeat's age, never by a pid here
    (pid 1 is alive here, and means nothing)."""
    elsewhere = {"host": socket.gethostname(), "pid": 1, "pid_namespace": "other-boot/pid:[1]"}
    control.store.create_json(control.layout.epoch(1), {**elsewhere, "started_at": time.time()})
    write_heartbeat(control, **elsewhere, time=time.time() - 120)
    assert control.acquire().epoch == 2  # stale: gone, although pid 1 runs here
    write_heartbeat(control, **{**elsewhere, "pid": dead_pid()}, epoch=2)
    with pytest.raises(AlreadyRunningError):
        control.acquire()  # fresh: alive, although its pid is dead here


def test_a_clock_behind_costs_a_takeover_never_a_second_writer(control: ControlPlane) -> None:
    """A live runner on a host whose clock is 2 minutes behind looks stale: a start takes
    the lineage, and the runner it took it from is fenced (safety never reads a clock)."""
    remote = Lease(epoch=1, pid=1, host="skewed-host", started_at=time.time() - 120)
    control.store.create_json(control.layout.epoch(1), remote.to_json())
    write_heartbeat(control, host="skewed-host", pid=1, time=time.time() - 120)
    assert control.acquire().epoch == 2
    with pytest.raises(FencedError):
        control.check_not_fenced(remote)
    write_heartbeat(control, epoch=2)
    late = Heartbeat(control, Fence(control, remote), facts=dict)
    with pytest.raises(FencedError):
        late.beat("RUNNING")  # the skewed runner's next beat cannot overwrite the new one
    assert control.heartbeat()["epoch"] == 2


def test_a_clock_ahead_makes_a_start_wait_until_a_takeover(control: ControlPlane) -> None:
    """A dead runner whose clock ran an hour ahead looks alive: a plain start is refused
    (availability), a takeover proceeds and fences it."""
    ahead = Lease(epoch=1, pid=1, host="skewed-host", started_at=time.time() + 3600)
    control.store.create_json(control.layout.epoch(1), ahead.to_json())
    write_heartbeat(control, host="skewed-host", pid=1, time=time.time() + 3600)
    with pytest.raises(AlreadyRunningError, match="skewed-host"):
        control.acquire()
    assert control.acquire(takeover=True).epoch == 2
    with pytest.raises(FencedError):
        control.check_not_fenced(ahead)


def _heartbeat(control: ControlPlane, epoch: int, **facts: object) -> Heartbeat:
    fence = Fence(control, Lease.for_this_process(epoch))
    return Heartbeat(control, fence, facts=lambda: dict(facts), interval=0.02)


def test_heartbeat_thread_reports_states_and_facts(control: ControlPlane) -> None:
    beat = _heartbeat(control, 4, last_seq=11)
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


def test_an_older_epoch_never_overwrites_a_newer_heartbeat(control: ControlPlane) -> None:
    newer = _heartbeat(control, 5)
    newer.beat("RUNNING")
    older = _heartbeat(control, 4)
    with pytest.raises(FencedError, match="belongs to epoch 5"):
        older.beat("RUNNING")
    older.stop("FAILED", reason="fenced")  # swallowed: a fenced runner records nothing
    assert (control.heartbeat()["epoch"], control.heartbeat()["state"]) == (5, "RUNNING")


def test_a_fenced_heartbeat_stops_and_tells_the_runner(control: ControlPlane) -> None:
    told = threading.Event()
    lease = control.acquire()
    fence = Fence(control, lease)
    beat = Heartbeat(control, fence, facts=dict, interval=0.02, on_fenced=lambda _e: told.set())
    beat.start()
    control.acquire(takeover=True)  # epoch 2 takes over
    assert told.wait(5), "the heartbeat did not notice it was fenced"
    assert fence.fenced
    with pytest.raises(FencedError):
        fence.check()
    beat.stop("FAILED")
    assert control.heartbeat()["epoch"] == 1
    assert control.heartbeat()["state"] in ("STARTING", "RUNNING")  # never FAILED: fenced


def test_write_owned_refuses_a_lower_epoch(control: ControlPlane) -> None:
    key = control.layout.job_record
    control.write_owned(key, Lease.for_this_process(3), {"job": "new"})
    with pytest.raises(FencedError):
        control.write_owned(key, Lease.for_this_process(2), {"job": "old"})
    control.write_owned(key, Lease.for_this_process(3), {"job": "again"})
    assert control.job_record() == {"job": "again", "epoch": 3}


class _Outage:
    """A store that fails every write while `down` is set (a storage outage)."""

    def __init__(self, store: LocalStore) -> None:
        self.store = store
        self.down = threading.Event()
        self.writes = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    def write_if(self, key: str, value: dict, expected: str | None) -> str | None:
        self.writes += 1
        if self.down.is_set():
            raise ConnectionError("storage unreachable")
        return self.store.write_if(key, value, expected)


def test_periodic_beats_go_through_their_own_store_and_the_final_one_through_the_patient(
    control: ControlPlane, tmp_path: Path
) -> None:
    fast = _Outage(LocalStore(tmp_path))
    beats = ControlPlane(fast, control.layout)  # type: ignore[arg-type]
    fence = Fence(control, Lease.for_this_process(1))
    beat = Heartbeat(control, fence, facts=dict, interval=0.02, beats=lambda: beats)
    beat.start()
    deadline = time.monotonic() + 5
    while fast.writes < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fast.writes >= 3 and control.heartbeat()["state"] == "RUNNING"
    fast.down.set()  # the fail-fast store is down: the final beat still lands
    beat.stop("STOPPED", reason="done")
    assert (control.heartbeat()["state"], control.heartbeat()["reason"]) == ("STOPPED", "done")


def test_an_outage_is_warned_once_and_its_end_once(
    control: ControlPlane, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fast = _Outage(LocalStore(tmp_path))
    beats = ControlPlane(fast, control.layout)  # type: ignore[arg-type]
    beat = Heartbeat(
        control, Fence(control, Lease.for_this_process(1)), dict, 0.02, beats=lambda: beats
    )
    caplog.set_level("WARNING", logger="streamkeeper.lineage.heartbeat")
    fast.down.set()
    beat.start()
    deadline = time.monotonic() + 5
    while fast.writes < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fast.writes >= 5  # it kept beating into the outage
    stale = control.heartbeat()["time"]
    fast.down.clear()
    while control.heartbeat()["time"] == stale and time.monotonic() < deadline:
        time.sleep(0.01)
    beat.stop("STOPPED")
    messages = [r.getMessage() for r in caplog.records]
    assert [m for m in messages if m.startswith("heartbeat not written")] == [
        "heartbeat not written; retrying every 0.02s"
    ]
    assert len([m for m in messages if m.startswith("heartbeat written again")]) == 1
    assert caplog.records[0].exc_info is not None  # the outage's cause, once


def test_a_fail_fast_store_that_cannot_be_built_leaves_the_patient_one_beating(
    control: ControlPlane,
) -> None:
    def broken() -> ControlPlane:
        raise RuntimeError("no client")

    beat = Heartbeat(control, Fence(control, Lease.for_this_process(1)), dict, 0.02, beats=broken)
    beat.start()
    deadline = time.monotonic() + 5
    while control.heartbeat()["state"] != "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert control.heartbeat()["state"] == "RUNNING"  # the thread beat on, through `control`
    beat.stop("STOPPED")
