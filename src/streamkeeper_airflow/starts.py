"""Idempotent starts: a retried or repeated start finds the driver already running.

The Airflow layer keeps one record per job in the control plane, beside the runner's:

    jobs/{job}/launch.json   the latest launch: run token, launcher, host, pid, log,
                             the lineage's epoch and head before it, how it was started

It is written by compare-and-swap, so of two starters racing (a retry and a second DAG
run, two schedulers) exactly one launches and the other sees its launch. A start
decides from three observations (`plan_start`, pure):

1. a live runner (heartbeat STARTING/RUNNING, not lost): ours by run token -> attach;
   another's -> attach if the start only asks the job to run ("resume"), else refuse
   (a restore must not run beside a live runner) unless `takeover`;
2. a launch still pending (its driver beats `drivers/{token}.json` as booting, or was
   launched less than `first_beat_grace` ago and has not beaten yet): the same choice;
3. otherwise -> launch, after claiming the record.

The run token is recorded by the runner in its heartbeat (`run --run-token`), so a
start recognises its own driver wherever it runs. Whether a driver is alive is read
from the control plane only (its heartbeat, its own beat, the launch record), never
from a pid or a hostname, which say nothing on another host (a gateway, a pod) and do
not even tell network namespaces or containers apart. The lineage's fence (a second live
runner without --takeover fails) stays the last line of defence, not the mechanism.
"""

from __future__ import annotations

import hashlib
import socket
import time
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from streamkeeper.lineage.driver_beat import BeatReading, beat_key, read_beat
from streamkeeper_airflow import settings
from streamkeeper_airflow.errors import StartRefusedError

if TYPE_CHECKING:
    from streamkeeper.client import StatusReport
    from streamkeeper.storage import ObjectStore
    from streamkeeper_airflow.launchers.base import LaunchedDriver, Launcher, LaunchRequest

StartFrom = Literal["resume", "latest_checkpoint", "checkpoint", "savepoint"]
START_FROM: tuple[str, ...] = ("resume", "latest_checkpoint", "checkpoint", "savepoint")
NO_BEAT = read_beat(None, 0.0)
_LIVE = ("STARTING", "RUNNING")


def launch_key(job: str) -> str:
    return f"jobs/{job}/launch.json"


