"""The lifecycle DAGs through a real distributed Airflow across hosts (issue 24 §4).

Hosts (network namespaces, tests/support/topology.py), each service on its own address:

    airflow         PostgreSQL (metadata DB, Celery results), Redis (Celery's broker),
                    api-server, scheduler, dag-processor, triggerer (CeleryExecutor)
    worker-1        a Celery worker on the `default` queue
    gateway         a Celery worker on `spark-gateway` only, with SPARK_LOCAL_IP = its
                    address: the job's `airflow.launch_queue`, so every task that launches a
                    driver (start, restart, start_green, rollback) runs here, and the
                    drivers it launches (`embedded`, detached) too
    spark-master, spark-worker-1, spark-worker-2, s3 (SeaweedFS), broker (NATS)

A NATS-fed keyed stateful job writing Delta to S3 exactly once is driven by its DAGs
only, triggered through the REST API from the test process (another machine, as far as
the hosts can tell): start, savepoint, upgrade (blue-green to a harmless v2), stop. Along
the way spark-worker-2 dies, the scheduler is SIGKILLed mid-run and started again, the
gateway loses S3 for 30 s (silently), and every process of worker-1 is SIGKILLed while it
runs an upgrade task (a new worker is started there: without one nothing would serve the
`default` queue). Every DAG run must end by itself; drivers must have run on the gateway
only; the Delta output must equal, exactly, the reference computed from the published
input and the batch boundaries Spark checkpointed.
"""

from __future__ import annotations

import concurrent.futures
import copy
import importlib.util
import json
import os
import re
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from streamkeeper.client import StreamkeeperClient
from streamkeeper.reader import read_table_rows
from streamkeeper.runtime.job import resolve_paths
from streamkeeper.spec import load_spec
from streamkeeper.upgrade.record import UpgradeRecord, UpgradeRecords
from tests.integration.test_sources import NatsStream, assert_tables_hold, reference
from tests.support.services.launch import base_env
from tests.support.services.postgres import postgres_bin
from tests.support.topology import Topology, unavailable_reason
from tests.support.topology_airflow import (
    TERMINAL,
    AirflowCluster,
    cluster_env,
    dags_folder,
    redis_server,
    start_postgres_on,
    start_redis_on,
)
from tests.support.topology_services import (
    QUICK_JVM,
    alive_workers,
    start_nats,
    start_seaweedfs,
    start_spark_master,
    start_spark_worker,
    wait_for,
)
from tests.topology.test_cross_host import Publisher, Timings

pytestmark = [
    pytest.mark.topology,
    pytest.mark.airflow,
    pytest.mark.integration,
    pytest.mark.timeout(900),  # about 4-5 min; a hang must not eat CI's budget
    pytest.mark.skipif(postgres_bin() is None, reason="PostgreSQL is not installed (setup.sh)"),
    pytest.mark.skipif(redis_server() is None, reason="redis-server is not installed (setup.sh)"),
    pytest.mark.skipif(
        importlib.util.find_spec("airflow.providers.celery") is None,
        reason="apache-airflow-providers-celery is not installed (requirements.txt)",
    ),
]

REPO = Path(__file__).resolve().parents[2]
JOB_SPEC = REPO / "tests" / "integration" / "jobs" / "nats_totals.yaml"
TRANSFORM = REPO / "tests" / "integration" / "jobs" / "transform.py"
JOB = "nats-totals"
HOSTS = [
    "airflow",
    "worker-1",
    "gateway",
    "spark-master",
    "spark-worker-1",
    "spark-worker-2",
    "s3",
    "broker",
]
BUCKET = "lake"
ROOT = f"s3://{BUCKET}/af-cross-host"
LAUNCH_QUEUE = "spark-gateway"
CUT_SECONDS = float(os.environ.get("STREAMKEEPER_TOPOLOGY_CUT_SECONDS", "30"))
# The upgrade tasks running on a `default` worker while worker-1 is killed.
KILL_DURING = ("validate", "handover")
UPGRADE = {
    "format": "native",  # the same operators: blue's state as it is
    "shadow_checkpoints": 2,
    "validation_timeout": 180,
    "probation_seconds": 8,
    "probation_checkpoints": 2,
    "handover_timeout": 300,
}
GONE = "(exited)"  # a process that ended before it could be looked at
DRIVER_URL = re.compile(r"--driver-url\s+spark://CoarseGrainedScheduler@([^:\s]+):\d+")


