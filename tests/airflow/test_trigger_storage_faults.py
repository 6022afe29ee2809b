"""A deferred probation rides out a real storage outage: the job's control plane on
SeaweedFS, reached by the trigger only through the S3 fault proxy, which answers 503 to
every request for a while. The client's own retries give up, polls fail, the trigger
tolerates them (triggers/base.py) and the healthy job passes its probation; with no
tolerance the same outage ends it with an error, as it did before."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from streamkeeper.storage import Location, S3Settings
from streamkeeper_airflow.triggers.checkpoints import JobHealthyTrigger
from tests.conftest import S3_ACCESS_KEY, S3_SECRET_KEY
from tests.support.s3_proxy import Fault, FaultPlan, S3FaultProxy
from tests.unit.test_client import JOB, write_control_plane

pytestmark = [pytest.mark.integration, pytest.mark.s3, pytest.mark.airflow]

ATTEMPTS_PER_POLL = 5  # the store's boto3 client tries a request this often (objects.py)


@pytest.fixture
def proxy(seaweed: Any, s3_env: dict[str, str]) -> Iterator[S3FaultProxy]:
    with S3FaultProxy(f"127.0.0.1:{seaweed.port}") as running:
        yield running


@pytest.fixture
def healthy_job(s3_root: str, proxy: S3FaultProxy, conn_env: Any) -> Iterator[str]:
    """A RUNNING job's control plane, its heartbeat kept fresh (written to SeaweedFS
    directly, around the proxy), and the trigger's connection through the proxy."""
    halt = threading.Event()
    running = {"time": time.time(), "state": "RUNNING", "epoch": 4}
    write_control_plane(s3_root, seqs=range(6), history_files=1, heartbeat=running)
    store, key = Location(s3_root, S3Settings.from_env()).store(), f"jobs/{JOB}/heartbeat.json"

    def beat() -> None:
        while not halt.wait(1.0):
            store.write_json(key, {**store.read_json(key), "time": time.time()})

    beater = threading.Thread(target=beat, daemon=True)
    beater.start()
    conn_env(
        "sk_faulty",
        s3_root,
        host=proxy.endpoint_url,
        login=S3_ACCESS_KEY,
        password=S3_SECRET_KEY,
        allow_http=True,
    )
    try:
        yield s3_root
    finally:
        halt.set()
        beater.join()


@contextmanager
def _outage(proxy: S3FaultProxy, failed_polls: int) -> Iterator[None]:
    """503 to every request until `failed_polls` polls' worth of attempts were refused
    (or the block ends)."""
    proxy.set_faults(FaultPlan([Fault("error_503", 1.0)]))
    ended = threading.Event()

    def lift() -> None:
        while proxy.stats()["error_503"] < failed_polls * ATTEMPTS_PER_POLL and not ended.wait(
            0.005
        ):
            pass
        proxy.clear_faults()

    lifter = threading.Thread(target=lift, daemon=True)
    lifter.start()
    try:
        yield
    finally:
        ended.set()
        lifter.join()


def _probation(tolerated_failures: int) -> dict[str, Any]:
    trigger = JobHealthyTrigger(
        conn_id="sk_faulty",
        job=JOB,
        poll_interval=0.2,
        deadline=time.time() + 120,
        settle=0.0,
        tolerated_failures=tolerated_failures,
        started_at=time.time(),
        probation=2.0,
        epoch=4,
    )

    async def first() -> dict[str, Any]:
        return (await anext(trigger.run())).payload

    return asyncio.run(first())


def test_a_probation_rides_out_a_storage_outage(
    healthy_job: str, proxy: S3FaultProxy, capfd: pytest.CaptureFixture[str]
) -> None:
    with _outage(proxy, failed_polls=2):
        event = _probation(tolerated_failures=3)
    assert event["status"] == "success", event
    assert "stayed healthy" in event["message"]
    logged = capfd.readouterr()
    failed = [line for line in (logged.out + logged.err).splitlines() if "poll failed" in line]
    assert len(failed) >= 2, "the outage failed no poll: it tested nothing"
    assert "SlowDown" in failed[0] or "503" in failed[0], failed[0]
    assert all(S3_SECRET_KEY not in line for line in failed)


def test_without_tolerance_the_same_outage_ends_the_probation(
    healthy_job: str, proxy: S3FaultProxy
) -> None:
    with _outage(proxy, failed_polls=2):
        event = _probation(tolerated_failures=0)
    assert event["status"] == "error", event
    assert "SlowDown" in event["message"] or "503" in event["message"], event
    assert S3_SECRET_KEY not in repr(event)
    # The store outside the proxy was never faulted: the job really was healthy.
    direct = Location(healthy_job, S3Settings.from_env()).store()
    assert direct.read_json(f"jobs/{JOB}/heartbeat.json")["state"] == "RUNNING"