def run_token_for(dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> str:
    """The token of one task instance: the same for each of its tries, unique otherwise."""
    digest = hashlib.sha256(f"{dag_id}\n{run_id}\n{task_id}\n{map_index}".encode()).hexdigest()
    return f"af-{digest[:24]}"


@dataclass(frozen=True)
class LaunchRecord:
    """`jobs/{job}/launch.json`: the latest launch of a job by the Airflow layer."""

    token: str
    job: str
    state: Literal["launching", "launched", "failed"]
    requested_at: float
    host: str
    after_epoch: int  # the lineage's runner epoch before this launch: its runner's is higher
    baseline_seq: int  # the lineage's head before this launch (-1: none)
    start_from: str = "resume"
    launcher: str | None = None
    pid: int | None = None
    process_started_at: float | None = None
    launched_at: float | None = None
    log: str | None = None
    error: str | None = None
    request: dict[str, Any] = field(default_factory=dict)  # spec, overrides, master, workdir
    origin: dict[str, Any] = field(default_factory=dict)  # dag_id, run_id, task_id, try

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LaunchRecord:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class StartPlan:
    """What a start does: launch a driver, attach to one, or refuse."""

    action: Literal["launch", "attach", "refuse"]
    reason: str
    token: str | None = None  # the run token to follow (None: whichever runner is live)
    after_epoch: int = 0
    baseline_seq: int = -1
    launch: LaunchRecord | None = None


def runner_live(report: StatusReport | None) -> bool:
    """A runner whose heartbeat says STARTING/RUNNING and is not lost."""
    return (
        report is not None
        and report.runner is not None
        and report.runner.state in _LIVE
        and report.state != "FAILED"
    )


def driver_gone(
    report: StatusReport | None,
    record: LaunchRecord | None,
    token: str,
    beat: BeatReading,
    now: float,
    grace: float | None = None,
) -> str | None:
    """Why the driver of run `token` is known to have ended, or None if it may be alive.

    Its heartbeat tells once it beats as the job (ended, or lost). Before that, e.g. while
    it restores a savepoint (a restore takes no epoch and writes no heartbeat), its own
    beat does (`beat`: exited, or stale), or its absence `grace` seconds after the
    launch of `token` (`record`): the driver never started.
    """
    runner = None if report is None else report.runner
    if runner is not None and runner.run_token == token:
        if runner_live(report):
            return None
        assert report is not None
        return f"its heartbeat says {runner.state} (job {report.state})"
    if record is not None and record.token == token and record.state == "failed":
        return f"its launch failed: {record.error}"
    if beat.ended:
        return beat.describe()
    if beat.state == "none" and record is not None and record.token == token:
        waited = now - (record.launched_at or record.requested_at)
        if record.state == "launched" and waited > _grace(grace):
            return (
                f"its driver never beat in the {waited:.0f}s since its launch "
                f"({record.launcher} on {record.host}); see its log {record.log}"
            )
    return None


def launch_pending(
    record: LaunchRecord | None,
    report: StatusReport | None,
    beat: BeatReading,
    now: float,
    grace: float | None = None,
) -> bool:
    """Has the record's driver been launched (or being launched) but not beaten as the
    job yet, and may it still?"""
    if record is None or record.state == "failed":
        return False
    runner = None if report is None else report.runner
    if runner is not None and runner.run_token == record.token:
        if (runner.epoch or 0) > record.after_epoch:
            return False  # it beat: live (seen as a runner) or ended
    if beat.state != "none":
        return beat.state == "booting"  # handed over: only its heartbeat tells now
    since = record.launched_at or record.requested_at
    return now - since < _grace(grace)


def _grace(grace: float | None) -> float:
    return settings.first_beat_grace() if grace is None else grace


def plan_start(
    *,
    token: str,
    start_from: str,
    takeover: bool,
    report: StatusReport | None,
    record: LaunchRecord | None,
    now: float,
    beat: BeatReading = NO_BEAT,
    grace: float | None = None,
) -> StartPlan:
    """Decide a start from the job's status, its latest launch record and the beat of
    that launch's driver (see module doc)."""
    head = -1 if report is None or report.head is None else report.head.seq
    if runner_live(report):
        assert report is not None and report.runner is not None
        runner = report.runner
        epoch = int(runner.epoch or 1)
        ours = runner.run_token == token
        if ours or (start_from == "resume" and not takeover):
            baseline = record.baseline_seq if ours and record and record.token == token else head
            return StartPlan(
                "attach",
                f"{'our' if ours else 'a'} runner is live (epoch {epoch}, pid {runner.pid} on "
                f"{runner.host}, {runner.state})",
                token=runner.run_token,
                after_epoch=epoch - 1,
                baseline_seq=baseline,
            )
        if not takeover:
            return StartPlan(
                "refuse",
                f"job {report.job!r} is running (epoch {epoch}, pid {runner.pid} on "
                f"{runner.host}, run token {runner.run_token}); a start from {start_from} "
                "would restore beside it: stop it first, or pass takeover to fence it",
            )
    elif record is not None and launch_pending(record, report, beat, now, grace):
        ours = record.token == token
        if ours or (start_from == "resume" and not takeover):
            return StartPlan(
                "attach",
                f"{'our' if ours else 'a'} launch is pending (pid {record.pid} on "
                f"{record.host}, token {record.token})",
                token=record.token,
                after_epoch=record.after_epoch,
                baseline_seq=record.baseline_seq,
                launch=record,
            )
        if not takeover:
            return StartPlan(
                "refuse",
                f"a start of job {record.job!r} is pending (token {record.token}, pid "
                f"{record.pid} on {record.host}); wait for it, or pass takeover to fence it",
            )
    epoch = 0 if report is None or report.runner is None else int(report.runner.epoch or 0)
    return StartPlan("launch", "no live runner", token=token, after_epoch=epoch, baseline_seq=head)


@dataclass(frozen=True)
class StartOutcome:
    """What a start did, and what the trigger that waits for the driver must follow."""

    action: Literal["launched", "attached"]
    reason: str
    token: str | None
    after_epoch: int
    baseline_seq: int
    driver: dict[str, Any] | None  # pid, host, process_started_at, log (launched or pending)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def start_job(
    *,
    store: ObjectStore,
    status: Any,
    request: LaunchRequest,
    launcher: Launcher,
    start_from: str,
    origin: dict[str, Any] | None = None,
    attempts: int = 8,
) -> StartOutcome:
    """Attach to the job's live or pending driver, or claim the launch record and launch.

    Args:
        store: the root's object store (the launch record lives there).
        status: `job -> StatusReport | None` (None: never ran).
        request: the launch, with `run_token` as this start's token.

    Raises:
        StartRefusedError: the plan refused (the message says why and what to do).
        LaunchError: the launcher failed (the record says so: a retry launches again).
    """
    key = launch_key(request.job)
    for _ in range(attempts):
        current, version = store.read_versioned(key)
        record = None if current is None else LaunchRecord.from_json(current)
        now = time.time()
        beat = (
            NO_BEAT if record is None else read_beat(store.read_json(beat_key(record.token)), now)
        )
        plan = plan_start(
            token=request.run_token,
            start_from=start_from,
            takeover=request.takeover,
            report=status(request.job),
            record=record,
            now=now,
            beat=beat,
        )
        if plan.action == "refuse":
            raise StartRefusedError(plan.reason)
        if plan.action == "attach":
            driver = _driver(plan.launch) if plan.launch else None
            if driver is None and record is not None and record.token == plan.token:
                driver = _driver(record)
            return StartOutcome(
                "attached", plan.reason, plan.token, plan.after_epoch, plan.baseline_seq, driver
            )
        claim = LaunchRecord(
            token=request.run_token,
            job=request.job,
            state="launching",
            requested_at=time.time(),
            host=socket.gethostname(),
            after_epoch=plan.after_epoch,
            baseline_seq=plan.baseline_seq,
            start_from=start_from,
            launcher=launcher.name,
            request=_describe(request),
            origin=dict(origin or {}),
        )
        claimed = store.write_if(key, claim.to_json(), version)
        if claimed is None:
            continue  # another starter wrote first: look again
        return _launch(store, key, claim, claimed, request, launcher, plan)
    raise StartRefusedError(
        f"could not claim {key} after {attempts} tries: starters keep racing for job "
        f"{request.job!r}; run one start at a time"
    )