# -- the world: hosts, services, Airflow, the job ---------------------------------------


@dataclass
class World:
    topology: Topology
    place: Path
    cluster: AirflowCluster
    stream: NatsStream
    spec_path: Path
    green_path: Path
    checkpoint: Path
    timings: Timings
    began: float
    tokens: set[str] = field(default_factory=set)  # run tokens of the job's runners seen

    def client(self) -> StreamkeeperClient:
        return StreamkeeperClient(ROOT)

    def status(self) -> Any:
        return self.client().status(JOB)

    def gateway(self) -> str:
        return self.topology.address("gateway")


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    topology = Topology(HOSTS)
    cleanups: list[Callable[[], None]] = []
    try:
        topology.up()
        yield _build_world(topology, tmp_path, monkeypatch, cleanups)
    finally:
        topology.down()  # every process on every host, drivers included; then namespaces
        for cleanup in cleanups:
            cleanup()


def _build_world(
    topology: Topology,
    place: Path,
    monkeypatch: pytest.MonkeyPatch,
    cleanups: list[Callable[[], None]],
) -> World:
    began = time.monotonic()
    timings = Timings()
    print("\nairflow cross-host timings:")
    s3 = start_seaweedfs(topology, "s3", place / "s3", BUCKET)
    nats_url = start_nats(topology, "broker", place / "nats")
    logs = place / "logs"
    database = start_postgres_on(topology, "airflow", logs / "postgres.log")
    cleanups.append(database.cleanup)
    broker = start_redis_on(topology, "airflow", logs / "redis.log")
    cleanups.append(broker.cleanup)

    stream = NatsStream(nats_url).create()
    master = f"spark://{topology.address('spark-master')}:7077"
    checkpoint = place / "gateway" / "checkpoint"
    spec_path, green_path = _write_job(place / "jobs", stream, checkpoint, master)
    home = place / "airflow-home"
    home.mkdir()
    connection = {
        "conn_type": "streamkeeper",
        "host": s3.endpoint_url,
        "login": s3.access_key,
        "password": s3.secret_key,
        "extra": {"root": ROOT, "region": "us-east-1", "allow_http": True},
    }
    extra = {
        "AIRFLOW_CONN_STREAMKEEPER_DEFAULT": json.dumps(connection),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder(place / "dags")),
        "AIRFLOW__STREAMKEEPER__JOBS_FOLDER": str(place / "jobs"),
        "AIRFLOW__STREAMKEEPER__WORKDIR": str(place / "gateway" / "work"),
        "AIRFLOW__CELERY__WORKER_CONCURRENCY": "2",
        # A task whose worker died is failed (then retried) after 30 s without heartbeat,
        # and tasks of a dead scheduler are adopted within 10 s of its heartbeat expiring.
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "30",
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
        "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "10",
        # A Celery message the killed worker had prefetched stays unacknowledged (Redis
        # redelivers it after a day): its task instance is queued again after 90 s.
        "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "90",
        "STREAMKEEPER_SPARK_LOG_LEVEL": "WARN",
        "PYTHONPATH": os.pathsep.join(
            dict.fromkeys(
                [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
            )
        ),
        "PATH": base_env()["PATH"],
    }
    admin = secrets.token_hex(8)
    airflow_address = topology.address("airflow")
    env = cluster_env(home, airflow_address, database, broker, admin, extra)
    cluster = AirflowCluster(topology, home, env, "airflow", admin)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        migrating = pool.submit(cluster.migrate, "airflow")
        _start_spark(topology, place / "spark", master)
        timings.note("metadata DB migrated (Postgres, across the bridge)", migrating.result())
    _start_airflow(cluster, topology)
    timings.note("Airflow API healthy", cluster.wait_healthy())
    dag_ids = [f"{JOB}.{a}" for a in ("start", "savepoint", "upgrade", "stop", "monitor")]
    timings.note("DAGs parsed", cluster.wait_parsed(dag_ids))
    _no_wildcard_listeners(topology)
    for key, value in s3.env().items():  # the test reads the control plane and the tables
        monkeypatch.setenv(key, value)
    timings.note("services up", time.monotonic() - began)
    return World(
        topology, place, cluster, stream, spec_path, green_path, checkpoint, timings, began
    )


