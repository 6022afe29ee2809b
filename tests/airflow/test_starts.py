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
    LaunchRecord,
    driver_gone,
    latest_launch,
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


class Sleeper:
    """A launcher whose 'driver' is a sleeping process (alive until the test kills it)."""

    name = "fake"

    def __init__(self, fail: bool = False) -> None:
        self.launched: list[LaunchRequest] = []
        self.processes: list[subprocess.Popen[bytes]] = []
        self.fail = fail
        self.lock = threading.Lock()

    def launch(self, request: LaunchRequest) -> LaunchedDriver:
        if self.fail:
            raise LaunchError("no driver today")
        process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        with self.lock:
            self.launched.append(request)
            self.processes.append(process)
        return LaunchedDriver.of_process(self.name, process.pid, "/tmp/driver.log")

    def kill_all(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait()


@pytest.fixture
def launcher() -> Any:
    fake = Sleeper()
    yield fake
    fake.kill_all()


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
    tmp_path: Path, launcher: Sleeper
) -> None:
    store = LocalStore(tmp_path)
    first = start_job(
        store=store, status=lambda job: None, request=request("af-1"), launcher=launcher,
        start_from="resume",
    )  # fmt: skip
    assert first.action == "launched"
    launcher.kill_all()  # the driver died before its first heartbeat
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


def test_a_launch_pending_on_another_host_counts_until_its_grace_ends() -> None:
    record = LaunchRecord(
        token="af-1", job=JOB, state="launched", requested_at=time.time() - 10,
        host="other-host", after_epoch=0, baseline_seq=-1, pid=99, launched_at=time.time() - 10,
    )  # fmt: skip
    args: dict[str, Any] = {"start_from": "resume", "takeover": False, "report": None}
    assert plan_start(token="af-2", record=record, now=time.time(), **args).action == "attach"
    late = plan_start(token="af-2", record=record, now=time.time() + 3600, **args)
    assert late.action == "launch"


def test_a_driver_is_known_gone_by_its_heartbeat_or_else_by_its_process_on_this_host(
    tmp_path: Path, launcher: Sleeper
) -> None:
    """The handover's check on green (operators/upgrade.py): gone only when known gone."""
    store, host = LocalStore(tmp_path), socket.gethostname()
    start_job(
        store=store, status=lambda job: None, request=request("af-green"), launcher=launcher,
        start_from="resume",
    )  # fmt: skip
    launch = latest_launch(store, JOB)
    blue_stopped = report("STOPPED", "STOPPED", token="af-blue")
    # Restoring its savepoint: no heartbeat of its own yet, and its process lives.
    assert driver_gone(blue_stopped, launch, "af-green", host) is None
    assert driver_gone(report(token="af-green"), launch, "af-green", host) is None  # beating
    lost = driver_gone(report("FAILED", "RUNNING", token="af-green"), launch, "af-green", host)
    assert lost is not None and "RUNNING (job FAILED)" in lost  # a heartbeat lost
    ended = driver_gone(report("FAILED", "FAILED", token="af-green"), None, "af-green", host)
    assert ended is not None and "FAILED" in ended
    launcher.kill_all()  # it died before it beat as the job
    gone = driver_gone(blue_stopped, launch, "af-green", host)
    assert launch is not None and gone is not None and f"pid {launch.pid}" in gone
    # Launched elsewhere, or another run's launch: nothing known, the timeout decides.
    assert driver_gone(blue_stopped, launch, "af-green", "other-host") is None
    assert driver_gone(blue_stopped, launch, "af-other", host) is None


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
