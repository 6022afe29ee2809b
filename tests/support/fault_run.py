"""The long fault run: two jobs on SeaweedFS behind the fault proxy, killed and restarted,
savepointed, upgraded and rolled back through the Airflow DAGs, then checked end to end.

Used by `benchmarks/fault_run.py` (30 minutes by default) and, in a short form, by
`tests/reliability/test_fault_run.py`. What runs:

- **Storage**: SeaweedFS (`weed mini`) on 127.0.0.1, reached by the drivers and by the
  Airflow tasks only through the S3 fault proxy (`tests/support/s3_proxy.py`), which runs
  in its own process (delta-rs can hold the GIL while it waits on S3, so the Airflow
  tasks, which read Delta tables, must not share a process with it). Faults: latency,
  503, 500 (not applied), and reset after apply (the write landed, the answer is lost;
  often on Delta log PUTs, where a blind retry duplicates a batch).
- **Jobs**: the sample job `keyed-totals` (jobs/keyed_totals: merge sink `totals`, append
  sink `changes`) and `dedup` (tests/reliability/jobs/dedup: events resent by their
  producer, each must land once in the append sink `unique`). Input is fed all along:
  one file per job every `feed_period` seconds.
- **Airflow**: a SQLite metadata DB of its own; every lifecycle action is a real DAG run
  (`dag.test()` of the DAG files in dags/, generated from a jobs folder of this run),
  one at a time, on a worker thread: start, monitor, savepoint, upgrade, rollback, stop.
- **Kills**: every `kill_gap` (10-40 s, seeded) a running driver (a random job) gets
  SIGKILL (its process group: the Python driver and its JVM). It is restarted through
  the **start DAG** (`takeover`, resume from its checkpoint), except every
  `monitor_every`-th kill, which is left until its heartbeat is lost and the job is
  FAILED, then restarted by the **monitor DAG** (`restart`). Where the DAG worker is busy
  with the upgrade or the rollback (minutes), a killed `dedup` is restarted **directly**
  with the command the embedded launcher runs (`streamkeeper run --detach --takeover`),
  and `keyed-totals`, which those DAGs drive, is not killed meanwhile.
- **Savepoints**: every `savepoint_every` seconds, the savepoint DAG of one job (in turn).
- **Upgrade and rollback**: at `upgrade_at` of the run, the upgrade DAG moves
  `keyed-totals` blue-green to v2 (jobs/keyed_totals/versions/v2.yaml: a new table
  `means`), and v2 is deployed as the job's spec (the start DAG's restarts launch it);
  at `rollback_at`, v1 is deployed again and the rollback DAG returns the job to the
  upgrade's stop savepoint of blue (tables restored by Delta RESTORE, v1 restarted).
- **End**: kills stop, the input stops, the jobs drain and are stopped by the stop DAG
  (with a savepoint). Checks (tests/support/fault_checks.py), reading SeaweedFS
  directly: exact output (0 lost, 0 duplicated), every Delta table under the root
  audited clean (tests/support/delta_audit.py), no orphaned file, WAL entry, staging
  folder or unfinished savepoint.

`FaultRun(config).run()` returns the figures (`FaultRunReport.to_json()`); `ok` is False
on any violation.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

REPO = Path(__file__).resolve().parents[2]
DEDUP_SPEC = REPO / "tests" / "reliability" / "jobs" / "dedup" / "job.yaml"
SAMPLE = REPO / "jobs" / "keyed_totals"
KEYED, DEDUP = "keyed-totals", "dedup"
BUCKET, ACCESS_KEY, SECRET_KEY = "faults", "fault-run", "fault-run-secret"
FAULT_KINDS = ("latency", "error_503", "error_500", "reset_after_apply")


@dataclass
class FaultRunConfig:
    """How long, how hard, and when each lifecycle action happens (fractions of the run)."""

    minutes: float = 30.0
    seed: int = 1
    workdir: Path | None = None
    kill_gap: tuple[float, float] = (10.0, 40.0)
    quiet_tail: float = 30.0  # no kill this close to the end: the last restarts finish
    # The chaos goes on (within `overtime`) until this many kills were made: a short run's
    # window can pass while both jobs are busy with DAG runs, which are not interrupted.
    min_kills: int = 0
    overtime: float = 240.0  # the chaos goes on this long for an upgrade or rollback in flight
    monitor_every: int = 4
    savepoint_every: float = 240.0
    first_savepoint_at: float = 0.15
    upgrade_at: float = 0.3
    rollback_at: float = 0.6
    probation_seconds: int = 20
    # Probation fails on one failed checkpoint (FAILING), even within the job's tolerance,
    # and the injected faults fail one now and then: an upgrade rolled back that way is
    # tried again (up to this many attempts; more than 1: one must be promoted).
    upgrade_attempts: int = 3
    feed_period: float = 2.0  # a dedup file each period
    keyed_every: int = 2  # a keyed-totals file every this many periods
    events_per_file: int = 100
    dedup_events: int = 60
    dedup_resends: int = 20
    # keyed-totals reads one file per batch (the sample's own setting): its `changes`
    # changelog then cuts the input as green's shadow run does, which the upgrade's
    # comparison needs (tests/unit/test_upgrade_compare.py); dedup reads up to this many.
    files_per_trigger: int = 3
    maintenance_every: int = 20
    drain_timeout: float = 900.0
    report_every: float = 60.0
    keep: bool = False  # keep the working directory (default: only when something failed)


@dataclass
class FaultRunReport:
    """The figures the run prints (its last line is `to_json()`)."""

    minutes: float = 0.0
    seed: int = 0
    kills: int = 0
    kills_by_job: dict[str, int] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)  # start_dag, monitor_dag, direct
    faults: dict[str, int] = field(default_factory=dict)
    s3_requests: int = 0
    savepoints: int = 0
    savepoints_failed: int = 0
    upgrades: int = 0  # promoted
    upgrade_attempts: list[dict[str, Any]] = field(default_factory=list)
    rollbacks: int = 0  # by the rollback DAG
    auto_rollbacks: int = 0  # by the upgrade DAG, after a failed probation
    dag_runs: dict[str, int] = field(default_factory=dict)
    input_files: dict[str, int] = field(default_factory=dict)
    rows_checked: int = 0
    lost: int = 0
    duplicated: int = 0
    tables_audited: int = 0
    audit_problems: list[str] = field(default_factory=list)
    orphans: dict[str, list[str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what happened that is no violation
    seconds: float = 0.0
    workdir: str = ""

    @property
    def ok(self) -> bool:
        return (
            not self.problems
            and not self.audit_problems
            and not self.orphan_count
            and self.lost == 0
            and self.duplicated == 0
            and self.rows_checked > 0
        )

    @property
    def orphan_count(self) -> int:
        """Files nothing references, but for history files awaiting the runner's sweep."""
        from tests.support.fault_checks import AWAITING_SWEEP

        return sum(len(v) for k, v in self.orphans.items() if k != AWAITING_SWEEP)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["ok"] = self.ok
        data["orphan_count"] = self.orphan_count
        return data