def _write_job(jobs: Path, stream: NatsStream, checkpoint: Path, master: str) -> tuple[Path, Path]:
    """nats_totals.yaml in the jobs folder the DAGs are generated from, with the stream,
    the cluster, the S3 root and the launch queue; v2 beside it (versions/v2.yaml): the
    same transform, one executor core instead of two (a harmless change)."""
    folder = jobs / "nats_totals"
    (folder / "versions").mkdir(parents=True)
    shutil.copy(TRANSFORM, folder / "transform.py")
    shutil.copy(TRANSFORM, folder / "versions" / "transform.py")
    spec = yaml.safe_load(JOB_SPEC.read_text())
    spec["source"].update(url=stream.url, stream=stream.name, subject=stream.data_subject)
    spec["source"]["options"].update(maxMessagesPerTrigger=400, messagesPerPartition=100)
    spec["checkpoint"].update(dir=str(checkpoint), interval="2s")  # the gateway's disk
    spec["storage"]["root"] = ROOT
    # A changelog keyed like the sample job's: the upgrade compares green's with blue's by
    # key across their different batch cuts (a keyless one differs with every other cut).
    (changes,) = [sink for sink in spec["sinks"] if sink["name"] == "changes"]
    changes["key"] = ["key"]
    spec["spark"] = {
        "master": master,
        "shuffle_partitions": 2,
        "conf": {
            "spark.executor.memory": "512m",
            "spark.executor.cores": "1",
            "spark.cores.max": "2",  # an executor on each worker, to lose one of them
            "spark.executor.extraJavaOptions": QUICK_JVM,
            # Every batch's offsets stay: the reference follows Spark's batch boundaries.
            "spark.sql.streaming.minBatchesToRetain": "100000",
        },
    }
    spec["airflow"] = {
        "conn_id": "streamkeeper_default",
        "launcher": "embedded",
        "launch_queue": LAUNCH_QUEUE,
        "monitor": "events",
        "monitor_poll_interval": "5s",
        "monitor_safety_net": None,
        "savepoint_format": "native",
        "restart": {"enabled": True, "max_attempts": 3, "backoff": "5s", "max_backoff": "30s"},
    }
    blue = folder / "job.yaml"
    blue.write_text(yaml.safe_dump(spec, sort_keys=False))
    green_spec = copy.deepcopy(spec)
    green_spec["spark"]["conf"]["spark.cores.max"] = "1"
    green = folder / "versions" / "v2.yaml"
    green.write_text("# v2: one executor core\n" + yaml.safe_dump(green_spec, sort_keys=False))
    return blue, green


def _start_spark(topology: Topology, work: Path, master: str) -> None:
    start_spark_master(topology, "spark-master", work)
    # worker-1 holds blue's executors once worker-2 is gone, and green's beside them.
    start_spark_worker(topology, "spark-worker-1", master, work, cores=3, memory="2g")
    start_spark_worker(topology, "spark-worker-2", master, work, cores=1)
    address = topology.address("spark-master")
    wait_for(
        "two Spark workers",
        lambda: len(alive_workers(address)) == 2,
        work / "spark-worker-2.log",
    )


def _start_airflow(cluster: AirflowCluster, topology: Topology) -> None:
    address = topology.address("airflow")
    cluster.start("api-server", "airflow", ["api-server", "--host", address, "--port", "8080"])
    cluster.start("scheduler", "airflow", ["scheduler", "--skip-serve-logs"])
    cluster.start("dag-processor", "airflow", ["dag-processor"])
    cluster.start("triggerer", "airflow", ["triggerer", "--skip-serve-logs"])
    worker = ["celery", "worker", "--skip-serve-logs", "--concurrency", "2"]
    cluster.start("worker-1", "worker-1", [*worker, "--queues", "default", "-H", "worker-1@%h"])
    gateway = topology.address("gateway")
    cluster.start(
        "gateway",
        "gateway",
        [*worker, "--queues", LAUNCH_QUEUE, "-H", "gateway@%h"],
        {"SPARK_LOCAL_IP": gateway, "SPARK_LOCAL_HOSTNAME": gateway},
    )


def _no_wildcard_listeners(topology: Topology) -> None:
    for host in HOSTS:
        listening = topology.listeners(host)
        wildcard = [a for a in listening if a.rsplit(":", 1)[0] in ("0.0.0.0", "*", "[::]")]
        assert not wildcard, (host, listening)