def _launch(
    store: ObjectStore,
    key: str,
    claim: LaunchRecord,
    version: str,
    request: LaunchRequest,
    launcher: Launcher,
    plan: StartPlan,
) -> StartOutcome:
    try:
        driver: LaunchedDriver = launcher.launch(request)
    except Exception as error:
        failed = replace(claim, state="failed", error=f"{type(error).__name__}: {error}")
        store.write_if(key, failed.to_json(), version)  # a retry launches again at once
        raise
    launched = replace(
        claim,
        state="launched",
        pid=driver.pid,
        host=driver.host,
        process_started_at=driver.process_started_at,
        launched_at=time.time(),
        log=driver.log,
    )
    # A lost race here only loses the pid: the heartbeat's token still identifies it.
    store.write_if(key, launched.to_json(), version)
    return StartOutcome(
        "launched", plan.reason, plan.token, plan.after_epoch, plan.baseline_seq, _driver(launched)
    )


def _driver(record: LaunchRecord) -> dict[str, Any] | None:
    if record.state != "launched":
        return None
    return {
        "pid": record.pid,
        "host": record.host,
        "process_started_at": record.process_started_at,
        "log": record.log,
        "launched_at": record.launched_at or record.requested_at,
        "launcher": record.launcher,
    }


def _describe(request: LaunchRequest) -> dict[str, Any]:
    """How the job was launched, for a restart to launch it the same way (no credentials)."""
    return {
        "spec_path": request.spec_path,
        "spec_in_jobs_folder": request.spec_in_jobs_folder,
        "workdir": request.workdir,
        "overrides": dict(request.overrides),
        "checkpoint_dir": request.checkpoint_dir,
        "master": request.master,
        "spark_conf": dict(request.spark_conf),  # not reused: a restart names its own parent
    }


def latest_launch(store: ObjectStore, job: str) -> LaunchRecord | None:
    data = store.read_json(launch_key(job))
    return None if data is None else LaunchRecord.from_json(data)


def adopt_launch(store: ObjectStore, from_job: str, to_job: str) -> LaunchRecord | None:
    """Make `from_job`'s launch `to_job`'s (an upgrade's green driver becomes the job's).

    A restart (monitor DAG) then launches the job as green was launched: its spec, its
    overrides. Compare-and-swap, so a start racing it keeps its own record.
    """
    source = latest_launch(store, from_job)
    if source is None:
        return None
    adopted = replace(source, job=to_job, start_from="upgrade")
    key = launch_key(to_job)
    for _ in range(8):
        current, version = store.read_versioned(key)
        if current is not None and current.get("token") == adopted.token:
            return adopted
        if store.write_if(key, adopted.to_json(), version) is not None:
            return adopted
    return None