# -- the fault proxy, in its own process ------------------------------------------------


def fault_plan(seed: int) -> Any:
    from tests.support.s3_proxy import Fault, FaultPlan

    return FaultPlan(
        [
            Fault("latency", 0.1, latency_ms=(5, 60)),
            Fault("error_503", 0.03),
            Fault("error_500", 0.02),
            Fault("reset_after_apply", 0.02, {"PUT", "POST", "DELETE"}),
            Fault("reset_after_apply", 0.08, {"PUT"}, r"_delta_log/"),
        ],
        seed=seed,
    )


def serve_proxy(upstream: str, stats_path: Path, seed: int) -> None:
    """Run the fault proxy until SIGTERM; its port and counters go to `stats_path`."""
    from tests.support.s3_proxy import S3FaultProxy

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with S3FaultProxy(upstream, plan=fault_plan(seed)) as proxy:
        while True:
            tmp = stats_path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"port": proxy.port, "stats": proxy.stats()}))
            os.replace(tmp, stats_path)
            if stop.wait(1.0):
                break


class ProxyProcess:
    def __init__(self, upstream: str, stats_path: Path, seed: int, log: Path) -> None:
        self.stats_path = stats_path
        with open(log, "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.support.fault_run", "proxy", upstream]
                + [str(stats_path), str(seed)],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                env=os.environ.copy(),
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while not stats_path.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the fault proxy did not start; see {log}")
            time.sleep(0.1)
        self.port = json.loads(stats_path.read_text())["port"]

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stats(self) -> dict[str, int]:
        try:
            return json.loads(self.stats_path.read_text())["stats"]
        except (OSError, ValueError, KeyError):
            return {}

    def stop(self) -> dict[str, int]:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.stats()


# -- input -------------------------------------------------------------------------------


class Feeder(threading.Thread):
    """One new input file per job every `period` seconds, until halted."""

    def __init__(self, events: Path, config: FaultRunConfig) -> None:
        super().__init__(daemon=True, name="feeder")
        self.keyed_dir, self.dedup_dir = events / "keyed", events / "dedup"
        self.config = config
        self.keyed: list[Path] = []
        self.dedup: list[Path] = []
        self.halt = threading.Event()
        self.error: BaseException | None = None
        self.ticks = 0
        for _ in range(3):
            self._write()

    def _write(self) -> None:
        from jobs.keyed_totals.sample_events import write_event_files
        from tests.support.fault_checks import write_dedup_file

        if self.ticks % self.config.keyed_every == 0:
            self.keyed += write_event_files(
                self.keyed_dir,
                files=1,
                events_per_file=self.config.events_per_file,
                first_file=len(self.keyed),
            )
        self.ticks += 1
        self.dedup.append(
            write_dedup_file(
                self.dedup_dir,
                len(self.dedup),
                events=self.config.dedup_events,
                resends=self.config.dedup_resends,
            )
        )

    def run(self) -> None:
        try:
            while not self.halt.wait(self.config.feed_period):
                self._write()
        except BaseException as error:  # noqa: BLE001 - reported by the run
            self.error = error

    def stop(self) -> None:
        self.halt.set()
        if self.is_alive():
            self.join()