# -- where drivers run -------------------------------------------------------------------


@dataclass
class Sighting:
    pid: int
    host: str | None  # the topology host whose network namespace holds it
    spark_local_ip: str | None
    command: str


class DriverWatch(threading.Thread):
    """Notes every process of this test's job (`streamkeeper run|upgrade-green` of a spec
    in its jobs folder) and every Spark executor: which host's namespace it lives in, its
    SPARK_LOCAL_IP, the driver address an executor connects to."""

    def __init__(self, topology: Topology, jobs: str) -> None:
        super().__init__(daemon=True)
        self.jobs = jobs
        self.drivers: dict[int, Sighting] = {}
        self.executors: dict[int, tuple[str, str]] = {}
        self._halt = threading.Event()
        self._namespaces = {
            os.stat(f"/run/netns/{host.namespace}").st_ino: host.name
            for host in topology.hosts.values()
        }

    def run(self) -> None:
        while not self._halt.wait(0.5):
            self.look()

    def finish(self) -> None:
        self._halt.set()
        self.join(timeout=10)
        self.look()

    def look(self) -> None:
        for process in psutil.process_iter(["pid", "cmdline"]):
            command = " ".join(process.info.get("cmdline") or [])
            pid = process.info["pid"]
            if "CoarseGrainedExecutorBackend" in command and pid not in self.executors:
                host = self._host(pid)  # None: another test's topology; GONE: exited
                found = DRIVER_URL.search(command)
                if host not in (None, GONE):
                    self.executors[pid] = (host, found.group(1) if found else "?")
            elif "-m streamkeeper" in command and self.jobs in command and "--run-token" in command:
                host, local_ip = self._host(pid), _local_ip(pid)
                if pid not in self.drivers and GONE not in (host, local_ip):
                    self.drivers[pid] = Sighting(pid, host, local_ip, command)

    def _host(self, pid: int) -> str | None:
        """The topology host whose namespace holds `pid`: None for any other namespace."""
        try:
            return self._namespaces.get(os.stat(f"/proc/{pid}/ns/net").st_ino)
        except OSError:
            return GONE


def _local_ip(pid: int) -> str | None:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return GONE
    for entry in environ:
        if entry.startswith(b"SPARK_LOCAL_IP="):
            return entry.split(b"=", 1)[1].decode()
    return None


# -- the scenario ------------------------------------------------------------------------


def test_the_lifecycle_dags_run_across_hosts_through_faults(world: World) -> None:
    watch = DriverWatch(world.topology, str(world.place / "jobs"))
    watch.start()
    publisher = Publisher(world.stream, per_tick=10, tick=0.5)
    publisher.start()
    try:
        _start(world)
        _lose_a_spark_worker(world)
        _savepoint_through_a_scheduler_restart(world)
        _cut_the_gateway_from_s3(world)
        record = _upgrade_losing_worker_1(world)
    finally:
        last_seq = publisher.finish()
        world.timings.note("published", f"{last_seq} messages")
    _drain(world)
    _stop(world)
    _every_run_ended(world)
    watch.finish()
    _drivers_ran_on_the_gateway(world, watch, record)
    batches = _exact_output(world, record)
    world.timings.note("exact output", f"{batches} batches, {last_seq} messages")
    world.timings.note("total", time.monotonic() - world.began)


def _run(world: World, action: str, conf: dict[str, Any], timeout: float = 300) -> str:
    """Trigger `{job}.{action}` through the REST API; its run id once it succeeded."""
    dag_id = f"{JOB}.{action}"
    run_id = world.cluster.trigger(dag_id, conf)
    _succeeds(world, dag_id, run_id, timeout)
    return run_id


def _succeeds(world: World, dag_id: str, run_id: str, timeout: float = 300) -> None:
    state = world.cluster.wait_finished(dag_id, run_id, timeout)
    assert state == "success", f"{dag_id} {run_id}: {world.cluster.describe(dag_id, run_id)}"


def _start(world: World) -> None:
    triggered = time.monotonic()
    run_id = _run(world, "start", {"new_checkpoints": 1})
    world.timings.note("start DAG: trigger -> success", time.monotonic() - triggered)
    started = world.cluster.xcom(f"{JOB}.start", run_id, "start")
    status = world.status()
    assert status.state in ("RUNNING", "DEGRADED"), status.reason
    assert status.runner.run_token == started["run_token"]
    world.tokens.add(started["run_token"])
    ti = world.cluster.task_instances(f"{JOB}.start", run_id)["start"]
    assert ti["queue"] == LAUNCH_QUEUE, ti  # served by the gateway's worker only


