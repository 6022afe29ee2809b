"""DAGs generated per job from the job specs (`{jobs_folder}/*/job.yaml`).

For each job (dag id `{job}.{action}`, tags `streamkeeper` and the job):

    {job}.start      manual; Params: start_from, checkpoint_id, savepoint_id,
                     new_checkpoints, takeover, launcher, spark_master, overrides,
                     start_timeout. Succeeds once the job is RUNNING with new checkpoints.
    {job}.monitor    on each health change of the job (asset `{job}.health`, watched in
                     the triggerer: no task runs while it stays healthy) and once a day
                     as a safety net (`airflow.monitor_safety_net`); with `airflow.monitor:
                     schedule`, on the `airflow.monitor_schedule` cron instead. Fails with
                     the reason and an alert if the job is DEGRADED, FAILING or FAILED;
                     restarts a FAILED job from its latest checkpoint with back-off if
                     `restart` (spec: airflow.restart).
    {job}.savepoint  on `airflow.savepoint_schedule` (or manual); Params: format,
                     self_contained.
    {job}.stop       manual; Params: mode (stop | cancel), savepoint, format.
    {job}.upgrade    manual; blue-green upgrade to `green_spec_path` (operators/upgrade.py):
                     savepoint, shadow run, quality gate, handover, probation, rollback.
    {job}.rollback   manual; Params: savepoint_id, spec_path. Restores the tables to the
                     savepoint's versions and restarts the job from it.

What a trigger's Params may change is bounded (launch_policy.py): override keys from an
allow-list (the spec's `airflow.trigger_overrides` extends it), spec and suite paths under
the jobs folder the spec was found in, masters the spec or the operator allows.

Parsing stays light: this module imports Airflow's SDK, the operators (whose hooks,
clients and launchers load only when a task runs) and the spec model (pydantic, yaml
with libyaml); never pyspark, boto3 or great_expectations. A worker's parse for a task
builds only that task's DAG (Airflow's parsing context). A spec that does not validate is skipped
(one bad spec never hides the others) and named, with its field, in the import error of
`dags/job_specs.py` (`check_specs`), which Airflow shows on its DAG list.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from airflow.sdk import (
    DAG,
    AssetOrTimeSchedule,
    CronTriggerTimetable,
    Param,
    get_parsing_context,
)

from streamkeeper_airflow import settings
from streamkeeper_airflow.assets import job_health_asset
from streamkeeper_airflow.launchers import LAUNCHERS
from streamkeeper_airflow.notifications.alerts import StreamkeeperAlertNotifier
from streamkeeper_airflow.operators.commands import FORMATS, SavepointOperator, StopJobOperator
from streamkeeper_airflow.operators.health import JobHealthOperator
from streamkeeper_airflow.operators.restart import RestartJobOperator
from streamkeeper_airflow.operators.start import StartJobOperator
from streamkeeper_airflow.operators.upgrade import (
    BeginUpgradeOperator,
    HandoverOperator,
    ProbationOperator,
    RollbackOperator,
    StartGreenOperator,
    UpgradeOutcomeOperator,
    ValidateUpgradeOperator,
)
from streamkeeper_airflow.starts import START_FROM

if TYPE_CHECKING:
    from streamkeeper.spec import JobSpec

Action = Literal["start", "monitor", "savepoint", "stop", "upgrade", "rollback"]
ACTIONS: tuple[str, ...] = ("start", "monitor", "savepoint", "stop", "upgrade", "rollback")
SPEC_GLOB = "*/job.yaml"
START_DATE = datetime(2024, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class JobEntry:
    """One job spec the DAGs are generated from."""

    spec_path: Path
    spec: JobSpec

    @property
    def name(self) -> str:
        return self.spec.name

    def dag_id(self, action: str) -> str:
        return f"{self.name}.{action}"

    @property
    def jobs_folder(self) -> str:
        """The folder the spec was found in (`{jobs_folder}/{job}/job.yaml`): a trigger's
        spec and suite paths must lie under it (streamkeeper_airflow/launch_policy.py)."""
        return str(self.spec_path.parent.parent)


def find_jobs(folder: Path) -> list[JobEntry]:
    """Every valid spec in `folder/*/job.yaml`, by job name; invalid ones are warned about
    (and are `dags/job_specs.py`'s import error: `check_specs`)."""
    entries, problems = _read_specs(folder)
    for problem in problems:
        warnings.warn(f"streamkeeper: {problem}", stacklevel=2)
    return entries


def check_specs(default_jobs_folder: Path) -> int:
    """Raise naming every spec no DAG is generated from (the spec, the field, the fix);
    else the number of jobs. A DAG file calls it, so Airflow shows the problem as that
    file's import error, while the other DAG files keep every valid job's DAGs."""
    from streamkeeper_airflow.errors import InvalidJobSpecsError

    folder = settings.jobs_folder(default_jobs_folder)
    entries, problems = _read_specs(folder)
    if problems:
        listed = "\n".join(f"- {problem}" for problem in problems)
        raise InvalidJobSpecsError(
            f"{len(problems)} job spec(s) in {folder} have no DAGs (their monitor and alerts "
            f"do not run until fixed):\n{listed}"
        )
    return len(entries)


def _read_specs(folder: Path) -> tuple[list[JobEntry], list[str]]:
    from streamkeeper.errors import SpecError
    from streamkeeper.spec import load_spec

    entries: dict[str, JobEntry] = {}
    problems: list[str] = []
    for path in sorted(folder.glob(SPEC_GLOB)):
        try:
            spec = load_spec(path)
        except SpecError as error:
            problems.append(f"job spec {path} skipped: {error}")
            continue
        if spec.name in entries:
            problems.append(
                f"job spec {path} skipped: job {spec.name!r} is already defined by "
                f"{entries[spec.name].spec_path}; job names must be unique"
            )
            continue
        entries[spec.name] = JobEntry(path.resolve(), spec)
    return list(entries.values()), problems


def generate(action: str, default_jobs_folder: Path) -> dict[str, DAG]:
    """The `action` DAG of every job, by dag id (what a thin DAG file puts in globals())."""
    builders = {"start": start_dag, "monitor": monitor_dag, "savepoint": savepoint_dag}
    builders.update(stop=stop_dag, upgrade=upgrade_dag, rollback=rollback_dag)
    if action not in builders:
        raise ValueError(f"unknown action {action!r}; expected one of {', '.join(ACTIONS)}")
    folder = settings.jobs_folder(default_jobs_folder)
    entries = find_jobs(folder)
    # A worker parses the DAG file again for each task, with the task's DAG as the parsing
    # context: building that one DAG, not one per job, keeps a task's start flat at 100
    # jobs (benchmarks/dag_parse.py).
    wanted = get_parsing_context().dag_id
    if wanted is not None:
        entries = [entry for entry in entries if entry.dag_id(action) == wanted]
    return {entry.dag_id(action): builders[action](entry) for entry in entries}


def _dag(entry: JobEntry, action: str, *, schedule: Any, **kwargs: Any) -> DAG:
    return DAG(
        dag_id=entry.dag_id(action),
        schedule=schedule,
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        tags=["streamkeeper", entry.name],
        render_template_as_native_obj=True,  # Params keep their types (ints, dicts)
        default_args={"owner": "streamkeeper", "retries": 0},
        **kwargs,
    )


def _launching(entry: JobEntry) -> dict[str, Any]:
    """Arguments of a task that launches a driver: the spec's launcher options, and its
    launch queue (a worker on the gateway host serves it), if it names one."""
    airflow = entry.spec.airflow
    options: dict[str, Any] = {"launcher_options": dict(airflow.launcher_options)}
    return options if airflow.launch_queue is None else {**options, "queue": airflow.launch_queue}


def _alert(entry: JobEntry) -> StreamkeeperAlertNotifier:
    return StreamkeeperAlertNotifier(job=entry.name, conn_id=entry.spec.airflow.conn_id)


def _command_task(entry: JobEntry) -> dict[str, Any]:
    """What every command task (savepoint, stop) shares. A retry sends the same command
    id, so it reads the result the job gave the first try (a scheduler race can fail a
    resumed deferral: triggers/base.py)."""
    return {
        "job": entry.name,
        "conn_id": entry.spec.airflow.conn_id,
        "retries": 1,
        "retry_delay": timedelta(seconds=5),
        "on_failure_callback": _alert(entry),
    }


def start_dag(entry: JobEntry) -> DAG:
    spec = entry.spec
    params = {
        "start_from": Param(
            "resume",
            enum=list(START_FROM),
            description="resume: as the spec says (resumes a local checkpoint); "
            "latest_checkpoint: the newest, local or externalized; checkpoint: by id; "
            "savepoint: by id",
        ),
        "checkpoint_id": Param(None, type=["null", "integer"], minimum=0),
        "savepoint_id": Param(None, type=["null", "string"]),
        "new_checkpoints": Param(
            1, type="integer", minimum=0, description="checkpoints to wait for (0: RUNNING)"
        ),
        "takeover": Param(False, type="boolean", description="fence a live runner"),
        "launcher": Param(spec.airflow.launcher, enum=list(LAUNCHERS)),
        "spark_master": Param(None, type=["null", "string"], description="default: the spec's"),
        "overrides": Param({}, type="object", description="spec overrides: dotted.key: value"),
        "start_timeout": Param(900, type="integer", minimum=10, description="seconds"),
    }
    with _dag(
        entry,
        "start",
        schedule=None,
        params=params,
        description=f"Start {entry.name}: RUNNING with a completed checkpoint",
        doc_md=__doc__,
    ) as dag:
        StartJobOperator(
            task_id="start",
            **_launching(entry),
            job=entry.name,
            spec_path=str(entry.spec_path),
            conn_id=spec.airflow.conn_id,
            start_from="{{ params.start_from }}",
            checkpoint_id="{{ params.checkpoint_id }}",
            savepoint_id="{{ params.savepoint_id }}",
            new_checkpoints="{{ params.new_checkpoints }}",
            takeover="{{ params.takeover }}",
            launcher="{{ params.launcher }}",
            spark_master="{{ params.spark_master }}",
            overrides="{{ params.overrides }}",
            start_timeout="{{ params.start_timeout }}",
            jobs_folder=entry.jobs_folder,
            retries=1,
            retry_delay=timedelta(seconds=10),
            on_failure_callback=_alert(entry),
        )
    return dag


def monitor_dag(entry: JobEntry) -> DAG:
    spec = entry.spec
    restart = spec.airflow.restart
    params = {
        "restart": Param(restart.enabled, type="boolean", description="restart a FAILED job"),
        "max_attempts": Param(restart.max_attempts, type="integer", minimum=1),
        "backoff_seconds": Param(restart.backoff, type="number", minimum=0),
        "max_backoff_seconds": Param(restart.max_backoff, type="number", minimum=0),
    }
    with _dag(
        entry,
        "monitor",
        schedule=monitor_schedule(entry),
        params=params,
        description=f"Watch {entry.name}'s checkpoints; alert and restart when it fails",
        doc_md=__doc__,
    ) as dag:
        check = JobHealthOperator(
            task_id="check",
            job=entry.name,
            conn_id=spec.airflow.conn_id,
            on_failure_callback=_alert(entry),
        )
        restart_task = RestartJobOperator(
            task_id="restart",
            **_launching(entry),
            job=entry.name,
            spec_path=str(entry.spec_path),
            conn_id=spec.airflow.conn_id,
            launcher=spec.airflow.launcher,
            jobs_folder=entry.jobs_folder,
            enabled="{{ params.restart }}",
            max_attempts="{{ params.max_attempts }}",
            backoff="{{ params.backoff_seconds }}",
            max_backoff="{{ params.max_backoff_seconds }}",
            on_failure_callback=_alert(entry),
        )
        # A teardown runs whatever the check did, and leaves the check the run's leaf: the
        # run fails when the job was unhealthy, even if the restart then succeeded. (With
        # on_failure_fail_dagrun the teardown would be the leaf, and a skipped restart
        # would let a failed check pass. A restart only fails after a failed check.)
        check >> restart_task.as_teardown()
    return dag


def monitor_schedule(entry: JobEntry) -> Any:
    """The monitor's schedule: the job's health asset, or with it a safety-net cron (a
    change the watcher missed, e.g. while no triggerer ran, is seen at the next tick);
    `airflow.monitor: schedule` keeps the polling cron."""
    spec = entry.spec.airflow
    if spec.monitor == "schedule":
        return spec.monitor_schedule
    health = job_health_asset(
        entry.name, conn_id=spec.conn_id, poll_interval=spec.monitor_poll_interval
    )
    if spec.monitor_safety_net is None:
        return [health]
    cron = CronTriggerTimetable(spec.monitor_safety_net, timezone="UTC")
    return AssetOrTimeSchedule(timetable=cron, assets=[health])


def savepoint_dag(entry: JobEntry) -> DAG:
    spec = entry.spec
    params = {
        "format": Param(spec.airflow.savepoint_format, enum=list(FORMATS)),
        "self_contained": Param(False, type="boolean", description="copy files in (portable)"),
    }
    with _dag(
        entry,
        "savepoint",
        schedule=spec.airflow.savepoint_schedule,
        params=params,
        description=f"Take a savepoint of {entry.name}",
        doc_md=__doc__,
    ) as dag:
        SavepointOperator(
            task_id="savepoint",
            format="{{ params.format }}",
            self_contained="{{ params.self_contained }}",
            **_command_task(entry),
        )
    return dag


def stop_dag(entry: JobEntry) -> DAG:
    spec = entry.spec
    params = {
        "mode": Param("stop", enum=["stop", "cancel"], description="cancel: now, no savepoint"),
        "savepoint": Param(True, type="boolean", description="stop: take a savepoint first"),
        "format": Param(spec.airflow.savepoint_format, enum=list(FORMATS)),
    }
    with _dag(
        entry,
        "stop",
        schedule=None,
        params=params,
        description=f"Stop {entry.name} (with a savepoint by default)",
        doc_md=__doc__,
    ) as dag:
        StopJobOperator(
            task_id="stop",
            mode="{{ params.mode }}",
            savepoint="{{ params.savepoint }}",
            format="{{ params.format }}",
            **_command_task(entry),
        )
    return dag


UPGRADE_ID = "{{ ti.xcom_pull(task_ids='begin', key='upgrade_id') }}"
# Every upgrade task is retried when its process dies (a lost worker, a scheduler restart,
# an OOM kill): each step reads the upgrade record and resumes from the phase it finds, so a
# retry never repeats or reverses a step (operators/upgrade.py). A verdict (rejected, failed
# probation, green dead) raises AirflowFailException, which is never retried.
UPGRADE_RETRIES = {"retries": 2, "retry_delay": timedelta(seconds=5)}


def upgrade_dag(entry: JobEntry) -> DAG:
    spec = entry.spec
    versions = entry.spec_path.parent / "versions"
    example = next(iter(sorted(versions.glob("*.yaml"))), None) if versions.is_dir() else None
    params = {
        "green_spec_path": Param(
            str(example) if example else "",
            type="string",
            minLength=1,
            description="the new version's spec (same job name)",
        ),
        "format": Param(
            "canonical",
            enum=list(FORMATS),
            description="savepoints of blue: canonical (code changed) or native (same state)",
        ),
        "overrides": Param({}, type="object", description="green's spec overrides"),
        "shadow_checkpoints": Param(2, type="integer", minimum=1),
        "validation_timeout": Param(600, type="integer", minimum=10, description="seconds"),
        "probation_seconds": Param(300, type="integer", minimum=0, description="seconds"),
        "probation_checkpoints": Param(3, type="integer", minimum=0),
        "expectations_path": Param(
            None, type=["null", "string"], description="default: expectations.yaml by the spec"
        ),
        "handover_timeout": Param(
            600, type="integer", minimum=10, description="seconds for green's first live batch"
        ),
    }
    common = {
        "job": entry.name,
        "conn_id": spec.airflow.conn_id,
        "upgrade_id": UPGRADE_ID,
        "jobs_folder": entry.jobs_folder,
        **UPGRADE_RETRIES,
    }
    with _dag(
        entry,
        "upgrade",
        schedule=None,
        params=params,
        description=f"Upgrade {entry.name} blue-green, with a quality gate and rollback",
        doc_md=__doc__,
    ) as dag:
        begin = BeginUpgradeOperator(
            task_id="begin",
            job=entry.name,
            conn_id=spec.airflow.conn_id,
            green_spec_path="{{ params.green_spec_path }}",
            blue_spec_path=str(entry.spec_path),
            format="{{ params.format }}",
            jobs_folder=entry.jobs_folder,
            on_failure_callback=_alert(entry),
            **UPGRADE_RETRIES,
        )
        start_green = StartGreenOperator(
            task_id="start_green",
            **_launching(entry),
            **common,
            launcher=spec.airflow.launcher,
            overrides="{{ params.overrides }}",
            new_checkpoints="{{ params.shadow_checkpoints }}",
        )
        validate = ValidateUpgradeOperator(
            task_id="validate",
            **common,
            expectations_path="{{ params.expectations_path }}",
            validation_timeout="{{ params.validation_timeout }}",
        )
        handover = HandoverOperator(
            task_id="handover",
            **common,
            handover_timeout="{{ params.handover_timeout }}",
            on_failure_callback=_alert(entry),
        )
        probation = ProbationOperator(
            task_id="probation",
            **common,
            probation="{{ params.probation_seconds }}",
            min_checkpoints="{{ params.probation_checkpoints }}",
            expectations_path="{{ params.expectations_path }}",
        )
        rollback = RollbackOperator(
            task_id="rollback",
            **_launching(entry),
            **common,
            of_upgrade=True,
            launcher=spec.airflow.launcher,
            trigger_rule="all_done",
            on_failure_callback=_alert(entry),
        )
        outcome = UpgradeOutcomeOperator(task_id="outcome", **common, trigger_rule="all_done")
        begin >> start_green >> validate >> handover >> probation >> rollback >> outcome
    return dag


def rollback_dag(entry: JobEntry) -> DAG:
    spec = entry.spec
    params = {
        "savepoint_id": Param(
            "", type="string", minLength=1, description="a savepoint that recorded table versions"
        ),
        "spec_path": Param(
            str(entry.spec_path), type="string", description="the version to run from it"
        ),
        "overrides": Param({}, type="object", description="spec overrides"),
    }
    with _dag(
        entry,
        "rollback",
        schedule=None,
        params=params,
        description=f"Roll {entry.name} back to a savepoint: tables restored, job restarted",
        doc_md=__doc__,
    ) as dag:
        RollbackOperator(
            task_id="rollback",
            **_launching(entry),
            job=entry.name,
            conn_id=spec.airflow.conn_id,
            savepoint_id="{{ params.savepoint_id }}",
            spec_path="{{ params.spec_path }}",
            overrides="{{ params.overrides }}",
            launcher=spec.airflow.launcher,
            jobs_folder=entry.jobs_folder,
            on_failure_callback=_alert(entry),
        )
    return dag