# -- the jobs folder and its releases -------------------------------------------------------


def _set(spec: dict[str, Any], dotted: str, value: Any) -> None:
    node = spec
    *path, last = dotted.split(".")
    for part in path:
        node = node.setdefault(part, {})
    node[last] = value


def _release(source_spec: Path, files: list[Path], folder: Path, settings: dict) -> Path:
    """A copy of a spec with this run's settings, beside the files it names."""
    folder.mkdir(parents=True, exist_ok=True)
    for path in files:
        shutil.copy(path, folder / path.name)
    spec = yaml.safe_load(source_spec.read_text())
    for key, value in settings.items():
        _set(spec, key, value)
    target = folder / "job.yaml"
    target.write_text(yaml.safe_dump(spec, sort_keys=False))
    return target


def _deploy(release: Path, job_folder: Path) -> None:
    """Make `release` the job's spec in the jobs folder the DAGs are generated from."""
    job_folder.mkdir(parents=True, exist_ok=True)
    for path in release.iterdir():
        shutil.copy(path, job_folder / path.name)


# -- DAG runs ---------------------------------------------------------------------------------


@dataclass
class DagRunResult:
    dag_id: str
    run_id: str
    state: str
    seconds: float
    tasks: dict[str, Any]
    xcom: dict[str, Any]

    def task_state(self, task_id: str) -> str | None:
        entry = self.tasks.get(task_id)
        return None if entry is None else entry[0]


def run_dag(dag_id: str, **conf: Any) -> DagRunResult:
    """`dag.test()` of a freshly parsed DAG (a parsed DAG keeps the last run's Params)."""
    from airflow.dag_processing.dagbag import DagBag

    from tests.support.airflow_runs import task_states, xcoms

    action = dag_id.rsplit(".", 1)[1]
    bag = DagBag(dag_folder=str(REPO / "dags" / f"{action}.py"))
    started = time.monotonic()
    run = bag.dags[dag_id].test(run_conf=conf)
    return DagRunResult(
        dag_id,
        run.run_id,
        str(run.state),
        time.monotonic() - started,
        task_states(dag_id, run.run_id),
        xcoms(dag_id, run.run_id),
    )


# -- the run -----------------------------------------------------------------------------------


@dataclass
class JobState:
    name: str
    restart_pending: bool = False  # killed, its restart not asked for yet
    restart_mode: str = "start_dag"
    killed_at: float = 0.0
    next_status_check: float = 0.0
    busy: int = 0  # DAG runs about it queued or running: it is not killed meanwhile
    failed_restarts: int = 0

    @property
    def settled(self) -> bool:
        """Up (as far as the run knows) and no DAG run about it in flight."""
        return not self.restart_pending and self.busy == 0