def _commit_after(world: World, after: float, timeout: float = 240) -> float:
    """Seconds from `after` to the job's first commit after it (control plane only)."""

    def committed() -> float | None:
        try:
            head = world.status().head
        except Exception:  # noqa: BLE001 - a read racing a write: asked again
            return None
        at = None if head is None else head.committed_at
        return at - after if at is not None and at > after else None

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seconds = committed()
        if seconds is not None:
            return seconds
        time.sleep(0.5)
    raise AssertionError(f"no commit within {timeout:.0f} s; status: {_quietly(world.status)}")


def _quietly(read: Callable[[], Any]) -> Any:
    try:
        return read()
    except Exception as error:  # noqa: BLE001 - a read racing a write; asked again
        return f"({type(error).__name__}: {error})"


def _lose_a_spark_worker(world: World) -> None:
    killed = time.time()
    world.topology.kill_host("spark-worker-2")
    world.timings.note("spark-worker-2 killed -> next commit", _commit_after(world, killed))
    _commit_after(world, time.time())
    assert alive_workers(world.topology.address("spark-master")) == [
        world.topology.address("spark-worker-1")
    ]


def _savepoint_through_a_scheduler_restart(world: World) -> None:
    """The scheduler is SIGKILLed once the savepoint's task was scheduled, and started
    again: the new one adopts the run (Celery's task, a deferral) and finishes it."""
    dag_id = f"{JOB}.savepoint"
    triggered = time.monotonic()
    run_id = world.cluster.trigger(dag_id, {"format": "native"})
    wait_for(
        "the savepoint task to be scheduled",
        lambda: world.cluster.task_instances(dag_id, run_id)["savepoint"]["state"] is not None,
        world.cluster.components["scheduler"].log,
        timeout=120,
    )
    state = world.cluster.task_instances(dag_id, run_id)["savepoint"]["state"]
    world.cluster.restart("scheduler")
    world.timings.note("scheduler SIGKILLed and restarted; the savepoint task was", state)
    _succeeds(world, dag_id, run_id)
    world.timings.note("savepoint DAG: trigger -> success", time.monotonic() - triggered)
    assert [s.format for s in world.client().savepoints(JOB)] == ["native"]


def _cut_the_gateway_from_s3(world: World) -> None:
    """The gateway (the driver) loses S3 for CUT_SECONDS; the driver rides it out, or the
    monitor DAG (its health asset, watched by the triggerer on `airflow`) restarts it."""
    before = world.status().runner
    world.timings.note("gateway/s3 cut", f"{CUT_SECONDS:g} s, silent")
    world.topology.sever("gateway", "s3")
    try:
        time.sleep(2.0)  # a commit under way at the cut may still land
        first = world.status().head  # the test process still reaches S3
        time.sleep(CUT_SECONDS - 2.0)
        last = world.status().head
    finally:
        world.topology.heal("gateway", "s3")
    healed = time.time()
    assert first is not None and last is not None and last.seq == first.seq, (
        f"commits while the gateway could not reach S3: seq {first} -> {last}"
    )
    world.timings.note("s3 healed -> next commit", _commit_after(world, healed, timeout=300))
    after = world.status().runner
    world.tokens.add(after.run_token)
    how = "the same driver rode it out"
    if (after.run_token, after.epoch) != (before.run_token, before.epoch):
        how = f"a new runner (epoch {before.epoch} -> {after.epoch}, token {after.run_token})"
    world.timings.note("after the cut", how)
    _monitor_runs_settled(world)


def _monitor_runs_settled(world: World, timeout: float = 240) -> None:
    """No monitor run is in flight (a restart racing the upgrade's begin is its own test)."""

    def settled() -> bool:
        runs = world.cluster.runs(f"{JOB}.monitor")
        return all(r["state"] in TERMINAL for r in runs)

    wait_for("the monitor runs to end", settled, world.cluster.components["triggerer"].log, timeout)
    runs = world.cluster.runs(f"{JOB}.monitor")
    summary = [
        f"{r['state']} ({_task_states(world, f'{JOB}.monitor', r['dag_run_id'])})" for r in runs
    ]
    world.timings.note("monitor runs so far", "; ".join(summary) or "none")


