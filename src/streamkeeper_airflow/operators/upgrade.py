"""Blue-green upgrade tasks: begin, start green, validate, hand over, probation, roll back.

The `{job}.upgrade` DAG chains them; the protocol (phases, what each step writes, why the
live output stays exactly once) is `streamkeeper/upgrade/UPGRADE.md`. Each task reads
the upgrade record and acts only in the phase it expects, so a retried task, or a task
that runs after another failed, never repeats or reverses a step:

    begin >> start_green >> validate >> handover >> probation >> rollback >> outcome

`rollback` and `outcome` run whatever happened before (trigger rule all_done):
`rollback` acts only when green went live and failed its probation (or died during the
handover, before its first live batch: the handover task records that as a failed
probation); `outcome` fails
the run unless the upgrade was promoted, with the reason (rejected, rolled back).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from streamkeeper_airflow import settings
from streamkeeper_airflow.hooks.streamkeeper import DEFAULT_CONN_ID, StreamkeeperHook
from streamkeeper_airflow.operators.start import StartJobOperator

if TYPE_CHECKING:
    from airflow.sdk import Context

    from streamkeeper.upgrade.record import UpgradeRecord
    from streamkeeper_airflow.launchers.base import LaunchRequest

EXPECTATIONS_FILE = "expectations.yaml"
DEATH_CHECK_SECONDS = 2.0  # how often the handover looks whether green's driver still lives


def _token(context: Context) -> str:
    from streamkeeper_airflow.starts import run_token_for

    ti = context["ti"]
    return run_token_for(ti.dag_id, ti.run_id, ti.task_id, ti.map_index)


def _run_token(context: Context, task_id: str) -> str:
    """The run token of another task of this DAG run (e.g. the one that launched green)."""
    from streamkeeper_airflow.starts import run_token_for

    ti = context["ti"]
    return run_token_for(ti.dag_id, ti.run_id, task_id, -1)


def upgrade_id_for(token: str, context: Context) -> str:
    """The id of the upgrade the begin task with run token `token` makes: the same for
    each of its tries. A try killed while blue takes savepoint S0 has no record yet; its
    retry then sends the same savepoint command (`savepoint-{id}`) and reads the answer
    the first try's command got, instead of taking a second savepoint."""
    from datetime import UTC, datetime

    dag_run = context["dag_run"]
    when = getattr(dag_run, "run_after", None) or dag_run.start_date or datetime.now(UTC)
    return f"up-{when.strftime('%Y%m%dt%H%M%S')}-{token[-8:]}"


def _spec_file(path: str, workdir: str | None = None) -> Path:
    spec = Path(path)
    return spec if spec.is_absolute() else Path(workdir or settings.workdir()) / spec


def spec_folders(jobs_folder: str | None = None) -> list[str]:
    """Where a trigger's spec and suite paths may point: the jobs folder (the DAG
    factory's, else `[streamkeeper] jobs_folder`), then `[streamkeeper] spec_folders`."""
    folder = jobs_folder or settings.option("jobs_folder")
    return [*([folder] if folder else []), *settings.spec_folders()]


def _confined(path: str | Path, what: str, jobs_folder: str | None = None) -> Path:
    """`path` (relative: to the working directory) if it lies under spec_folders().

    Raises:
        AirflowFailException: naming the path, the folders and the fix.
    """
    from streamkeeper_airflow.errors import LaunchPolicyError
    from streamkeeper_airflow.launch_policy import confine_path

    try:
        return confine_path(_spec_file(str(path)), spec_folders(jobs_folder), what=what)
    except LaunchPolicyError as error:
        raise AirflowFailException(str(error)) from None