class FaultRun:
    def __init__(self, config: FaultRunConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.report = FaultRunReport(minutes=config.minutes, seed=config.seed)
        self.report.restarts = {"start_dag": 0, "monitor_dag": 0, "direct": 0}
        self.report.kills_by_job = {KEYED: 0, DEDUP: 0}
        self.work = Path(config.workdir or Path.cwd() / f".fault-run-{uuid.uuid4().hex[:8]}")
        self.work = self.work.resolve()
        self.root = f"s3://{BUCKET}/run-{uuid.uuid4().hex[:8]}"
        self.jobs = {KEYED: JobState(KEYED), DEDUP: JobState(DEDUP)}
        # DAG runs wait here for the main thread (dag.test() sets signal handlers, which
        # only the main thread may): one at a time, in the order asked.
        self.lane: queue.Queue[Callable[[], None]] = queue.Queue()
        self.chaos_error: BaseException | None = None
        self.lane_long = 0  # upgrade/rollback DAG runs queued or running
        self.lane_pending = 0
        self.lock = threading.Lock()
        self.upgrade: dict[str, Any] = {}
        self.out = sys.stdout
        self.seaweed: Any = None
        self.proxy: ProxyProcess | None = None
        self.feeder: Feeder | None = None
        self.started = time.monotonic()

    # -- output -----------------------------------------------------------------------

    def say(self, message: str) -> None:
        elapsed = time.monotonic() - self.started
        line = f"[fault-run {elapsed / 60:5.1f} min] {message}"
        print(line, file=self.out, flush=True)
        with open(self.work / "fault-run.log", "a") as log:
            log.write(line + "\n")

    def figures(self) -> str:
        stats = self.proxy.stats() if self.proxy else {}
        faults = {k: stats.get(k, 0) for k in FAULT_KINDS}
        heads = {}
        for job in self.jobs:
            try:
                head = self.client.status(job).head
                heads[job] = None if head is None else head.seq
            except Exception:  # noqa: BLE001 - a figure only
                heads[job] = "?"
        r = self.report
        return (
            f"kills {r.kills} {r.kills_by_job}, restarts {r.restarts}, faults {faults}, "
            f"savepoints {r.savepoints} (+{r.savepoints_failed} failed), upgrades {r.upgrades}"
            f"/{len(r.upgrade_attempts)}, rollbacks {r.rollbacks} (+{r.auto_rollbacks} automatic)"
            f", input files {self._input_files()}"
            f", heads {heads}, DAG queue {self.lane_pending}"
        )

    def _input_files(self) -> dict[str, int]:
        if self.feeder is None:
            return {}
        return {KEYED: len(self.feeder.keyed), DEDUP: len(self.feeder.dedup)}

    # -- set-up ---------------------------------------------------------------------------

    def _environment(self) -> None:
        """Airflow reads its home and settings at import: set them all first."""
        paths = [str(REPO / "src"), str(REPO), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
        os.environ.update(
            PYTHONPATH=os.pathsep.join(dict.fromkeys(p for p in paths if p)),
            AIRFLOW_HOME=str(self.work / "airflow"),
            AIRFLOW__CORE__LOAD_EXAMPLES="False",
            AIRFLOW__CORE__DAGS_FOLDER=str(REPO / "dags"),
            AIRFLOW__STREAMKEEPER__JOBS_FOLDER=str(self.work / "jobs"),
            AIRFLOW__STREAMKEEPER__WORKDIR=str(self.work / "drivers"),
            AIRFLOW__STREAMKEEPER__SPEC_FOLDERS=str(self.work / "releases"),  # green's spec
            AIRFLOW__STREAMKEEPER__ALERT_SINK=str(self.work / "alerts.jsonl"),
            STREAMKEEPER_SPARK_LOG_LEVEL="ERROR",
        )
        for key in [k for k in os.environ if k.startswith("AWS_")]:
            del os.environ[key]  # the drivers get their storage from the connection only

    def _specs(self) -> None:
        c = self.config
        common = {
            "checkpoint.tolerable_failures": 10,
            "spark.master": "local[2,4]",  # a task failed by a fault is retried, as on a cluster
            "spark.shuffle_partitions": 2,
            "maintenance.every": c.maintenance_every,
            "maintenance.history_retention": "0s",  # expire all the log maintenance may
            "airflow.monitor_schedule": None,
            "airflow.savepoint_schedule": None,
            "airflow.restart": {"enabled": True, "max_attempts": 1000, "backoff": "0s"},
        }
        keyed = {
            **common,
            "source.options.maxFilesPerTrigger": 1,
            "source.path": str(self.work / "events" / "keyed"),
            "checkpoint.dir": str(self.work / "checkpoints" / KEYED),
        }
        releases = self.work / "releases"
        self.v1 = _release(
            SAMPLE / "job.yaml",
            [SAMPLE / "transform.py", SAMPLE / "expectations.yaml"],
            releases / "keyed-totals-v1",
            keyed,
        )
        self.v2 = _release(
            SAMPLE / "versions" / "v2.yaml",
            [SAMPLE / "versions" / "transform_v2.py", SAMPLE / "expectations.yaml"],
            releases / "keyed-totals-v2",
            keyed,
        )
        _deploy(self.v1.parent, self.work / "jobs" / "keyed_totals")
        dedup = {
            **common,
            "source.options.maxFilesPerTrigger": c.files_per_trigger,
            "source.path": str(self.work / "events" / "dedup"),
            "checkpoint.dir": str(self.work / "checkpoints" / DEDUP),
        }
        _release(
            DEDUP_SPEC, [DEDUP_SPEC.parent / "transform.py"], self.work / "jobs" / "dedup", dedup
        )

    def setup(self) -> None:
        from streamkeeper.client import StreamkeeperClient
        from streamkeeper.storage import Location, S3Settings
        from tests.support.services import start_seaweedfs

        self.work.mkdir(parents=True, exist_ok=True)
        self.report.workdir = str(self.work)
        self._environment()
        self._specs()
        self.seaweed = start_seaweedfs(self.work / "seaweedfs", BUCKET, ACCESS_KEY, SECRET_KEY)
        self.proxy = ProxyProcess(
            f"127.0.0.1:{self.seaweed.port}",
            self.work / "proxy-stats.json",
            self.config.seed,
            self.work / "proxy.log",
        )
        os.environ["AIRFLOW_CONN_STREAMKEEPER_DEFAULT"] = json.dumps(
            {
                "conn_type": "streamkeeper",
                "host": self.proxy.endpoint_url,
                "login": ACCESS_KEY,
                "password": SECRET_KEY,
                "extra": {"root": self.root, "allow_http": True},
            }
        )
        # The run's own reads go to SeaweedFS directly: what it observes is not faulted.
        self.s3 = S3Settings(
            endpoint_url=self.seaweed.endpoint_url,
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            allow_http=True,
        )
        self.root_location = Location(self.root, self.s3)
        self.client = StreamkeeperClient(self.root, s3=self.s3)
        from tests.support.airflow_runs import migrate_metadata_db

        seconds = migrate_metadata_db()
        self.say(
            f"SeaweedFS on {self.seaweed.port}, proxy on {self.proxy.port}, "
            f"Airflow DB in {seconds:.0f} s"
        )
        self.feeder = Feeder(self.work / "events", self.config)
        self.feeder.start()

    # -- DAG lane -------------------------------------------------------------------------

    def submit(
        self,
        job: str,
        what: str,
        dag_id: str,
        conf: dict[str, Any],
        done: Callable[[DagRunResult | None, BaseException | None], None],
        long: bool = False,
    ) -> None:
        """Queue a DAG run for the main thread; `done` gets its result (or error) there."""
        state = self.jobs[job]
        with self.lock:
            self.lane_pending += 1
            self.lane_long += int(long)
            state.busy += 1

        def work() -> None:
            result, error = None, None
            try:
                result = run_dag(dag_id, **conf)
                key = f"{dag_id}:{result.state}"
                self.report.dag_runs[key] = self.report.dag_runs.get(key, 0) + 1
                self.say(f"DAG {dag_id} ({what}): {result.state} in {result.seconds:.0f} s")
            except BaseException as exc:  # noqa: BLE001 - reported, the run goes on
                error = exc
                self.say(f"DAG {dag_id} ({what}) raised: {exc!r}")
                traceback.print_exc(file=sys.stderr)
            try:
                done(result, error)
            finally:
                with self.lock:
                    self.lane_pending -= 1
                    self.lane_long -= int(long)
                    state.busy -= 1

        self.lane.put(work)

    def lane_idle(self) -> bool:
        with self.lock:
            return self.lane_pending == 0

    def pump(self, timeout: float = 0.5) -> None:
        """Run the next queued DAG run, if one comes within `timeout` (main thread)."""
        try:
            work = self.lane.get(timeout=timeout)
        except queue.Empty:
            return
        work()

    # -- drivers ----------------------------------------------------------------------------

    def driver_pids(self, job: str) -> list[int]:
        """Live driver processes of `job`: its heartbeat's and its launch record's."""
        pids = set()
        for name in ("heartbeat.json", "launch.json"):
            record = self.client.store.read_json(f"jobs/{job}/{name}") or {}
            if record.get("pid"):
                pids.add(int(record["pid"]))
        alive = []
        for pid in pids:
            try:
                process = psutil.Process(pid)
                if process.status() != psutil.STATUS_ZOMBIE and "streamkeeper" in " ".join(
                    process.cmdline()
                ):
                    alive.append(pid)
            except psutil.Error:
                continue
        return alive

    def kill(self, job: str) -> bool:
        pids = self.driver_pids(job)
        if not pids:
            return False
        for pid in pids:
            try:  # the driver leads its own session: its group is it and its JVM
                target = os.getpgid(pid)
                if target == os.getpgid(0):
                    os.kill(pid, signal.SIGKILL)
                else:
                    os.killpg(target, signal.SIGKILL)
            except ProcessLookupError:
                continue
        return True

    def _start_conf(self) -> dict[str, Any]:
        return {"start_from": "resume", "takeover": True, "new_checkpoints": 0}

    def start_directly(self, job: str) -> None:
        """The embedded launcher's command, without Airflow (while its DAG worker is busy)."""
        spec = self.work / "jobs" / ("keyed_totals" if job == KEYED else "dedup") / "job.yaml"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "_AIRFLOW"))}
        env.update(
            AWS_ENDPOINT_URL=self.proxy.endpoint_url,
            AWS_ACCESS_KEY_ID=ACCESS_KEY,
            AWS_SECRET_ACCESS_KEY=SECRET_KEY,
            AWS_REGION="us-east-1",
            AWS_ALLOW_HTTP="true",
        )
        workdir = self.work / "drivers"
        workdir.mkdir(exist_ok=True)
        command = [sys.executable, "-m", "streamkeeper", "run", str(spec), "--root", self.root]
        done = subprocess.run(
            [*command, "--takeover", "--detach"],
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            raise RuntimeError(f"direct start of {job} failed: {done.stderr[-2000:]}")

    def restart(self, job: str) -> None:
        state = self.jobs[job]
        if state.restart_mode == "monitor_dag":
            now = time.time()
            if now - state.killed_at < 25 or now < state.next_status_check:
                return
            state.next_status_check = now + 3
            if self.client.status(job).state != "FAILED":
                return  # its heartbeat is not lost yet
        if self.lane_long and job != KEYED:
            self.start_directly(job)
            self.report.restarts["direct"] += 1
            state.restart_pending = False
            self.say(f"{job} restarted directly (the DAG worker runs an upgrade or rollback)")
            return
        state.restart_pending = False
        mode = state.restart_mode

        def done(result: DagRunResult | None, error: BaseException | None) -> None:
            task = "restart" if mode == "monitor_dag" else "start"
            if result is not None and result.task_state(task) == "success":
                self.report.restarts[mode] += 1
                state.failed_restarts = 0
                return
            state.failed_restarts += 1
            reason = error or (result.tasks if result else None)
            self.say(f"{job}: {mode} restart failed ({reason}); trying again by the start DAG")
            if state.failed_restarts > 5:
                self.report.problems.append(f"{job} could not be restarted: {reason}")
            state.restart_mode, state.restart_pending = "start_dag", True

        if mode == "monitor_dag":
            conf = {"restart": True, "backoff_seconds": 0, "max_attempts": 1000}
            self.submit(job, "restart", f"{job}.monitor", conf, done)
        else:
            self.submit(job, "restart", f"{job}.start", self._start_conf(), done)

    # -- lifecycle actions ---------------------------------------------------------------

    def start_jobs(self) -> None:
        for job in self.jobs:
            result = run_dag(f"{job}.start", new_checkpoints=0)
            self.say(f"DAG {job}.start: {result.state} in {result.seconds:.0f} s")
            if result.state != "success":
                raise RuntimeError(f"{job} did not start: {result.tasks} {result.xcom}")

    def savepoint(self, job: str) -> None:
        def done(result: DagRunResult | None, error: BaseException | None) -> None:
            if result is not None and result.state == "success":
                self.report.savepoints += 1
            else:
                self.report.savepoints_failed += 1

        self.submit(job, "savepoint", f"{job}.savepoint", {}, done)

    def begin_upgrade(self) -> None:
        from streamkeeper.upgrade.record import UpgradeRecords

        self.upgrade["asked"] = True
        known = {r.id for r in UpgradeRecords(self.client.store, KEYED).list()}
        conf = {
            "green_spec_path": str(self.v2),
            "probation_seconds": self.config.probation_seconds,
            "probation_checkpoints": 2,
            "shadow_checkpoints": 2,
        }

        def done(result: DagRunResult | None, error: BaseException | None) -> None:
            from streamkeeper.upgrade.record import UpgradeRecords

            records = UpgradeRecords(self.client.store, KEYED).list()
            record = next((r for r in reversed(records) if r.id not in known), None)
            if record is None:  # begin refused (the job was not RUNNING): not an attempt
                self.say(f"the upgrade did not begin ({error or 'see the begin task'})")
                self.report.notes.append("an upgrade did not begin: the job was not RUNNING")
                self.upgrade["retry_after"] = time.monotonic() + 15
                self.upgrade.pop("asked")
                return
            outcome = {
                "upgrade": record.id,
                "phase": record.phase,
                "reason": record.reason,
                "probation": (record.probation or {}).get("reason"),
            }
            if record.phase == "promoted":
                _deploy(self.v2.parent, self.work / "jobs" / "keyed_totals")
                self.report.upgrades += 1
                self.upgrade["record"] = record  # first: the chaos loop reads it unlocked
                self.report.upgrade_attempts.append(outcome)
                self.say(f"upgrade {record.id} promoted; v2 deployed")
                return
            if record.phase == "rolled_back":  # probation failed: the DAG's own rollback ran
                self.report.auto_rollbacks += 1
            elif record.phase != "rejected" or "differs" in str(record.reason):
                # A correct green is never rejected, and no upgrade ends half way.
                self.report.problems.append(f"the upgrade went wrong: {outcome} {error or ''}")
            self.say(f"upgrade not promoted: {outcome}")
            self.upgrade["retry_after"] = time.monotonic() + 30
            self.report.upgrade_attempts.append(outcome)
            attempts = len(self.report.upgrade_attempts)
            if attempts < self.config.upgrade_attempts:
                self.upgrade.pop("asked")  # try again (the chaos loop waits a little)
            elif self.config.upgrade_attempts > 1:
                self.report.problems.append(f"no upgrade promoted in {attempts} attempts")

        self.submit(KEYED, "upgrade to v2", f"{KEYED}.upgrade", conf, done, long=True)

    def begin_rollback(self) -> None:
        record = self.upgrade["record"]
        self.upgrade["rollback_asked"] = True
        _deploy(self.v1.parent, self.work / "jobs" / "keyed_totals")
        conf = {"savepoint_id": record.handover["blue_savepoint"], "spec_path": str(self.v1)}

        def done(result: DagRunResult | None, error: BaseException | None) -> None:
            self.upgrade["rollback_done"] = True
            if result is not None and result.state == "success":
                self.report.rollbacks += 1
                self.say(f"rolled back to {conf['savepoint_id']}; v1 deployed")
            else:
                reason = error or (result.tasks if result else None)
                self.report.problems.append(f"the rollback failed: {reason}")

        self.submit(KEYED, "rollback to v1", f"{KEYED}.rollback", conf, done, long=True)

    # -- the loop -----------------------------------------------------------------------------

    def _chaos_thread(self) -> None:
        try:
            self.chaos()
        except BaseException as error:  # noqa: BLE001 - raised again by the main thread
            self.chaos_error = error
            traceback.print_exc(file=sys.stderr)

    def chaos(self) -> None:
        """Kills, restarts asked for, savepoints, the upgrade and the rollback (a thread:
        DAG runs are queued for the main thread)."""
        c = self.config
        duration = c.minutes * 60
        begin = time.monotonic()
        next_kill = begin + self.rng.uniform(*c.kill_gap)
        next_savepoint = begin + c.first_savepoint_at * duration
        next_report = begin + c.report_every
        savepoint_turn = 0
        while time.monotonic() - begin < duration or (
            (self._lifecycle_pending() or self.report.kills < c.min_kills)
            and time.monotonic() - begin < duration + c.overtime
        ):
            now = time.monotonic()
            may_kill = now - begin < duration - c.quiet_tail or self.report.kills < c.min_kills
            if now >= next_kill and may_kill:
                next_kill = self._kill_one(now)
            for job, state in self.jobs.items():
                if state.restart_pending:
                    self.restart(job)
            turn = [DEDUP, KEYED][savepoint_turn % 2]
            if now >= next_savepoint and self.jobs[turn].settled:
                self.savepoint(turn)  # only of a job that runs: else its restart waits behind
                savepoint_turn += 1
                next_savepoint += c.savepoint_every
            self._lifecycle((now - begin) / duration)
            if now >= next_report:
                self.say(self.figures())
                next_report += c.report_every
            if self.feeder and self.feeder.error:
                raise RuntimeError(f"the feeder failed: {self.feeder.error!r}")
            time.sleep(0.5)

    def _lifecycle_pending(self) -> bool:
        """No upgrade promoted yet (and attempts left), or promoted, not rolled back yet."""
        if "record" in self.upgrade:
            return "rollback_done" not in self.upgrade
        return len(self.report.upgrade_attempts) < self.config.upgrade_attempts

    def _lifecycle(self, elapsed: float) -> None:
        """The upgrade, then the rollback, when their time came and the job is quiet."""
        c = self.config
        # Blue replays a batch of several files after a restart: the upgrade begins
        # once that is behind it (see files_per_trigger).
        keyed = self.jobs[KEYED]
        quiet = keyed.settled and time.time() - keyed.killed_at > 45
        if not quiet or time.monotonic() < self.upgrade.get("retry_after", 0):
            return
        if elapsed >= c.upgrade_at and "asked" not in self.upgrade:
            if self.client.status(KEYED).state == "RUNNING":  # begin refuses anything else
                self.begin_upgrade()
            else:
                self.upgrade["retry_after"] = time.monotonic() + 5
        elif (
            elapsed >= c.rollback_at
            and "record" in self.upgrade
            and "rollback_asked" not in self.upgrade
        ):
            self.begin_rollback()

    def _kill_one(self, now: float) -> float:
        candidates = [job for job, state in self.jobs.items() if state.settled]
        self.rng.shuffle(candidates)  # then the job killed least so far first
        candidates.sort(key=lambda job: self.report.kills_by_job[job])
        for job in candidates:
            if self.kill(job):
                state = self.jobs[job]
                self.report.kills += 1
                self.report.kills_by_job[job] += 1
                state.killed_at = time.time()
                state.restart_pending = True
                monitor = self.report.kills % self.config.monitor_every == 0
                state.restart_mode = "monitor_dag" if monitor else "start_dag"
                self.say(
                    f"SIGKILL {job} (kill {self.report.kills}; restart by {state.restart_mode})"
                )
                return now + self.rng.uniform(*self.config.kill_gap)
        return now + 2.0  # nothing to kill right now: try again shortly

    # -- the end -------------------------------------------------------------------------------

    def settle(self) -> None:
        """Every DAG done, every job running again (restarted if it is down)."""
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            for job, state in self.jobs.items():
                if state.restart_pending:
                    self.restart(job)
            self.pump(timeout=2.0)
            if self.lane_idle() and not any(s.restart_pending for s in self.jobs.values()):
                states = {job: self.client.status(job).state for job in self.jobs}
                down = [j for j, s in states.items() if s not in ("RUNNING", "DEGRADED")]
                if not down:
                    return
                for job in down:
                    if states[job] == "FAILED" or not self.driver_pids(job):
                        self.say(f"{job} is {states[job]} after the chaos: restarting it")
                        self.jobs[job].restart_mode = "start_dag"
                        self.jobs[job].restart_pending = True
        raise RuntimeError("the jobs did not settle within 15 minutes")

    def drain(self) -> None:
        from tests.support.fault_checks import _rows

        assert self.feeder is not None
        self.feeder.stop()
        self.report.input_files = {KEYED: len(self.feeder.keyed), DEDUP: len(self.feeder.dedup)}
        from jobs.keyed_totals.sample_events import expected_results

        totals, _ = expected_results(self.feeder.keyed)
        unique = self.config.dedup_events * len(self.feeder.dedup)
        totals_at = self.root_location.child("tables/totals")
        unique_at = self.root_location.child("tables/unique")
        deadline = time.monotonic() + self.config.drain_timeout
        while time.monotonic() < deadline:
            try:
                got = {r["key"]: (r["events"], r["total"]) for r in _rows(totals_at)}
                count = len(_rows(unique_at))
            except Exception as error:  # noqa: BLE001 - keep waiting
                self.say(f"drain: tables not readable yet ({error!r})")
                got, count = {}, 0
            if got == totals and count >= unique:
                self.say("drained: both jobs processed every input file")
                return
            for job in self.jobs:
                if self.client.status(job).state == "FAILED":
                    self.say(f"{job} FAILED while draining: restarting it")
                    run_dag(f"{job}.start", **self._start_conf())
            time.sleep(5)
        self.report.problems.append(
            f"the jobs did not drain within {self.config.drain_timeout:.0f} s"
        )

    def stop_jobs(self) -> None:
        for job in self.jobs:
            result = run_dag(f"{job}.stop", mode="stop", savepoint=True)
            self.say(f"DAG {job}.stop: {result.state} in {result.seconds:.0f} s")
            if result.state == "success":
                self.report.savepoints += 1
            else:
                self.report.problems.append(f"the stop DAG of {job} failed: {result.tasks}")
        self._stop_leftover_drivers()

    def _stop_leftover_drivers(self) -> None:
        from tests.support.airflow_runs import stop_driver

        for job in self.client.store.children("jobs"):
            for pid in self.driver_pids(job):
                self.say(f"stopping a leftover driver of {job} (pid {pid})")
                stop_driver(pid, grace=30)

    def check(self) -> None:
        from tests.support.delta_audit import audit_table
        from tests.support.fault_checks import check_dedup, check_keyed, find_orphans

        assert self.feeder is not None
        root = self.root_location
        keyed = check_keyed(
            root.child("tables/totals"), root.child("tables/changes"), self.feeder.keyed
        )
        dedup = check_dedup(root.child("tables/unique"), self.feeder.dedup)
        for verdict in (keyed, dedup):
            self.report.rows_checked += verdict.rows_checked
            self.report.lost += verdict.lost
            self.report.duplicated += verdict.duplicated
            self.report.problems += verdict.problems
        tables = delta_tables(root)
        self.report.tables_audited = len(tables)
        for table in tables:
            self.report.audit_problems += [f"{table.uri}: {p}" for p in audit_table(table)]
        checkpoints = [self.work / "checkpoints" / KEYED, self.work / "checkpoints" / DEDUP]
        self.report.orphans = find_orphans(root, tables, checkpoints)

    def run(self) -> FaultRunReport:
        try:
            self.setup()
            self.start_jobs()
            self.say("both jobs running; the chaos begins")
            chaos = threading.Thread(target=self._chaos_thread, name="chaos", daemon=True)
            chaos.start()
            while chaos.is_alive():
                self.pump()
            if self.chaos_error is not None:
                raise self.chaos_error
            self.say("chaos over: " + self.figures())
            self.settle()
            self.drain()
            self.stop_jobs()
            stats = self.proxy.stop() if self.proxy else {}
            self.report.faults = {k: stats.get(k, 0) for k in FAULT_KINDS}
            self.report.s3_requests = stats.get("requests", 0)
            self.check()
        except BaseException as error:  # noqa: BLE001 - reported in the figures
            self.report.problems.append(f"the run stopped: {error!r}")
            traceback.print_exc(file=sys.stderr)
        finally:
            self.teardown()
        self.report.seconds = round(time.monotonic() - self.started, 1)
        return self.report

    def teardown(self) -> None:
        if self.feeder is not None:
            self.feeder.stop()
        try:
            if self.seaweed is not None:
                self._stop_leftover_drivers()
        except Exception:  # noqa: BLE001 - best effort
            traceback.print_exc(file=sys.stderr)
        if self.proxy is not None:
            stats = self.proxy.stop()
            if not self.report.faults:
                self.report.faults = {k: stats.get(k, 0) for k in FAULT_KINDS}
                self.report.s3_requests = stats.get("requests", 0)
        if self.seaweed is not None:
            self.seaweed.stop()
        if self.report.ok and not self.config.keep:
            shutil.rmtree(self.work, ignore_errors=True)


def delta_tables(root: Any) -> list[Any]:
    """Every Delta table below the root (live, shadow, history, canonical state)."""
    keys = root.store().list("")
    found = sorted({k.split("/_delta_log/", 1)[0] for k in keys if "/_delta_log/" in k})
    return [root.child(prefix) for prefix in found]


def main(argv: list[str] | None = None) -> None:
    """`python -m tests.support.fault_run proxy UPSTREAM STATS SEED` (the proxy process)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["proxy"])
    parser.add_argument("upstream")
    parser.add_argument("stats", type=Path)
    parser.add_argument("seed", type=int)
    args = parser.parse_args(argv)
    serve_proxy(args.upstream, args.stats, args.seed)


if __name__ == "__main__":
    main()