def _task_states(world: World, dag_id: str, run_id: str) -> str:
    tasks = world.cluster.task_instances(dag_id, run_id).values()
    return ", ".join(f"{t['task_id']} {t['state']}" for t in tasks)


def _upgrade_losing_worker_1(world: World) -> UpgradeRecord:
    """The upgrade DAG; every process of worker-1 is SIGKILLed while it runs one of
    KILL_DURING, and a new worker is started there (the only `default` worker)."""
    dag_id = f"{JOB}.upgrade"
    triggered = time.monotonic()
    run_id = world.cluster.trigger(dag_id, {"green_spec_path": str(world.green_path), **UPGRADE})
    victim = _kill_worker_1_during(world, dag_id, run_id)
    _succeeds(world, dag_id, run_id, timeout=600)
    world.timings.note("upgrade DAG: trigger -> success", time.monotonic() - triggered)
    _no_wildcard_listeners(world.topology)  # green's driver too, on the gateway's address
    tasks = world.cluster.task_instances(dag_id, run_id)
    assert tasks["start_green"]["queue"] == LAUNCH_QUEUE, tasks["start_green"]
    tries = world.cluster.tries(dag_id, run_id, victim)
    world.timings.note(f"{victim} tries", ", ".join(f"{t['state']}" for t in tries))
    assert len(tries) >= 2, f"{victim} was not retried after worker-1 died: {tries}"
    (record,) = UpgradeRecords(world.client().store, JOB).list()
    assert record.phase == "promoted", record.reason
    world.timings.note("upgrade handover gap (record's gap_s)", float(record.handover["gap_s"]))
    handover = world.cluster.xcom(dag_id, run_id, "handover")
    assert handover["gap_s"] == record.handover["gap_s"]
    return record


def _kill_worker_1_during(world: World, dag_id: str, run_id: str) -> str:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        tasks = world.cluster.task_instances(dag_id, run_id)
        running = [t for t in KILL_DURING if tasks.get(t, {}).get("state") == "running"]
        if running:
            assert tasks[running[0]]["queue"] == "default", tasks[running[0]]
            world.topology.kill_host("worker-1")
            world.cluster.relaunch("worker-1")
            world.timings.note("worker-1 SIGKILLed (all processes) during", running[0])
            return running[0]
        assert world.cluster.run_state(dag_id, run_id) not in TERMINAL, (
            f"the upgrade ended before {KILL_DURING} ran: {world.cluster.describe(dag_id, run_id)}"
        )
        time.sleep(0.3)
    raise AssertionError(f"none of {KILL_DURING} ran: {world.cluster.describe(dag_id, run_id)}")


def _totals(world: World) -> dict[str, tuple[int, int]]:
    spec = load_spec(world.spec_path)
    location = resolve_paths(spec).targets["totals"].location
    rows = read_table_rows(location.uri, location=location)
    return {r["key"]: (r["events"], r["total"]) for r in rows}


def _drain(world: World) -> None:
    """Every published message is in the live totals (the job caught up)."""
    expected, _ = reference([[event for _, event in world.stream.events()]])
    drained = time.monotonic()
    wait_for(
        "the job to catch up with the input",
        lambda: _totals(world) == expected,
        world.cluster.components["gateway"].log,
        timeout=300,
    )
    world.timings.note("input drained", time.monotonic() - drained)


def _stop(world: World) -> None:
    stopping = time.monotonic()
    _run(world, "stop", {"mode": "stop", "savepoint": True})
    world.timings.note("stop DAG: trigger -> success", time.monotonic() - stopping)
    assert world.status().runner.state == "STOPPED"


def _every_run_ended(world: World, timeout: float = 180) -> None:
    """Every DAG run of the job ended by itself (the monitor's too); their states."""
    deadline = time.monotonic() + timeout
    actions = ("start", "savepoint", "upgrade", "stop", "monitor", "rollback")
    while True:
        runs = {a: world.cluster.runs(f"{JOB}.{a}") for a in actions}
        open_runs = [(a, r["dag_run_id"], r["state"]) for a in runs for r in runs[a]]
        open_runs = [run for run in open_runs if run[2] not in TERMINAL]
        if not open_runs:
            break
        assert time.monotonic() < deadline, f"DAG runs that did not end: {open_runs}"
        time.sleep(2)
    for action, found in runs.items():
        if found:
            states = [r["state"] for r in found]
            world.timings.note(f"{action} runs", ", ".join(states))
    for action in ("start", "savepoint", "upgrade", "stop"):
        assert [r["state"] for r in runs[action]] == ["success"], (action, runs[action])


