"""Idempotent starts (starts.py) over a real local store, with a launcher that records
launches instead of starting Spark; and the restart back-off (restarts.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from streamkeeper.client import StatusReport
from streamkeeper.lineage import driver_beat
from streamkeeper.lineage.driver_beat import BEAT_STALE_AFTER, BeatReading, beat_key, read_beat
from streamkeeper.observability.status import LineageHead, RunnerInfo
from streamkeeper.storage import LocalStore
from streamkeeper_airflow.errors import LaunchError, StartRefusedError
from streamkeeper_airflow.launchers.base import LaunchedDriver, LaunchRequest
from streamkeeper_airflow.restarts import (
    RestartLedger,
    RestartPolicy,
    RestartRecord,
    decide_restart,
    healthy_again,
)
from streamkeeper_airflow.starts import (
    NO_BEAT,
    LaunchRecord,
    driver_gone,
    latest_launch,
    launch_key,
    plan_start,
    run_token_for,
    start_job,
)

JOB = "keyed-totals"


def report(
    state: str = "RUNNING",
    runner_state: str | None = "RUNNING",
    *,
    token: str | None = None,
    epoch: int = 3,
    head: int | None = 7,
    committed_at: float | None = None,
) -> StatusReport:
    runner = (
        None
        if runner_state is None
        else RunnerInfo(runner_state, None, 4242, socket.gethostname(), epoch, time.time(), token)
    )
    return StatusReport(
        job=JOB,
        lineage=JOB,
        root="/r",
        state=state,  # type: ignore[arg-type]
        reason="why",
        runner=runner,
        head=None if head is None else LineageHead(head, head, committed_at or time.time()),
        tables={},
        checked_at=time.time(),
    )


# A fake driver: beats like a real one (lineage/driver_beat.py) and sleeps.
BEATING_DRIVER = """
import sys, time
from pathlib import Path
from streamkeeper.lineage.driver_beat import DriverBeat
from streamkeeper.storage import LocalStore
DriverBeat(LocalStore(Path(sys.argv[1])), sys.argv[2], sys.argv[3], interval=0.2).start()
time.sleep(120)
"""


class Sleeper:
    """A launcher whose 'driver' is a sleeping process that beats into `root` (alive
    until the test kills it)."""

    name = "fake"

    def __init__(self, root: Path | None = None, fail: bool = False) -> None:
        self.root = root
        self.launched: list[LaunchRequest] = []
        self.processes: list[subprocess.Popen[bytes]] = []
        self.fail = fail
        self.lock = threading.Lock()

    def launch(self, request: LaunchRequest) -> LaunchedDriver:
        if self.fail:
            raise LaunchError("no driver today")
        argv = [sys.executable, "-c", BEATING_DRIVER, str(self.root), request.run_token, JOB]
        process = subprocess.Popen(argv)
        with self.lock:
            self.launched.append(request)
            self.processes.append(process)
        return LaunchedDriver.of_process(self.name, process.pid, "/tmp/driver.log")

    def kill_all(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait()


@pytest.fixture
def launcher(tmp_path: Path) -> Any:
    fake = Sleeper(tmp_path)
    yield fake
    fake.kill_all()


def beat_of(store: LocalStore, token: str, at: float | None = None) -> BeatReading:
    return read_beat(store.read_json(beat_key(token)), time.time() if at is None else at)


def wait_for_beat(store: LocalStore, token: str) -> None:
    deadline = time.monotonic() + 30
    while beat_of(store, token).state == "none":
        assert time.monotonic() < deadline, f"the fake driver of {token} never beat"
        time.sleep(0.05)


def request(token: str, **fields: Any) -> LaunchRequest:
    return LaunchRequest(
        job=JOB,
        spec_path="/jobs/k/job.yaml",
        root="/r",
        run_token=token,
        workdir="/w",
        env={"AWS_SECRET_ACCESS_KEY": "canary-secret-xyz"},
        **fields,
    )


def test_the_token_is_per_task_instance_not_per_try() -> None:
    token = run_token_for("k.start", "manual__1", "start")
    assert token == run_token_for("k.start", "manual__1", "start")  # every try
    assert token != run_token_for("k.start", "manual__2", "start")
    assert token.startswith("af-") and len(token) == 27


def test_a_retried_start_attaches_to_the_driver_it_launched(
    tmp_path: Path, launcher: Sleeper
) -> None:
    store = LocalStore(tmp_path)
    never_ran = lambda job: None  # noqa: E731
    first = start_job(
        store=store, status=never_ran, request=request("af-1"), launcher=launcher,
        start_from="resume",
    )  # fmt: skip
    assert first.action == "launched" and first.baseline_seq == -1 and first.after_epoch == 0
    record = latest_launch(store, JOB)
    assert record is not None and record.state == "launched"
    assert record.pid == launcher.processes[0].pid and record.request["spec_path"]
    assert "canary-secret-xyz" not in (tmp_path / f"jobs/{JOB}/launch.json").read_text()

    # The retry comes before the driver's first heartbeat: the pending launch is found.
    retry = start_job(
        store=store, status=never_ran, request=request("af-1"), launcher=launcher,
        start_from="resume",
    )  # fmt: skip
    assert retry.action == "attached" and retry.token == "af-1"
    assert retry.driver is not None and retry.driver["pid"] == launcher.processes[0].pid
    # ... and after it: the live runner carries our token.
    live = lambda job: report(token="af-1", epoch=1)  # noqa: E731
    again = start_job(
        store=store, status=live, request=request("af-1"), launcher=launcher,
        start_from="latest_checkpoint",
    )  # fmt: skip
    assert again.action == "attached" and again.baseline_seq == -1  # the launch's baseline
    assert len(launcher.launched) == 1


def test_a_second_dag_run_adopts_a_running_job_but_a_restore_is_refused(
    tmp_path: Path, launcher: Sleeper
) -> None:
    store = LocalStore(tmp_path)
    live = lambda job: report(token="af-first", epoch=5, head=11)  # noqa: E731
    adopted = start_job(
        store=store, status=live, request=request("af-second"), launcher=launcher,
        start_from="resume",
    )  # fmt: skip
    assert (adopted.action, adopted.token, adopted.after_epoch, adopted.baseline_seq) == (
        "attached", "af-first", 4, 11,
    )  # fmt: skip
    for start_from, fields in (("checkpoint", {"from_checkpoint": "3"}), ("savepoint", {})):
        with pytest.raises(StartRefusedError, match="is running .* stop it first, or pass"):
            start_job(
                store=store, status=live, request=request("af-second", **fields),
                launcher=launcher, start_from=start_from,
            )  # fmt: skip
    taken = start_job(
        store=store, status=live, request=request("af-second", takeover=True),
        launcher=launcher, start_from="checkpoint",
    )  # fmt: skip
    assert taken.action == "launched" and taken.after_epoch == 5
    assert launcher.launched[-1].takeover and len(launcher.launched) == 1


def test_racing_starters_launch_one_driver(tmp_path: Path, launcher: Sleeper) -> None:
    store = LocalStore(tmp_path)
    outcomes: list[str] = []
    barrier = threading.Barrier(6)

    def start(token: str) -> None:
        barrier.wait()
        outcome = start_job(
            store=store, status=lambda job: None, request=request(token), launcher=launcher,
            start_from="resume",
        )  # fmt: skip
        outcomes.append(outcome.action)

    threads = [threading.Thread(target=start, args=(f"af-{i}",)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["attached"] * 5 + ["launched"]
    assert len(launcher.launched) == 1


def test_a_dead_launch_or_a_failed_runner_is_launched_again(
    tmp_path: Path, launcher: Sleeper, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalStore(tmp_path)
    first = start_job(
        store=store, status=lambda job: None, request=request("af-1"), launcher=launcher,
        start_from="resume",
    )  # fmt: skip
    assert first.action == "launched"
    wait_for_beat(store, "af-1")
    # Killed before its first heartbeat: nothing but its beat going stale can tell (its
    # host may be another). Staleness shortened so the test need not wait 30 s.
    monkeypatch.setattr(driver_beat, "BEAT_STALE_AFTER", 1.0)
    launcher.kill_all()
    retry = start_job(
        store=store, status=lambda job: None, request=request("af-1"), launcher=launcher,
        start_from="resume",
    )  # fmt: skip
    assert retry.action == "attached" and len(launcher.launched) == 1  # beat still fresh
    time.sleep(1.5)
    second = start_job(
        store=store, status=lambda job: None, request=request("af-1"), launcher=launcher,
        start_from="resume",
    )  # fmt: skip
    assert second.action == "launched" and len(launcher.launched) == 2
    failed = lambda job: report("FAILED", "FAILED", token="af-1", epoch=2)  # noqa: E731
    third = start_job(
        store=store, status=failed, request=request("af-1"), launcher=launcher,
        start_from="latest_checkpoint",
    )  # fmt: skip
    # Its runner beat (epoch 2 > 0) and failed: a new driver, followed above epoch 2.
    assert third.action == "launched" and third.after_epoch == 2


def test_a_failed_launch_is_recorded_so_the_retry_launches_at_once(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    with pytest.raises(LaunchError):
        start_job(
            store=store, status=lambda job: None, request=request("af-1"),
            launcher=Sleeper(fail=True), start_from="resume",
        )  # fmt: skip
    record = latest_launch(store, JOB)
    assert record is not None and record.state == "failed" and "no driver today" in record.error
    plan = plan_start(
        token="af-1", start_from="resume", takeover=False, report=None, record=record,
        now=time.time(),
    )  # fmt: skip
    assert plan.action == "launch"


def test_a_launch_that_never_beats_counts_as_pending_until_its_grace_ends() -> None:
    record = LaunchRecord(
        token="af-1", job=JOB, state="launched", requested_at=time.time() - 10,
        host="other-host", after_epoch=0, baseline_seq=-1, pid=99, launched_at=time.time() - 10,
    )  # fmt: skip
    args: dict[str, Any] = {"start_from": "resume", "takeover": False, "report": None}
    assert plan_start(token="af-2", record=record, now=time.time(), **args).action == "attach"
    late = plan_start(token="af-2", record=record, now=time.time() + 3600, **args)
    assert late.action == "launch"


def test_a_driver_on_another_host_is_followed_attached_to_and_launched_again(
    tmp_path: Path,
) -> None:
    """Only the control plane decides: a beat that names another host and a pid that
    does not exist here is alive while it beats; stale or exited, it is gone."""
    store, launcher = LocalStore(tmp_path), Sleeper(tmp_path)
    record = LaunchRecord(
        token="af-gw", job=JOB, state="launched", requested_at=time.time(), host="gateway-7",
        after_epoch=0, baseline_seq=-1, launcher="ssh", pid=999_999_999,
        launched_at=time.time(), log="gateway-7:/srv/logs/k.log",
    )  # fmt: skip
    store.write_json(launch_key(JOB), record.to_json())
    beat = {"token": "af-gw", "job": JOB, "host": "gateway-7", "pid": 999_999_999}
    store.write_json(beat_key("af-gw"), {**beat, "state": "booting", "time": time.time()})
    never_ran = lambda job: None  # noqa: E731
    attached = start_job(
        store=store, status=never_ran, request=request("af-gw"), launcher=launcher,
        start_from="resume",
    )  # fmt: skip
    assert attached.action == "attached" and attached.driver is not None
    assert attached.driver["host"] == "gateway-7" and launcher.launched == []
    now = time.time()
    assert driver_gone(None, record, "af-gw", beat_of(store, "af-gw", now), now) is None
    # Its runner beats as the job: followed by the heartbeat, whatever its host.
    live = report(token="af-gw", epoch=1)
    assert driver_gone(live, record, "af-gw", beat_of(store, "af-gw"), time.time()) is None
    # The gateway is lost while the driver boots: the beat goes stale, the start relaunches.
    later = time.time() + BEAT_STALE_AFTER + 1
    gone = driver_gone(None, record, "af-gw", beat_of(store, "af-gw", later), later)
    assert gone is not None and "stopped beating" in gone and "gateway-7" in gone
    store.write_json(beat_key("af-gw"), {**beat, "state": "booting", "time": time.time() - 60})
    relaunched = start_job(
        store=store, status=never_ran, request=request("af-gw"), launcher=launcher,
        start_from="resume",
    )  # fmt: skip
    assert relaunched.action == "launched" and len(launcher.launched) == 1
    launcher.kill_all()


def test_a_driver_is_known_gone_by_its_heartbeat_or_else_by_its_own_beat(
    tmp_path: Path, launcher: Sleeper
) -> None:
    """The handover's check on green (operators/upgrade.py): gone only when known gone."""
    store = LocalStore(tmp_path)
    start_job(
        store=store, status=lambda job: None, request=request("af-green"), launcher=launcher,
        start_from="resume",
    )  # fmt: skip
    launch = latest_launch(store, JOB)
    wait_for_beat(store, "af-green")
    blue_stopped = report("STOPPED", "STOPPED", token="af-blue")
    now = time.time()

    def gone(status: StatusReport | None, token: str = "af-green", at: float = now) -> str | None:
        return driver_gone(status, launch, token, beat_of(store, "af-green", at), at)

    # Restoring its savepoint: no heartbeat of its own yet, and it beats while it boots.
    assert gone(blue_stopped) is None
    assert gone(report(token="af-green")) is None  # beating as the job
    lost = gone(report("FAILED", "RUNNING", token="af-green"))
    assert lost is not None and "RUNNING (job FAILED)" in lost  # a heartbeat lost
    ended = driver_gone(
        report("FAILED", "FAILED", token="af-green"), None, "af-green", NO_BEAT, now
    )
    assert ended is not None and "FAILED" in ended
    launcher.kill_all()  # it died before it beat as the job: its beat goes stale
    assert gone(blue_stopped) is None  # not yet known
    stale = gone(blue_stopped, at=time.time() + BEAT_STALE_AFTER + 1)
    assert stale is not None and "stopped beating" in stale
    # A driver that ends normally says so at once.
    store.write_json(
        beat_key("af-green"),
        {"token": "af-green", "state": "exited", "time": time.time(), "exit_code": 1},
    )
    assert "exited" in (gone(blue_stopped, at=time.time()) or "")


