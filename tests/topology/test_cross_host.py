"""A job across real hosts: S3, broker, a Spark master and two workers, and a gateway
running the driver, each a network namespace with its own address (tests/support/topology).

While NATS input flows, a worker host dies, the gateway loses S3 for 30 s, and the driver
is SIGKILLed and started again; then the job is stopped and its Delta output must equal,
exactly, the reference computed from what the test published and the batch boundaries
Spark checkpointed: a lost or doubled batch fails.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest

from streamkeeper.spec import load_spec
from tests.integration.test_sources import NatsStream, assert_exact, batch_ends
from tests.support.driver import driver_env
from tests.support.topology import Topology, unavailable_reason
from tests.support.topology_services import (
    QUICK_JVM,
    alive_workers,
    spark_env,
    start_nats,
    start_seaweedfs,
    start_spark_master,
    start_spark_worker,
    wait_for,
)

pytestmark = pytest.mark.topology

JOB = Path(__file__).resolve().parents[1] / "integration" / "jobs" / "nats_totals.yaml"
HOSTS = ["s3", "broker", "spark-master", "spark-worker-1", "spark-worker-2", "gateway"]
# How long the gateway loses S3, and how: silently (a real partition) or with an error
# at once ("reject"). Overridable to find where the driver stops riding it out.
CUT_SECONDS = float(os.environ.get("STREAMKEEPER_TOPOLOGY_CUT_SECONDS", "30"))
CUT_SILENT = os.environ.get("STREAMKEEPER_TOPOLOGY_CUT_MODE", "silent") != "reject"
ROOT = "s3://lake/cross-host"
COMMITTED = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO streamkeeper\.commit\.coordinator: "
    r"batch (\d+) committed as seq (\d+)",
    re.MULTILINE,
)
TROUBLE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (?:WARNING|ERROR) ", re.MULTILINE)


@pytest.fixture
def topology() -> Iterator[Topology]:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    hosts = Topology(HOSTS)
    try:
        yield hosts.up()
    finally:
        hosts.down()  # also on failure; atexit covers a test run that never gets here


class Publisher(threading.Thread):
    """Publishes `k{v % 5}` = v steadily from the root namespace, through the broker's
    address (every 7th message is noise on another subject, as in test_sources)."""

    def __init__(self, stream: NatsStream, per_tick: int = 20, tick: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.stream, self.per_tick, self.tick = stream, per_tick, tick
        self.published = 0  # messages, so also the stream's last sequence
        self.error: BaseException | None = None
        self._done = threading.Event()

    def run(self) -> None:
        try:
            while not self._done.is_set():
                self.stream.publish(range(self.published, self.published + self.per_tick))
                self.published += self.per_tick
                self._done.wait(self.tick)
        except BaseException as error:  # noqa: BLE001 - raised by finish()
            self.error = error

    def finish(self) -> int:
        self._done.set()
        self.join(timeout=30)
        if self.error is not None:
            raise self.error
        return self.published


@dataclass
class Driver:
    """The job's driver on the gateway host: started, watched through its log, restarted."""

    topology: Topology
    workdir: Path
    args: list[str]
    env: dict[str, str]
    logs: list[Path] = field(default_factory=list)
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        """`streamkeeper run` on the gateway, with a new run token; when it started."""
        log = self.workdir / f"driver-{len(self.logs) + 1}.log"
        token = f"topology-{len(self.logs) + 1}"
        argv = [sys.executable, "-m", "streamkeeper", "run", *self.args, "--run-token", token]
        started = time.time()
        self.process = self.topology.run("gateway", argv, self.env, log, cwd=self.workdir)
        self.logs.append(log)
        return started

    def commits(self) -> list[tuple[float, int, int]]:
        """(time, batch, seq) of every commit any run of the driver logged."""
        found = []
        for log in self.logs:
            text = log.read_text(errors="replace") if log.exists() else ""
            for stamp, batch, seq in COMMITTED.findall(text):
                found.append((_stamp(stamp), int(batch), int(seq)))
        return sorted(found)

    def first_commit_after(self, after: float, timeout: float = 180.0) -> float:
        """When the first commit after `after` happened; fails if the driver exits."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            hits = [when for when, _, _ in self.commits() if when > after]
            if hits:
                return min(hits) - after
            self.check_alive()
            time.sleep(0.2)
        raise AssertionError(f"no commit within {timeout:.0f}s; {self.tail()}")

    def check_alive(self) -> None:
        assert self.process is not None
        code = self.process.poll()
        if code is not None:
            raise AssertionError(f"the driver exited with {code}; {self.tail()}")

    def tail(self) -> str:
        return f"{self.logs[-1]}:\n{self.logs[-1].read_text(errors='replace')[-4000:]}"


def _start_services(topology: Topology, tmp_path: Path) -> tuple[str, str, dict[str, str]]:
    s3 = start_seaweedfs(topology, "s3", tmp_path / "s3", "lake")
    nats_url = start_nats(topology, "broker", tmp_path / "nats")
    master = start_spark_master(topology, "spark-master", tmp_path / "spark")
    for worker in ("spark-worker-1", "spark-worker-2"):
        start_spark_worker(topology, worker, master, tmp_path / "spark")
    master_address = topology.address("spark-master")
    wait_for(
        "two Spark workers",
        lambda: len(alive_workers(master_address)) == 2,
        tmp_path / "spark" / "spark-worker-2.log",
    )
    for host in HOSTS:  # each service on its own address (or its host's loopback) only
        listening = topology.listeners(host)
        wildcard = [a for a in listening if a.rsplit(":", 1)[0] in ("0.0.0.0", "*", "[::]")]
        assert not wildcard, (host, listening)
    return master, nats_url, s3.env()


def _overrides(topology: Topology, stream: NatsStream, root: str, checkpoint: Path) -> dict:
    gateway = topology.address("gateway")
    return {
        "storage.root": root,
        "checkpoint.dir": str(checkpoint),
        "source.url": stream.url,
        "source.stream": stream.name,
        "source.subject": stream.data_subject,
        "source.options.maxMessagesPerTrigger": "400",
        "source.options.messagesPerPartition": "100",
        "spark.shuffle_partitions": "4",
        # Executors on the workers connect back to the driver at the gateway's address.
        "spark.conf.spark.driver.host": gateway,
        "spark.conf.spark.driver.bindAddress": gateway,
        "spark.conf.spark.executor.memory": "512m",
        "spark.conf.spark.executor.cores": "1",
        "spark.conf.spark.executor.extraJavaOptions": QUICK_JVM,
        # Keep every batch's offsets: the reference follows Spark's own batch boundaries.
        "spark.conf.spark.sql.streaming.minBatchesToRetain": "100000",
    }


def _wait_until_consumed(driver: Driver, checkpoint: Path, last_seq: int) -> None:
    """Every published message is in a completed batch, and that batch is committed."""

    def consumed() -> bool:
        driver.check_alive()
        ends = batch_ends(checkpoint, "seq")
        if not ends or ends[-1] < last_seq:
            return False
        batch = next(b for b, end in enumerate(ends) if end >= last_seq)
        return any(b >= batch for _, b, _ in driver.commits())

    wait_for("the last message's commit", consumed, driver.logs[-1], timeout=180)


class Timings(dict[str, str]):
    """What happened when, printed as it happens (a failing run shows how far it got)."""

    def note(self, name: str, value: float | str) -> None:
        self[name] = f"{value:.1f} s" if isinstance(value, float) else str(value)
        print(f"  {name}: {self[name]}", flush=True)


def test_a_job_across_hosts_survives_a_lost_worker_a_partition_and_a_driver_kill(
    topology: Topology, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    began = time.monotonic()
    timings = Timings()
    print("\ncross-host timings:")
    master, nats_url, s3_env = _start_services(topology, tmp_path)
    for key, value in s3_env.items():  # the test reads the tables through the uplink
        monkeypatch.setenv(key, value)
    timings.note("services up", time.monotonic() - began)

    stream = NatsStream(nats_url).create()
    checkpoint = tmp_path / "gateway" / "checkpoint"  # the gateway's disk
    overrides = _overrides(topology, stream, ROOT, checkpoint)
    args = [str(JOB), "--master", master]
    for key, value in overrides.items():
        args += ["--set", f"{key}={value}"]
    env = {**driver_env(), **spark_env(topology.address("gateway")), **s3_env}
    (tmp_path / "gateway").mkdir()
    driver = Driver(topology, tmp_path / "gateway", args, env)
    publisher = Publisher(stream)
    publisher.start()
    try:
        started = driver.start()
        timings.note("driver start -> first commit", driver.first_commit_after(started))
        driver.first_commit_after(time.time())

        # (a) The worker host dies, its executors with it: tasks rerun on worker 1.
        killed = time.time()
        topology.kill_host("spark-worker-2")
        timings.note("worker lost -> next commit", driver.first_commit_after(killed))
        driver.first_commit_after(time.time())  # and it keeps committing
        assert alive_workers(topology.address("spark-master")) == [
            topology.address("spark-worker-1")
        ]
        assert "Lost executor" in driver.logs[-1].read_text(errors="replace"), driver.tail()

        # (b) The gateway loses S3 for 30 s (the executors still reach it).
        _ride_out_s3_cut(topology, driver, timings)

        # (c) SIGKILL the driver (everything on the gateway) and start it again on the
        # gateway from its checkpoint, as the product restarts a job: `streamkeeper run`
        # again (the local checkpoint, never older than the externalized one).
        topology.kill_host("gateway")
        restarted = driver.start()
        recovered = driver.first_commit_after(restarted)
        timings.note("driver killed -> restarted driver's first commit", recovered)
        driver.first_commit_after(time.time())
    finally:
        last_seq = publisher.finish()

    _wait_until_consumed(driver, checkpoint, last_seq)
    stopping = time.time()
    stop = subprocess.run(
        [sys.executable, "-m", "streamkeeper", "stop", "nats-totals", "--root", ROOT]
        + ["--no-savepoint", "--timeout", "120"],
        env={**driver_env(), **s3_env},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert driver.process is not None and driver.process.wait(timeout=120) == 0, driver.tail()
    timings.note("stop", time.time() - stopping)

    batches = assert_exact(load_spec(JOB, overrides), stream.events(), "seq", before=0)
    timings.note("exact output", f"{batches} batches, {last_seq} messages")
    timings.note("total", time.monotonic() - began)


def _ride_out_s3_cut(topology: Topology, driver: Driver, timings: Timings) -> None:
    """Partition the gateway from S3 for CUT_SECONDS. The driver should ride it out; one
    that fails is started again as after any failure (and the timings say so)."""
    assert driver.process is not None
    timings.note("gateway/s3 cut", f"{CUT_SECONDS:g} s, {'silent' if CUT_SILENT else 'reject'}")
    cut = time.time()
    topology.sever("gateway", "s3", silent=CUT_SILENT)
    try:
        time.sleep(CUT_SECONDS)
    finally:
        topology.heal("gateway", "s3")
    healed = time.time()
    during = [batch for when, batch, _ in driver.commits() if cut + 1.0 < when < healed]
    assert not during, f"batches {during} committed while the gateway could not reach S3"
    try:
        timings.note("s3 healed -> next commit", driver.first_commit_after(healed))
        return
    except AssertionError:
        if driver.process.poll() is None:
            raise
    failed = _first_trouble(driver.logs[-1], after=cut)
    errors = [line for line in driver.tail().splitlines() if line.startswith("error:")]
    timings.note("driver FAILED; its first warning came, into the cut", (failed or cut) - cut)
    timings.note("its error", errors[-1][:400] if errors else "(none logged)")
    topology.kill_host("gateway")  # whatever the failed driver left (its JVM)
    restarted = driver.start()
    recovered = driver.first_commit_after(restarted) + restarted - healed
    timings.note("s3 healed -> restarted driver's first commit", recovered)


def _first_trouble(log: Path, after: float) -> float | None:
    """When the driver first logged a warning or an error after `after`."""
    for stamp in TROUBLE.findall(log.read_text(errors="replace")):
        if (when := _stamp(stamp)) > after:
            return when
    return None


def _stamp(text: str) -> float:
    """A driver log line's time (its logging format's asctime, local time)."""
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()
