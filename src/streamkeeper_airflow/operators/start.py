"""Start a job, idempotently, and wait (deferred) until it runs and checkpoints.

    StartJobOperator(task_id="start", job="keyed-totals", spec_path=".../job.yaml",
                     start_from="latest_checkpoint")

`start_from`:
    resume             run the spec as it is: resume from the local Spark checkpoint
                       directory if the job ran on this host before, else a first start
    latest_checkpoint  the newest checkpoint wherever it is: the local directory if it
                       holds one, else the latest externalized checkpoint
    checkpoint         an externalized checkpoint by id (`checkpoint_id`)
    savepoint          a savepoint by id (`savepoint_id`; needs the savepoint CLI)

A task retry or a second DAG run never starts a second driver (see `starts.py`): the
start attaches to the live or pending driver and waits for it like a fresh one would.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from streamkeeper_airflow import settings
from streamkeeper_airflow.errors import LaunchPolicyError
from streamkeeper_airflow.hooks.streamkeeper import DEFAULT_CONN_ID, StreamkeeperHook
from streamkeeper_airflow.links import JOB_LINKS
from streamkeeper_airflow.operators.params import flag

if TYPE_CHECKING:
    from airflow.sdk import Context

    from streamkeeper_airflow.launchers.base import LaunchRequest
    from streamkeeper_airflow.starts import StartOutcome

_CREDENTIAL_WORDS = ("secret", "password", "credential", "access_key", "access.key", "token")


def default_jobs_folder(spec_path: str | None) -> str | None:
    """`[streamkeeper] jobs_folder`, else the folder holding the job's folder of a spec
    path the DAG author wrote (`{jobs}/{job}/job.yaml`); None for a templated one."""
    configured = settings.option("jobs_folder")
    if configured:
        return configured
    if not spec_path or "{{" in spec_path:
        return None
    return str(Path(spec_path).resolve().parent.parent)


class StartJobOperator(BaseOperator):
    """Launch (or attach to) a job's driver; succeed once it is RUNNING with N new checkpoints.

    Args:
        job: the job's name (its spec's `name`).
        spec_path: the job's YAML spec.
        conn_id: the storage root's connection (its extra `root`).
        root: the storage root, overriding the connection's.
        start_from: resume | latest_checkpoint | checkpoint | savepoint (module doc).
        checkpoint_id: the externalized checkpoint for start_from=checkpoint.
        savepoint_id: the savepoint for start_from=savepoint.
        new_checkpoints: committed checkpoints to wait for (0: until RUNNING).
        takeover: fence a live runner of the lineage instead of refusing.
        launcher: embedded | spark_submit.
        launcher_options: the launcher's own options (e.g. spark_submit, conf), or such
            options keyed by launcher name (`options_of`).
        spark_master: the Spark master (default: the spec's).
        overrides: spec overrides, dotted.key -> value (`streamkeeper run --set`).
        workdir: the driver's working directory (default `[streamkeeper] workdir`).
        jobs_folder: the folder the spec must lie in (the DAG factory's; default
            `[streamkeeper] jobs_folder`, else the folder holding this spec's job folder).
            `[streamkeeper] spec_folders` adds more. See launch_policy.py for what a
            trigger may override and which masters it may pick.
        start_timeout: seconds to wait for the driver to run and checkpoint.
        poll_interval: seconds between control-plane polls while deferred (1 s: a start
            waits seconds, not minutes, and a longer poll adds half of itself to every
            start DAG; storage outages are tolerated for as long as at 5 s, see
            triggers/base.py).
        openlineage_inject_parent_job_info: pass this task's OpenLineage run to the driver
            as its parent (Spark properties, lineage.py); default `[openlineage]
            spark_inject_parent_job_info`, as for the Spark provider's operators.
    """

    template_fields: Sequence[str] = (
        "job",
        "spec_path",
        "conn_id",
        "root",
        "start_from",
        "checkpoint_id",
        "savepoint_id",
        "new_checkpoints",
        "takeover",
        "launcher",
        "spark_master",
        "overrides",
        "workdir",
        "start_timeout",
    )
    ui_color = "#d9f2e6"
    operator_extra_links = JOB_LINKS

    def __init__(
        self,
        *,
        job: str,
        spec_path: str,
        conn_id: str = DEFAULT_CONN_ID,
        root: str | None = None,
        start_from: str = "resume",
        checkpoint_id: int | str | None = None,
        savepoint_id: str | None = None,
        new_checkpoints: int | str = 1,
        takeover: bool = False,
        launcher: str = "embedded",
        launcher_options: dict[str, Any] | None = None,
        spark_master: str | None = None,
        overrides: dict[str, Any] | None = None,
        workdir: str | None = None,
        jobs_folder: str | None = None,
        start_timeout: float | str = 900.0,
        poll_interval: float = 1.0,
        openlineage_inject_parent_job_info: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.job = job
        self.spec_path = spec_path
        self.conn_id = conn_id
        self.root = root
        self.start_from = start_from
        self.checkpoint_id = checkpoint_id
        self.savepoint_id = savepoint_id
        self.new_checkpoints = new_checkpoints
        self.takeover = takeover
        self.launcher = launcher
        self.launcher_options = dict(launcher_options or {})
        self.spark_master = spark_master
        self.overrides = overrides
        self.workdir = workdir
        self.jobs_folder = jobs_folder or default_jobs_folder(spec_path)
        self.start_timeout = start_timeout
        self.poll_interval = poll_interval
        self.openlineage_inject_parent_job_info = openlineage_inject_parent_job_info
        self._started: dict[str, Any] | None = None  # the trigger's event, for OpenLineage

    @cached_property
    def hook(self) -> StreamkeeperHook:
        return StreamkeeperHook(self.conn_id, root=self.root)

    def execute(self, context: Context) -> Any:
        from streamkeeper_airflow.errors import StartRefusedError

        request = self.launch_request(context)
        try:
            outcome = self.start(request, context)
        except StartRefusedError as error:
            raise AirflowFailException(str(error)) from None
        self.log.info(
            "job %s: %s (%s); run token %s, driver %s",
            self.job,
            outcome.action,
            outcome.reason,
            outcome.token,
            outcome.driver,
        )
        # Kept beside the result: what this try did (launched or attached, which driver).
        context["ti"].xcom_push(key="start", value=outcome.to_json())
        self.defer_until_running(outcome)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Resumed by the trigger: fail with its message, or return the status payload."""
        self._started = event
        if event.get("status") != "success":
            raise AirflowException(event.get("message", "the job did not start"))
        self.log.info("%s", event.get("message"))
        return event

    def options_of(self, launcher: str) -> dict[str, Any]:
        """`launcher_options` of `launcher`: the options themselves, or, keyed by launcher
        name (a spec's `airflow.launcher_options`), that launcher's entry, so a run that
        picks another launcher than the spec's gets that one's options, or none."""
        from streamkeeper_airflow.launchers import LAUNCHERS

        options = self.launcher_options
        if options and set(options) <= set(LAUNCHERS):
            return dict(options.get(launcher) or {})
        return dict(options)

    # -- steps ---------------------------------------------------------------------------

    def start(self, request: LaunchRequest, context: Context) -> StartOutcome:
        from streamkeeper_airflow.launchers import launcher_for
        from streamkeeper_airflow.starts import start_job

        ti = context["ti"]
        return start_job(
            store=self.hook.store,
            status=lambda job: self.hook.status(job, missing_ok=True),
            request=request,
            launcher=launcher_for(self.launcher, **self.options_of(self.launcher)),
            start_from=self.start_from,
            origin={
                "dag_id": ti.dag_id,
                "run_id": ti.run_id,
                "task_id": ti.task_id,
                "try_number": ti.try_number,
            },
        )

    def defer_until_running(self, outcome: StartOutcome) -> None:
        from streamkeeper_airflow.triggers.checkpoints import CheckpointProgressTrigger

        timeout = float(self.start_timeout)
        self.defer(
            trigger=CheckpointProgressTrigger(
                conn_id=self.conn_id,
                job=self.job,
                root=self.root,
                poll_interval=self.poll_interval,
                deadline=time.time() + timeout,
                baseline_seq=outcome.baseline_seq,
                new_checkpoints=int(self.new_checkpoints),
                run_token=outcome.token,
                after_epoch=outcome.after_epoch,
                driver=outcome.driver,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=timeout + 60),  # the trigger's own deadline comes first
        )

    def launch_request(self, context: Context) -> LaunchRequest:
        """Validate the parameters and the spec; build the launch (no side effect yet).

        Raises:
            AirflowFailException: a bad parameter or spec (retrying would not help).
        """
        from streamkeeper.errors import StreamkeeperError
        from streamkeeper_airflow.launchers.base import LaunchRequest
        from streamkeeper_airflow.starts import START_FROM, run_token_for

        if self.start_from not in START_FROM:
            raise AirflowFailException(
                f"start_from {self.start_from!r} is not one of {', '.join(START_FROM)}"
            )
        workdir = str(Path(self.workdir or settings.workdir()).resolve())
        try:
            spec_file, spec, overrides = self.checked_launch(workdir)
        except StreamkeeperError as error:
            raise AirflowFailException(str(error)) from None
        ti = context["ti"]
        return LaunchRequest(
            job=self.job,
            spec_path=str(spec_file),
            root=self.hook.root,
            run_token=run_token_for(ti.dag_id, ti.run_id, ti.task_id, ti.map_index),
            workdir=workdir,
            overrides=overrides,
            from_checkpoint=self._from_checkpoint(spec, workdir),
            from_savepoint=self._from_savepoint(),
            takeover=flag("takeover", self.takeover),
            master=self.spark_master
            or (spec.spark.master if self.launcher == "spark_submit" else None),
            env=self.hook.settings.driver_env(),
            spark_conf=self._parent_run_conf(context, spec),
            spec_in_jobs_folder=self._in_jobs_folder(spec_file),
        )

    def _in_jobs_folder(self, spec_file: Path) -> str | None:
        """`spec_file` relative to the jobs folder (None: it lies in another spec folder)."""
        if not self.jobs_folder:
            return None
        folder = Path(self.jobs_folder).resolve()
        resolved = spec_file.resolve()
        return str(resolved.relative_to(folder)) if resolved.is_relative_to(folder) else None

    # -- OpenLineage (lineage.py: None without the openlineage provider) -----------------

    def get_openlineage_facets_on_start(self) -> Any:
        from streamkeeper_airflow import lineage

        return lineage.job_lineage(self._lineage_spec(), self.hook.root, workdir=self._workdir())

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """The job's source and tables, and the run it started (also used on failure)."""
        from streamkeeper_airflow import lineage

        facets = lineage.run_facet(
            self.job,
            self._started,
            start_from=self.start_from,
            checkpoint_id=self.checkpoint_id if self.start_from == "checkpoint" else None,
            savepoint_id=self.savepoint_id if self.start_from == "savepoint" else None,
        )
        return lineage.job_lineage(
            self._lineage_spec(), self.hook.root, workdir=self._workdir(), run_facets=facets
        )

    def _lineage_spec(self) -> Any:
        """The spec with the launch's overrides; None if it does not pass (then the failed
        start says why, and its event names no datasets)."""
        from streamkeeper.errors import StreamkeeperError

        try:
            return self.checked_launch(self._workdir())[1]
        except StreamkeeperError as error:
            self.log.debug("no OpenLineage datasets: %s", error)
            return None

    def _workdir(self) -> str:
        return str(Path(self.workdir or settings.workdir()).resolve())

    def _parent_run_conf(self, context: Context, spec: Any) -> dict[str, str]:
        from streamkeeper_airflow import lineage

        inject = self.openlineage_inject_parent_job_info
        if inject is None:
            inject = lineage.inject_parent_job_info_default()
        if not flag("openlineage_inject_parent_job_info", inject):
            return {}
        return lineage.parent_run_spark_conf(context, dict(spec.spark.conf))

    def checked_launch(self, workdir: str) -> tuple[Path, Any, dict[str, str]]:
        """The spec file, the spec with the overrides, and the overrides, once the
        launcher, spec path, overrides and master passed launch_policy.py (no side effect).

        Raises:
            LaunchPolicyError: what a trigger (or a record) may not change.
            SpecError: the spec does not load or is another job's.
        """
        from streamkeeper.errors import SpecError
        from streamkeeper.spec import load_spec
        from streamkeeper_airflow.launch_policy import (
            allowed_overrides,
            check_master,
            check_overrides,
            confine_path,
        )
        from streamkeeper_airflow.launchers import LAUNCHERS

        if self.launcher not in LAUNCHERS:
            raise LaunchPolicyError(
                f"launcher {self.launcher!r} is not one of {', '.join(LAUNCHERS)}"
            )
        spec_file = confine_path(
            self._spec_file(workdir), self.spec_folders(), what=f"spec_path of job {self.job!r}"
        )
        authored = load_spec(spec_file)  # as its author wrote it: its allow-list, its master
        if authored.name != self.job:
            raise SpecError(
                f"spec {self.spec_path!r} is job {authored.name!r}, not {self.job!r}; pass the "
                "job's own spec"
            )
        given = self._trigger_overrides()
        check_overrides(
            given,
            allowed_overrides(authored.airflow.trigger_overrides, settings.trigger_overrides()),
        )
        for master in (self.spark_master, given.get("spark.master")):
            check_master(
                master, spec_master=authored.spark.master, allowed=settings.spark_masters()
            )
        overrides = self._with_connection(given)
        return spec_file, load_spec(spec_file, overrides), overrides

    def spec_folders(self) -> list[str]:
        """Where spec files may lie: the jobs folder, then `[streamkeeper] spec_folders`."""
        return [*([self.jobs_folder] if self.jobs_folder else []), *settings.spec_folders()]

    def _spec_file(self, workdir: str) -> Path:
        path = Path(self.spec_path)
        return path if path.is_absolute() else Path(workdir) / path

    def _trigger_overrides(self) -> dict[str, str]:
        """The overrides asked for, without the one the operator itself sets from the
        connection (a launch record holds it: the restart puts it back the same)."""
        overrides = {str(k): str(v) for k, v in (self.overrides or {}).items()}
        for key in overrides:
            if any(word in key.lower() for word in _CREDENTIAL_WORDS):
                raise LaunchPolicyError(
                    f"override {key!r} looks like a credential; credentials reach the driver "
                    f"through the connection {self.conn_id!r} (its login/password), never "
                    "through overrides, which are visible on its command line"
                )
        endpoint = self.hook.settings.endpoint_url
        if endpoint and overrides.get("storage.endpoint_url") == endpoint:
            del overrides["storage.endpoint_url"]
        return overrides

    def _with_connection(self, overrides: dict[str, str]) -> dict[str, str]:
        endpoint = self.hook.settings.endpoint_url
        if endpoint:  # the connection is the authority on where the root is
            return {**overrides, "storage.endpoint_url": endpoint}
        return overrides

    def _from_checkpoint(self, spec: Any, workdir: str) -> str | None:
        if self.start_from == "checkpoint":
            if self.checkpoint_id is None or not str(self.checkpoint_id).isdigit():
                raise AirflowFailException(
                    f"start_from 'checkpoint' needs checkpoint_id, an externalized "
                    f"checkpoint's id (a number; see `streamkeeper checkpoints {self.job}`); "
                    f"got {self.checkpoint_id!r}"
                )
            return str(self.checkpoint_id)
        if self.start_from == "latest_checkpoint":
            from streamkeeper_airflow.launch_policy import spec_checkpoint_dir

            directory = spec_checkpoint_dir(spec, workdir)
            local = directory.is_dir() and any(directory.iterdir())
            return None if local else "latest"  # the local directory is never older
        return None

    def _from_savepoint(self) -> str | None:
        if self.start_from != "savepoint":
            return None
        if not self.savepoint_id:
            raise AirflowFailException(
                f"start_from 'savepoint' needs savepoint_id (see `streamkeeper savepoints "
                f"{self.job}`); got {self.savepoint_id!r}"
            )
        import inspect

        from streamkeeper import cli

        if "from_savepoint" not in inspect.signature(cli.run).parameters:
            raise AirflowFailException(
                "start_from 'savepoint' needs `streamkeeper run --from-savepoint`, which the "
                "installed streamkeeper does not have yet (it arrives with savepoints)"
            )
        self.check_savepoint()
        return str(self.savepoint_id)

    def check_savepoint(self) -> None:
        """The savepoint exists, is this job's and is whole: checked before anything is
        launched or stopped (the driver would refuse it only after its start).

        Raises:
            AirflowFailException: naming the savepoint and the fix.
        """
        from streamkeeper.errors import StreamkeeperError

        savepoint_id = str(self.savepoint_id)
        try:
            with self.hook._hidden():
                found = self.hook.client.describe_savepoint(savepoint_id)
        except StreamkeeperError as error:
            raise AirflowFailException(str(error)) from None
        if found.entry.job != self.job:
            raise AirflowFailException(
                f"savepoint {savepoint_id!r} belongs to job {found.entry.job!r} (lineage "
                f"{found.entry.lineage!r}), not to {self.job!r}; pick one of "
                f"`streamkeeper savepoints {self.job}`"
            )
        if found.broken:
            raise AirflowFailException(
                f"savepoint {savepoint_id!r} is broken: {'; '.join(found.problems[:5])}; "
                f"restore another savepoint (`streamkeeper savepoints {self.job}`)"
            )