class _UpgradeTask(BaseOperator):
    """What every upgrade task has: the job, its connection, the upgrade's id."""

    template_fields: Sequence[str] = ("job", "conn_id", "root", "upgrade_id")
    ui_color = "#e8e0f5"

    def __init__(
        self,
        *,
        job: str,
        upgrade_id: str | None = None,
        conn_id: str = DEFAULT_CONN_ID,
        root: str | None = None,
        jobs_folder: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.job = job
        self.upgrade_id = upgrade_id
        self.conn_id = conn_id
        self.root = root
        self.jobs_folder = jobs_folder  # where spec and suite paths may point (spec_folders)

    @cached_property
    def hook(self) -> StreamkeeperHook:
        return StreamkeeperHook(self.conn_id, root=self.root)

    def record(self) -> UpgradeRecord | None:
        from streamkeeper.upgrade.record import UpgradeRecords

        if not self.upgrade_id:
            return None
        with self.hook._hidden():
            return UpgradeRecords(self.hook.store, self.job).read(str(self.upgrade_id))

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """The upgrade as its record stands, as a run facet (lineage.py; None without the
        openlineage provider). Also used on failure: a rejected or rolled back upgrade."""
        from streamkeeper_airflow import lineage

        if not lineage.available():
            return None
        return lineage.job_lineage(None, run_facets=lineage.upgrade_facet(self.record()))

    def fail_probation(
        self,
        record: UpgradeRecord,
        reason: str,
        started: float,
        quality: dict[str, Any] | None = None,
    ) -> None:
        """Record a failed probation verdict: what the rollback task acts on."""
        from streamkeeper.upgrade.record import UpgradeRecords

        verdict = _verdict(False, reason, started, quality)
        with self.hook._hidden():
            UpgradeRecords(self.hook.store, self.job).update(
                record.id, lambda r: setattr(r, "probation", verdict)
            )


class BeginUpgradeOperator(_UpgradeTask):
    """Savepoint blue (self-contained, blue keeps running) and record the upgrade.

    Returns (XCom) the upgrade's id, blue's savepoint and green's shadow job. A retry
    finds the record its first try made (by run token) and takes no second savepoint.

    Args:
        green_spec_path: the new version's spec (same job name).
        blue_spec_path: the running version's spec (default: as it was last launched).
        format: of the savepoints S0 and S1 (canonical unless the state layout is equal).
    """

    template_fields: Sequence[str] = (
        *_UpgradeTask.template_fields,
        "green_spec_path",
        "blue_spec_path",
        "format",
        "savepoint_timeout",
    )

    def __init__(
        self,
        *,
        green_spec_path: str,
        blue_spec_path: str | None = None,
        format: str = "canonical",
        savepoint_timeout: float | str = 600.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.green_spec_path = green_spec_path
        self.blue_spec_path = blue_spec_path
        self.format = format
        self.savepoint_timeout = savepoint_timeout

    def execute(self, context: Context) -> dict[str, Any]:
        from streamkeeper.errors import SpecError, StreamkeeperError
        from streamkeeper.spec import load_spec
        from streamkeeper.upgrade.record import UpgradeRecords
        from streamkeeper.upgrade.steps import begin_upgrade
        from streamkeeper_airflow.starts import latest_launch

        if self.format not in ("native", "canonical"):
            raise AirflowFailException(f"format {self.format!r} is not one of native, canonical")
        green = _confined(self.green_spec_path, "green_spec_path", self.jobs_folder)
        try:
            spec = load_spec(green)
        except SpecError as error:
            raise AirflowFailException(str(error)) from None
        if spec.name != self.job:
            raise AirflowFailException(
                f"green spec {str(green)!r} is job {spec.name!r}, not {self.job!r}: an upgrade "
                "keeps the job's name (and lineage)"
            )
        token = _token(context)
        launch = latest_launch(self.hook.store, self.job)
        blue_spec = self.blue_spec_path or (launch.request.get("spec_path") if launch else None)
        if blue_spec:  # read back from storage: the rollback would launch it
            blue_spec = str(_confined(blue_spec, "blue_spec_path", self.jobs_folder))
        with self.hook._hidden():
            records = UpgradeRecords(self.hook.store, self.job)
            mine = [r for r in records.list() if r.green.get("begin_token") == token]
            upgrade_id = mine[-1].id if mine else upgrade_id_for(token, context)
            try:
                record = begin_upgrade(
                    self.hook.client,
                    self.job,
                    upgrade_id,
                    green_spec_path=str(green),
                    blue_spec_path=blue_spec,
                    fmt=self.format,
                    run_token=token,
                    timeout=float(self.savepoint_timeout),
                    blue_launch=None if launch is None else launch.request,
                )
            except StreamkeeperError as error:
                raise AirflowFailException(f"upgrade of {self.job!r} not begun: {error}") from None
        self.log.info(
            "upgrade %s: blue's savepoint %s; green's shadow job %s",
            record.id,
            record.blue["savepoint"],
            record.green["shadow_job"],
        )
        context["ti"].xcom_push(key="upgrade_id", value=record.id)
        return {
            "upgrade_id": record.id,
            "savepoint": record.blue["savepoint"],
            "shadow_job": record.green["shadow_job"],
        }


class StartGreenOperator(StartJobOperator):
    """Launch green's driver (`streamkeeper upgrade-green`) and wait for its shadow run to
    be RUNNING with `new_checkpoints` checkpoints. Green runs with blue's launch settings
    (overrides, checkpoint directory) unless told otherwise."""

    template_fields: Sequence[str] = (*StartJobOperator.template_fields, "upgrade_id")

    def __init__(self, *, upgrade_id: str | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("spec_path", "")
        super().__init__(**kwargs)
        self.upgrade_id = upgrade_id

    def launch_request(self, context: Context) -> LaunchRequest:
        from streamkeeper.upgrade.record import UpgradeRecords

        if not self.upgrade_id:
            raise AirflowFailException("no upgrade to start green for (the begin task failed)")
        with self.hook._hidden():
            record = UpgradeRecords(self.hook.store, self.job).read(str(self.upgrade_id))
        if record.phase != "shadow":
            raise AirflowFailException(
                f"upgrade {record.id!r} is {record.phase} ({record.reason}); green starts in "
                "the shadow phase only"
            )
        # Read back from storage: launch_request holds them to the rules a trigger's Params
        # meet (launch_policy.py). The working directory is the DAG's, never the record's.
        blue_launch = record.blue.get("launch") or {}
        self.spec_path = record.green["spec_path"]
        self.overrides = {**(blue_launch.get("overrides") or {}), **(self.overrides or {})}
        self.spark_master = self.spark_master or blue_launch.get("master")
        self.start_from = "resume"
        request = super().launch_request(context)
        with self.hook._hidden():  # probation and rollback recognise green's driver by it
            UpgradeRecords(self.hook.store, self.job).update(
                record.id, lambda r: r.green.update(run_token=request.run_token)
            )
        self.job = record.green["shadow_job"]  # from here on: the shadow run's control plane
        return replace(
            request,
            job=self.job,
            command="upgrade-green",
            extra_args=("--upgrade-id", record.id),
            checkpoint_dir=request.checkpoint_dir or self._blues_checkpoint_dir(record, request),
        )

    def _blues_checkpoint_dir(self, record: UpgradeRecord, request: LaunchRequest) -> str | None:
        """Blue's live folder, which green takes over: read from the record, so held to
        the folders green's spec or blue's resolve to in the DAG's working directory."""
        from streamkeeper.errors import StreamkeeperError
        from streamkeeper.spec import load_spec
        from streamkeeper_airflow.launch_policy import (
            check_recorded_checkpoint_dir,
            confine_path,
            spec_checkpoint_dir,
        )

        workdir = request.workdir
        allowed = [spec_checkpoint_dir(load_spec(request.spec_path, request.overrides), workdir)]
        try:
            if record.blue.get("spec_path"):
                blue_spec = confine_path(
                    record.blue["spec_path"], self.spec_folders(), what="blue's spec_path"
                )
                allowed.append(
                    spec_checkpoint_dir(load_spec(blue_spec, request.overrides), workdir)
                )
            found = check_recorded_checkpoint_dir(
                record.blue.get("checkpoint_dir"), allowed, what="blue's checkpoint folder"
            )
        except StreamkeeperError as error:
            raise AirflowFailException(f"green of {record.id!r} not launched: {error}") from None
        return None if found is None else str(found)


class ValidateUpgradeOperator(_UpgradeTask):
    """The quality gate: green's shadow output against blue's over the same input, and the
    job's Great Expectations suite on green's shadow tables. Invalid: green is stopped,
    blue keeps running untouched, and the task fails with the reason.

    Args:
        expectations_path: the suite (default: `expectations.yaml` beside the job's spec).
        validation_timeout: seconds to wait for blue and green to reach a common input
            position (green catches up from the savepoint first).
    """

    template_fields: Sequence[str] = (
        *_UpgradeTask.template_fields,
        "expectations_path",
        "validation_timeout",
    )

    def __init__(
        self,
        *,
        expectations_path: str | None = None,
        validation_timeout: float | str = 600.0,
        poll_interval: float = 2.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.expectations_path = expectations_path
        self.validation_timeout = validation_timeout
        self.poll_interval = poll_interval

    def execute(self, context: Context) -> dict[str, Any]:
        from streamkeeper.upgrade.record import UpgradeRecords
        from streamkeeper.upgrade.steps import reject_upgrade

        record = self.record()
        if record is None:
            raise AirflowFailException("no upgrade to validate (the begin task failed)")
        if record.phase != "shadow":
            if record.validation and record.validation.get("success"):
                return record.validation  # a retry after the gate passed
            raise AirflowFailException(f"upgrade {record.id!r} is {record.phase}: {record.reason}")
        self._check_suite(record)
        validation = self._validate(record)
        with self.hook._hidden():
            records = UpgradeRecords(self.hook.store, self.job)
            records.update(record.id, lambda r: setattr(r, "validation", validation))
            if not validation["success"]:
                reject_upgrade(self.hook.client, self.job, record.id, validation["reason"])
        if not validation["success"]:
            raise AirflowFailException(
                f"upgrade {record.id!r} rejected: {validation['reason']}; green was stopped, "
                f"blue keeps running untouched"
            )
        self.log.info("upgrade %s validated: %s", record.id, validation["reason"])
        return validation

    def _check_suite(self, record: UpgradeRecord) -> None:
        """The suite lies under the jobs folder: checked before green is compared."""
        from streamkeeper_airflow.errors import LaunchPolicyError

        try:
            expectations_file(self.expectations_path, record, self.jobs_folder)
        except LaunchPolicyError as error:
            raise AirflowFailException(f"upgrade {record.id!r} not validated: {error}") from None

    def _validate(self, record: UpgradeRecord) -> dict[str, Any]:
        from streamkeeper.spec import load_spec
        from streamkeeper.upgrade.steps import compare_with_blue, shadow_tables

        spec = load_spec(record.green["spec_path"])
        keys = {s.name: (list(s.key) if s.output == "merge" else None) for s in spec.sinks}
        changelogs = {s.name: list(s.key) for s in spec.sinks if s.output == "append" and s.key}
        deadline = time.monotonic() + float(self.validation_timeout)
        with self.hook._hidden():
            while True:
                comparison = compare_with_blue(self.hook.client, record, keys, changelogs)
                if comparison.position is not None or time.monotonic() > deadline:
                    break
                self.log.info("%s", comparison.reason)
                time.sleep(self.poll_interval)
            quality = self._quality(record, shadow_tables(self.hook.client, record, list(keys)))
        reasons = [] if comparison.success else [comparison.reason]
        if quality is not None and not quality["success"]:
            reasons.append(f"quality gate: {quality['summary']}")
        return {
            "success": not reasons,
            "reason": "; ".join(reasons) or f"{comparison.reason}; quality gate passed",
            "comparison": comparison.to_json(),
            "quality": quality,
        }

    def _quality(self, record: UpgradeRecord, tables: dict[str, str]) -> dict[str, Any] | None:
        return run_quality_gate(
            self.expectations_path,
            record,
            {s: (uri, None) for s, uri in tables.items()},
            self.log,
            self.hook.settings.s3_settings(),
            jobs_folder=self.jobs_folder,
        )


def expectations_file(
    path: str | None, record: UpgradeRecord, jobs_folder: str | None = None
) -> Path | None:
    """The suite: the given path, else beside green's spec, else beside blue's; each
    under spec_folders() (a Param, or spec paths read back from the upgrade record).

    Raises:
        LaunchPolicyError: the suite lies outside those folders.
    """
    from streamkeeper_airflow.launch_policy import confine_path

    folders = spec_folders(jobs_folder)
    if path:
        return confine_path(_spec_file(path), folders, what="expectations_path")
    for spec in (record.green.get("spec_path"), record.blue.get("spec_path")):
        if spec and (Path(spec).parent / EXPECTATIONS_FILE).is_file():
            suite = Path(spec).parent / EXPECTATIONS_FILE
            return confine_path(suite, folders, what="expectations_path")
    return None


def run_quality_gate(
    path: str | None,
    record: UpgradeRecord,
    tables: dict[str, tuple[str, int | None]],
    log: Any,
    s3: Any = None,
    *,
    jobs_folder: str | None = None,
) -> dict[str, Any] | None:
    """Great Expectations over `tables` (sink -> URI, version); None without a suite.

    `s3` (the connection's `S3Settings`) reaches tables on object storage: the worker's
    own environment need not hold any credential, the connection does.
    """
    suite_path = expectations_file(path, record, jobs_folder)
    if suite_path is None:
        log.warning(
            "no expectation suite (%s) for %s: quality gate skipped", EXPECTATIONS_FILE, record.job
        )
        return None
    from streamkeeper.storage import Location
    from streamkeeper.upgrade.quality import load_expectations, validate_tables

    suite = load_expectations(suite_path)
    report = validate_tables(
        tables, suite, location_options=lambda uri: Location(uri, s3).storage_options()
    )
    return {**report.to_json(), "summary": report.summary(), "suite": str(suite_path)}


class HandoverOperator(_UpgradeTask):
    """Ask green to take over and wait until it committed its first live batch.

    Green stops its shadow run, stops blue with a savepoint at a batch boundary and
    continues the lineage from it (UPGRADE.md). Returns the handover: blue's stop
    savepoint, the table versions at it, and the gap between blue's last live commit and
    green's first. The job's launch record becomes green's, so a restart (monitor DAG)
    launches the new version.

    Green known dead before its first live batch (its heartbeat ended or was lost, or its
    driver's own beat ended or went stale, wherever it runs: `starts.driver_gone`) fails
    the task at once, whatever step of the handover it died at: before blue stopped, the
    upgrade fails and blue runs on (a stop green sent and blue did not take up yet is
    withdrawn); after, the record gets a failed probation, so the rollback task starts
    blue again from its stop savepoint instead of leaving the job down until the timeout.
    """

    template_fields: Sequence[str] = (*_UpgradeTask.template_fields, "handover_timeout")

    def __init__(
        self, *, handover_timeout: float | str = 600.0, poll_interval: float = 0.2, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.handover_timeout = handover_timeout
        self.poll_interval = poll_interval

    def execute(self, context: Context) -> dict[str, Any]:
        from streamkeeper.upgrade.record import UpgradeRecords
        from streamkeeper.upgrade.steps import handover_gap, record_gap, request_handover
        from streamkeeper_airflow.starts import adopt_launch

        record = self.record()
        if record is None:
            raise AirflowFailException("no upgrade to hand over (the begin task failed)")
        deadline = time.monotonic() + float(self.handover_timeout)
        next_check = time.monotonic()
        with self.hook._hidden():
            client = self.hook.client
            request_handover(client, self.job, record.id)
            records = UpgradeRecords(client.store, self.job)
            while True:
                record = records.read(record.id)
                if record.phase == "failed":
                    raise AirflowFailException(f"handover failed: {record.reason}")
                gap = handover_gap(client, record) if record.phase in ("live", "promoted") else None
                if gap is not None:
                    break
                if time.monotonic() >= next_check:
                    next_check = time.monotonic() + DEATH_CHECK_SECONDS
                    gone = self._green_gone(record)
                    if gone is not None and record.phase == "live":
                        self._green_died(record, gone)
                    if gone is not None:
                        self._settle(client, record, gone)
                if time.monotonic() > deadline:
                    raise AirflowFailException(
                        f"upgrade {record.id!r} is {record.phase} after "
                        f"{float(self.handover_timeout):.0f}s: green did not commit a live "
                        "batch; see green's log (the launch record of its shadow job)"
                    )
                time.sleep(self.poll_interval)
            record_gap(client, self.job, record.id, gap)
            adopt_launch(client.store, record.green["shadow_job"], self.job)
        self.log.info(
            "upgrade %s live: blue stopped with savepoint %s; gap %.2fs (blue's last commit "
            "to green's first)",
            record.id,
            record.handover["blue_savepoint"],
            gap.gap_s,
        )
        return {
            **(record.handover or {}),
            "gap_s": round(gap.gap_s, 3),
            "green_first_seq": gap.green_first_seq,
            "blue_last_commit_at": gap.blue_last_commit_at,
            "green_first_commit_at": gap.green_first_commit_at,
        }

    def _green_gone(self, record: UpgradeRecord) -> str | None:
        """Why green's driver is known to have ended before its first live batch, or None."""
        from streamkeeper_airflow.starts import driver_gone, latest_launch

        token = record.green.get("run_token")
        if not token:
            return None
        report = self.hook.status(self.job, missing_ok=True)
        launch = latest_launch(self.hook.store, record.green["shadow_job"])
        now = time.time()
        return driver_gone(report, launch, token, self.hook.driver_beat(token, now), now)

    def _settle(self, client: Any, record: UpgradeRecord, why: str) -> None:
        """Green died before the upgrade went live: end the handover here, whatever step
        it died at (upgrade/handover.py). Returns while blue still answers its stop."""
        from streamkeeper.upgrade.handover import settle_dead_handover

        settled = settle_dead_handover(client, self.job, record.id, why)
        if settled is None:
            self.log.info("green is gone (%s); waiting for blue's answer to its stop", why)
            return
        if settled.phase == "failed":
            raise AirflowFailException(f"upgrade {record.id!r} failed: {settled.reason}")
        raise AirflowFailException(
            f"upgrade {record.id!r}: {settled.reason}; the rollback task starts blue again "
            f"from its stop savepoint {(settled.handover or {}).get('blue_savepoint')}"
        )

    def _green_died(self, record: UpgradeRecord, why: str) -> NoReturn:
        """Green went live (blue is stopped) and died before committing: the upgrade has
        failed its probation, so the rollback task returns the job to blue's savepoint."""
        reason = f"green died during the handover, before its first live batch: {why}"
        started = float((record.handover or {}).get("blue_stopped_at") or time.time())
        self.fail_probation(record, reason, started)
        raise AirflowFailException(
            f"upgrade {record.id!r}: {reason}; the rollback task returns the job to blue's "
            f"stop savepoint {(record.handover or {}).get('blue_savepoint')}"
        )


class ProbationOperator(_UpgradeTask):
    """Green on probation: healthy on its own runner for `probation` seconds (deferred to
    the triggerer: `JobHealthyTrigger`; DEGRADED is tolerated, FAILING, FAILED or another
    runner end it), then `min_checkpoints` new checkpoints and the quality gate on the
    live tables. Passed: the upgrade is promoted. Failed: the task fails with the reason
    (the rollback task then returns the job to blue).
    """

    template_fields: Sequence[str] = (
        *_UpgradeTask.template_fields,
        "probation",
        "min_checkpoints",
        "expectations_path",
    )

    def __init__(
        self,
        *,
        probation: float | str = 300.0,
        min_checkpoints: int | str = 3,
        expectations_path: str | None = None,
        poll_interval: float = 2.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.probation = probation
        self.min_checkpoints = min_checkpoints
        self.expectations_path = expectations_path
        self.poll_interval = poll_interval

    def execute(self, context: Context) -> None:
        from streamkeeper_airflow.triggers.checkpoints import JobHealthyTrigger

        record = self._live()
        status = self.hook.status(self.job)
        runner = status.runner
        if runner is None or runner.run_token != record.green.get("run_token"):
            who = "no runner" if runner is None else f"token {runner.run_token} ({runner.state})"
            self._fail(record, f"green is not the job's runner: {who}", time.time())
        now, probation = time.time(), float(self.probation)
        self.defer(
            trigger=JobHealthyTrigger(
                conn_id=self.conn_id,
                job=self.job,
                root=self.root,
                poll_interval=self.poll_interval,
                deadline=now + probation + 600,
                started_at=now,
                probation=probation,
                epoch=runner.epoch,
                tolerate_degraded=True,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=probation + 660),
        )

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        from streamkeeper.upgrade.steps import promote_upgrade

        record = self._live()
        started = time.time() - float(self.probation)
        if event.get("status") != "success":
            self._fail(record, str(event.get("message", "green was unhealthy")), started)
        status = self.hook.status(self.job)
        first = int(record.handover.get("green_first_seq", record.handover["seq"] + 1))
        new = (-1 if status.head is None else status.head.seq) - first + 1
        if new < int(self.min_checkpoints):
            self._fail(
                record,
                f"green completed {new} checkpoints on probation, fewer than "
                f"{self.min_checkpoints}",
                started,
            )
        tables = {name: (uri, None) for name, uri in status.tables.items()}
        with self.hook._hidden():
            quality = run_quality_gate(
                self.expectations_path,
                record,
                tables,
                self.log,
                self.hook.settings.s3_settings(),
                jobs_folder=self.jobs_folder,
            )
        if quality is not None and not quality["success"]:
            reason = f"quality gate on the live tables: {quality['summary']}"
            self._fail(record, reason, started, quality)
        verdict = _verdict(True, f"healthy, {new} checkpoints on probation", started, quality)
        with self.hook._hidden():
            promote_upgrade(self.hook.client, self.job, record.id, verdict)
        self.log.info("upgrade %s promoted: %s", record.id, verdict["reason"])
        return verdict

    def _live(self) -> UpgradeRecord:
        record = self.record()
        if record is None or record.phase != "live":
            phase = "missing" if record is None else record.phase
            raise AirflowFailException(f"no live upgrade on probation (upgrade {phase})")
        return record

    def _fail(
        self,
        record: UpgradeRecord,
        reason: str,
        started: float,
        quality: dict[str, Any] | None = None,
    ) -> NoReturn:
        self.fail_probation(record, reason, started, quality)
        raise AirflowFailException(f"upgrade {record.id!r} failed its probation: {reason}")


def _verdict(
    passed: bool, reason: str, started: float, quality: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "passed": passed,
        "reason": reason,
        "started_at": started,
        "ended_at": time.time(),
        "quality": quality,
    }


class RollbackOperator(StartJobOperator):
    """Return the job to a savepoint: stop the running driver, fence the lineage, Delta
    RESTORE every table to the savepoint's versions, set the checkpoint directory aside
    and start from the savepoint (`--takeover`; upgrade/rollback.py); succeed once it runs and
    checkpoints. Live output stays exactly once (UPGRADE.md).

    With `upgrade_id` it rolls back that upgrade, and only if green went live and failed
    its probation, or died during the handover (else it skips): to blue's stop savepoint,
    with blue's spec and launch.
    Without, to `savepoint_id` with `spec_path` (on demand, the rollback DAG).
    `of_upgrade`: the task of an upgrade DAG, which skips when its upgrade never began.
    """

    template_fields: Sequence[str] = (*StartJobOperator.template_fields, "upgrade_id")

    def __init__(
        self, *, upgrade_id: str | None = None, of_upgrade: bool = False, **kwargs: Any
    ) -> None:
        kwargs.setdefault("spec_path", "")
        kwargs.setdefault("new_checkpoints", 1)
        super().__init__(**kwargs)
        self.upgrade_id = upgrade_id
        self.of_upgrade = of_upgrade
        self._live_dir: Path | None = None  # the job's live folder, once checked
        self._spec_live_dir: Path | None = None  # the one its spec resolves to

    def execute(self, context: Context) -> Any:
        from streamkeeper.upgrade import points
        from streamkeeper.upgrade.record import UpgradeRecords
        from streamkeeper_airflow.starts import latest_launch

        if self.of_upgrade and self.upgrade_id in (None, "", "None"):
            raise AirflowSkipException("the upgrade did not begin: nothing to roll back")
        token = _token(context)
        records = UpgradeRecords(self.hook.store, self.job)
        record = self._upgrade(records)
        if record is not None:
            self.savepoint_id = record.handover["blue_savepoint"]
            launch = record.blue.get("launch") or {}
            self.spec_path = record.blue.get("spec_path") or self.spec_path
            self.overrides = {**(launch.get("overrides") or {}), **(self.overrides or {})}
            self.spark_master = self.spark_master or launch.get("master")
        if not self.savepoint_id or not self.spec_path:
            raise AirflowFailException(
                "a rollback needs savepoint_id (see `streamkeeper savepoints JOB`) and the "
                f"spec_path to restore it with; got {self.savepoint_id!r}, {self.spec_path!r}"
            )
        self._check_launch()  # before the running job is stopped or a table restored
        launched = latest_launch(self.hook.store, self.job)
        self.start_from = "savepoint"
        if launched is None or launched.token != token:
            self.check_savepoint()  # before the running job is stopped
            self._check_live_dir()
            restored = self._restore(context, record)
            if record is not None:
                records.advance(
                    record.id, ("live", "rolling_back"), "rolling_back", rollback=restored
                )
        elif not self._rewind_pending():
            # A retry after the launch, whose driver took the lineage from the savepoint
            # (the rollback is complete) and may have committed past it: resume it.
            self.start_from = "latest_checkpoint"
        points.reached("rollback_before_restart")
        self.takeover = True
        return super().execute(context)

    def _check_launch(self) -> None:
        """The launch, and the live folder the rollback will set aside (read from the job
        record, so held to the one the spec resolves to), before anything changes."""
        from streamkeeper.errors import StreamkeeperError
        from streamkeeper_airflow.launch_policy import spec_checkpoint_dir

        workdir = str(Path(self.workdir or settings.workdir()).resolve())
        try:
            _, spec, _ = self.checked_launch(workdir)
        except StreamkeeperError as error:
            raise AirflowFailException(f"rollback of {self.job!r} refused: {error}") from None
        self._spec_live_dir = spec_checkpoint_dir(spec, workdir)

    def _check_live_dir(self) -> None:
        """The live folder the rollback will set aside, read from the job record: only the
        one the spec resolves to (checked before the job is stopped or a table restored)."""
        from streamkeeper.errors import StreamkeeperError
        from streamkeeper_airflow.launch_policy import check_recorded_checkpoint_dir

        try:
            with self.hook._hidden():
                recorded = self.hook.client.job_record(self.job).checkpoint_dir
            self._live_dir = check_recorded_checkpoint_dir(
                recorded, [self._spec_live_dir], what="the job's checkpoint folder"
            )
        except StreamkeeperError as error:
            raise AirflowFailException(f"rollback of {self.job!r} refused: {error}") from None

    def _rewind_pending(self) -> bool:
        from streamkeeper.lineage.layout import LineageLayout

        record = self.hook.client.job_record(self.job)
        layout = LineageLayout(self.hook.client.location, record.lineage, self.job)
        return self.hook.store.read_json(layout.rewind_pending) is not None

    def _upgrade(self, records: Any) -> UpgradeRecord | None:
        if not self.upgrade_id:
            return None
        record = records.read(str(self.upgrade_id))
        failed = record.probation is not None and not record.probation.get("passed", True)
        if record.phase == "rolling_back" or (record.phase == "live" and failed):
            return record
        raise AirflowSkipException(
            f"upgrade {record.id!r} is {record.phase}: nothing to roll back"
            f"{' (blue was never stopped)' if record.phase == 'rejected' else ''}"
        )

    def _restore(self, context: Context, record: UpgradeRecord | None) -> dict[str, Any]:
        from streamkeeper.upgrade.rollback import restore_tables
        from streamkeeper.upgrade.steps import savepoint_manifest, set_aside

        client = self.hook.client
        self._stop_running(context)
        job_record = client.job_record(self.job)
        with self.hook._hidden():
            manifest = savepoint_manifest(client, job_record.lineage, str(self.savepoint_id))
            already = None if record is None else (record.rollback or {}).get("tables")
            restored = already or restore_tables(client, self.job, manifest).to_json()
        label = f"rollback-{_token(context)[-8:]}"
        aside = set_aside(self._live_dir, label) if self._live_dir else None
        self.log.info("tables restored to savepoint %s: %s", manifest.id, restored)
        return {"savepoint": manifest.id, **restored, "checkpoint_set_aside": aside}

    def _stop_running(self, context: Context) -> None:
        from streamkeeper_airflow.operators.commands import command_id_for
        from streamkeeper_airflow.starts import runner_live

        status = self.hook.status(self.job, missing_ok=True)
        if not runner_live(status):
            return
        ti = context["ti"]
        command = command_id_for("cancel", ti.dag_id, ti.run_id, ti.task_id, ti.map_index)
        self.hook.send_command(self.job, "cancel", command_id=command)
        deadline = time.monotonic() + 300
        while runner_live(self.hook.status(self.job, missing_ok=True)):
            if time.monotonic() > deadline:
                raise AirflowFailException(f"job {self.job!r} did not stop within 300s")
            time.sleep(1.0)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        from streamkeeper.upgrade.record import UpgradeRecords
        from streamkeeper.upgrade.steps import release_rollback_target

        result = super().execute_complete(context, event)
        if self.upgrade_id:
            with self.hook._hidden():
                record = UpgradeRecords(self.hook.store, self.job).advance(
                    str(self.upgrade_id),
                    ("rolling_back",),
                    "rolled_back",
                    reason="green failed its probation; blue runs again from its stop savepoint",
                )
                release_rollback_target(self.hook.client, record)
        return result


class UpgradeOutcomeOperator(_UpgradeTask):
    """The run's verdict: succeeds if the upgrade was promoted, else fails with why.

    An upgrade still in `shadow` when the run ends (start_green or validate failed for
    good: killed with no retry left, timed out) is rejected here: green's shadow run is
    stopped and blue's savepoint S0 released, instead of both staying behind for ever.
    Blue was never touched. Later phases are left as they are (UPGRADE.md, "Killing a
    task"): from `handover_requested` on, green may be stopping blue.
    """

    def execute(self, context: Context) -> dict[str, Any]:
        from streamkeeper.upgrade.steps import reject_upgrade

        record = self.record()
        if record is None:
            raise AirflowFailException("the upgrade did not begin (see the begin task's log)")
        if record.phase == "shadow":
            reason = (
                "the upgrade's run ended before the handover (a task before it failed: see "
                "its log); green's shadow run was stopped, blue runs untouched"
            )
            with self.hook._hidden():
                record = reject_upgrade(self.hook.client, self.job, record.id, reason)
        summary = {
            "upgrade_id": record.id,
            "phase": record.phase,
            "reason": record.reason,
            "gap_s": (record.handover or {}).get("gap_s"),
        }
        if record.phase != "promoted":
            raise AirflowFailException(
                f"upgrade {record.id!r} ended {record.phase}: {record.reason or 'see the tasks'}"
            )
        return summary