# -- restart back-off ----------------------------------------------------------------------


def test_back_off_doubles_up_to_the_limit_then_gives_up() -> None:
    policy = RestartPolicy(max_attempts=3, backoff=10, max_backoff=15)
    assert [policy.delay_after(n) for n in range(4)] == [0, 10, 15, 15]
    record = RestartRecord()
    assert decide_restart(record, policy, token="t1", now=100).action == "restart"
    record = RestartRecord(attempts=1, last_restart_at=100, last_token="t1")
    assert decide_restart(record, policy, token="t1", now=101).action == "retry"  # our own
    waiting = decide_restart(record, policy, token="t2", now=105)
    assert waiting.action == "wait" and waiting.not_before == 110
    assert "restart 2/3 is due in 5 s" in waiting.reason
    assert decide_restart(record, policy, token="t2", now=110).action == "restart"
    record = RestartRecord(attempts=3, last_restart_at=200, last_token="t4")
    assert decide_restart(record, policy, token="t5", now=10_000).action == "give_up"
    with pytest.raises(ValueError, match="max_attempts 0"):
        RestartPolicy(max_attempts=0)


def test_the_ledger_counts_by_compare_and_swap_and_resets_when_healthy(tmp_path: Path) -> None:
    ledger = RestartLedger(LocalStore(tmp_path), JOB)
    record, version = ledger.read()
    assert record == RestartRecord() and version is None
    assert ledger.record_attempt(record, version, token="t1", reason="boom")
    assert not ledger.record_attempt(record, version, token="t2", reason="boom")  # stale
    record, version = ledger.read()
    assert (record.attempts, record.last_token) == (1, "t1")
    assert not healthy_again(record, report(committed_at=record.last_restart_at - 1))
    assert healthy_again(record, report(committed_at=record.last_restart_at + 1))
    assert ledger.reset(record, version)
    assert ledger.read()[0].attempts == 0 and ledger.read()[0].history[0]["token"] == "t1"