def _drivers_ran_on_the_gateway(world: World, watch: DriverWatch, record: UpgradeRecord) -> None:
    gateway = world.gateway()
    assert watch.drivers, "no driver process of the job was ever seen"
    elsewhere = [s for s in watch.drivers.values() if s.host != "gateway"]
    assert not elsewhere, f"drivers outside the gateway: {elsewhere}"
    wrong_ip = [s for s in watch.drivers.values() if s.spark_local_ip != gateway]
    assert not wrong_ip, f"drivers without SPARK_LOCAL_IP={gateway}: {wrong_ip}"
    executors = {(host, driver) for host, driver in watch.executors.values()}
    assert executors and all(driver == gateway for _, driver in executors), executors
    store = world.client().store
    tokens = {record.blue.get("run_token"), record.green.get("run_token"), *world.tokens}
    tokens.add(store.read_json(f"jobs/{JOB}/launch.json")["token"])
    tokens.discard(None)
    pids = set(watch.drivers)
    for token in sorted(tokens):
        beat = store.read_json(f"drivers/{token}.json")
        assert beat is not None and beat["pid"] in pids, (token, beat, sorted(pids))
    hosts = sorted({s.host or "?" for s in watch.drivers.values()})
    kinds = sorted(_kind(s.command) for s in watch.drivers.values())
    world.timings.note(
        "drivers",
        f"{len(watch.drivers)} processes ({', '.join(kinds)}) on {hosts}, {len(tokens)} run "
        f"tokens, SPARK_LOCAL_IP {gateway}; executors on "
        f"{sorted({h for h, _ in executors})} -> driver {gateway}",
    )


def _kind(command: str) -> str:
    words = command.split()
    verb = words[words.index("streamkeeper") + 1] if "streamkeeper" in words else "?"
    return f"{verb}{' --detach' if '--detach' in words else ''}"


# -- the exact check ---------------------------------------------------------------------


def _committed_batches(checkpoint: Path, last: int | None) -> list[tuple[int, int]]:
    """(batch id, the NATS sequence it ended at) of each completed batch of a checkpoint,
    up to batch `last` if given."""
    done = sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    assert done and done == list(range(done[0], done[0] + len(done))), (checkpoint, done)
    done = [batch for batch in done if last is None or batch <= last]
    ends = []
    for batch in done:
        lines = (checkpoint / "offsets" / str(batch)).read_text().splitlines()
        ends.append((batch, int(json.loads(lines[2])["seq"])))
    return ends


def _input_ranges(chain: list[tuple[Path, int | None]]) -> list[tuple[int, int]]:
    """The (low, high] input range of each batch across the lineage's checkpoint folders:
    blue's (moved aside at the handover) up to its stop savepoint's batch, then green's.
    A restored folder begins with batches over input an earlier folder's batches hold (a
    native savepoint's copy of them, a canonical one's bootstrap): those add nothing;
    every other batch must begin exactly where the previous one ended."""
    covered, ranges = 0, []
    for checkpoint, last in chain:
        previous = None
        for batch, end in _committed_batches(checkpoint, last):
            low = covered if previous is None else previous
            previous = end
            if end <= covered:
                continue
            assert low == covered, f"{checkpoint} batch {batch} starts at {low}, not {covered}"
            ranges.append((covered, end))
            covered = end
    return ranges


def _exact_output(world: World, record: UpgradeRecord) -> int:
    handover = record.handover or {}
    archive = handover.get("blue_checkpoint_archive")
    chain: list[tuple[Path, int | None]] = []
    if archive:  # blue's folder, to the batch of S1, the savepoint green went live from
        chain.append((Path(archive), int(handover["batch_id"])))
    chain.append((world.checkpoint, None))  # green's (the same folder: blue's moved aside)
    ranges = _input_ranges(chain)
    events = world.stream.events()
    assert ranges and ranges[-1][1] >= max(p for p, _ in events), f"input not all read: {ranges}"
    batches = [[e for p, e in events if low < p <= high] for low, high in ranges]
    assert_tables_hold(load_spec(world.spec_path), batches)
    return len(ranges)
