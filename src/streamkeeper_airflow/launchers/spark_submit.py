"""The spark-submit launcher: the driver runs against a Spark cluster's master.

Client mode (the default): the driver process runs here (the Airflow worker's host) and
its executors on the cluster; the only mode Spark offers Python applications on a
standalone master. The app is a two-line entry file written into the working directory
(`python -m streamkeeper` as a file, since spark-submit wants a file), and the CLI's
`--master` is passed too: the runner's session would otherwise apply the spec's master
over spark-submit's. spark-submit runs in the foreground of its own new session,
detached from the task, with its output in
`{workdir}/.streamkeeper/logs/{job}.spark-submit.log`.

Cluster mode (`deploy_mode="cluster"`), on a `k8s://` or `yarn` master only: the driver
runs in the cluster, not here. The entry file must be where the driver runs: `py_file`
(e.g. `local:///opt/streamkeeper/streamkeeper_driver.py` in the image). spark-submit
leaves once the driver is submitted (`...submission.waitAppCompletion=false`); the
launcher waits for that (at most `submit_timeout`), so a refused submission fails the
start at once. The driver is then followed through the control plane (heartbeat, run
token), never by a pid: the launched driver's pid is 0 and its host names the cluster
(`k8s:{namespace}/{driver pod}`), since spark-submit's pid would read as a dead driver
as soon as it left. On Kubernetes (kubernetes.spark_submit_conf) the driver pod is named
from the run token, and the connection's settings go into a Secret the pods read through
`secretKeyRef`; on YARN the connection may carry no key (the command line shows
`spark.yarn.appMasterEnv.*`): the cluster's nodes need storage credentials of their own.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from streamkeeper_airflow.errors import LaunchError
from streamkeeper_airflow.launchers.base import (
    AWS_KEY_NAMES,
    LaunchedDriver,
    LaunchRequest,
    driver_environment,
)

log = logging.getLogger(__name__)

DEPLOY_MODES = ("client", "cluster")
SUBMIT_TIMEOUT = 300.0  # cluster mode: spark-submit leaves once the driver is submitted
NO_PYTHON_CLUSTER_MODE = (
    "Spark does not support cluster deploy mode for Python applications on standalone "
    "clusters; use client mode on a gateway host (launcher 'ssh' or 'spark_submit' in "
    "client mode) or a Kubernetes/YARN master"
)

DRIVER_ENTRY = """\
# Written by streamkeeper_airflow's spark-submit launcher: runs `python -m streamkeeper`.
import runpy

runpy.run_module("streamkeeper", run_name="__main__", alter_sys=True)
"""


def find_spark_submit() -> str:
    """`spark-submit` beside this interpreter (the pyspark wheel's), else on PATH.

    Raises:
        LaunchError: in neither place.
    """
    beside = Path(sys.executable).parent / "spark-submit"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("spark-submit")
    if found is None:
        raise LaunchError(
            f"spark-submit not found beside {sys.executable} or on PATH; install pyspark "
            "or pass spark_submit='/path/to/spark-submit' in launcher_options"
        )
    return found


def cluster_manager(master: str) -> str:
    """`k8s` or `yarn`: the masters where Spark runs a Python driver in cluster mode.

    Raises:
        LaunchError: any other master (standalone, local), naming it and the way out.
    """
    if master.startswith("k8s://"):
        return "k8s"
    if master == "yarn" or master.startswith("yarn://"):
        return "yarn"
    raise LaunchError(f"deploy_mode 'cluster' with master {master!r}: {NO_PYTHON_CLUSTER_MODE}")


@dataclass(frozen=True)
class ClusterLaunch:
    """What cluster mode adds to a submission, and where its driver runs."""

    entry: str
    conf: dict[str, str]
    host: str
    log_hint: str | None = None
    secret: dict[str, Any] | None = field(default=None, repr=False)


class SparkSubmitLauncher:
    """`spark-submit --master URL --deploy-mode MODE entry.py run SPEC ...`, detached.

    Args:
        spark_submit: the spark-submit executable (default: beside Python, else PATH).
        conf: Spark properties, as `--conf` pairs (never a credential).
        deploy_mode: client (the driver here) or cluster (k8s:// or yarn masters only).
        py_file: cluster mode: the entry file where the driver runs.
        driver_spec_path: cluster mode: the job's spec where the driver runs (default:
            the request's path).
        submit_timeout: cluster mode: seconds to wait for spark-submit to submit.
        kubeconfig, context, in_cluster: cluster mode on Kubernetes: the client that
            creates the pods' Secret (see kubernetes.api_client).
        pod_identity: cluster mode on Kubernetes: the pods' service account reaches the
            storage (IRSA, Pod Identity): the connection's keys are not shipped.
    """

    name = "spark_submit"

    def __init__(
        self,
        spark_submit: str | None = None,
        conf: dict[str, str] | None = None,
        deploy_mode: str = "client",
        py_file: str | None = None,
        driver_spec_path: str | None = None,
        submit_timeout: float = SUBMIT_TIMEOUT,
        kubeconfig: str | None = None,
        context: str | None = None,
        in_cluster: bool = False,
        pod_identity: bool = False,
    ) -> None:
        if deploy_mode not in DEPLOY_MODES:
            raise ValueError(f"deploy_mode {deploy_mode!r} is not one of {', '.join(DEPLOY_MODES)}")
        self.spark_submit = spark_submit
        self.conf = dict(conf or {})
        self.deploy_mode = deploy_mode
        self.py_file = py_file
        self.driver_spec_path = driver_spec_path
        self.submit_timeout = float(submit_timeout)
        self.kube = {"kubeconfig": kubeconfig, "context": context, "in_cluster": in_cluster}
        self.pod_identity = pod_identity

    def command(
        self, request: LaunchRequest, entry: Path | str, extra_conf: dict[str, str] | None = None
    ) -> list[str]:
        if not request.master:
            raise LaunchError(
                f"the spark_submit launcher needs a Spark master for job {request.job!r}; "
                "set the spec's spark.master (e.g. spark://host:7077) or the spark_master "
                "parameter"
            )
        if self.deploy_mode == "cluster":
            cluster_manager(request.master)
        merged = {**self.conf, **(extra_conf or {})}
        conf = [
            arg for key, value in sorted(merged.items()) for arg in ("--conf", f"{key}={value}")
        ]
        return [
            self.spark_submit or find_spark_submit(),
            "--master",
            request.master,
            "--deploy-mode",
            self.deploy_mode,
            "--name",
            f"streamkeeper-{request.job}",
            *conf,
            str(entry),
            request.command,
            *request.run_args(),
        ]

    def launch(self, request: LaunchRequest) -> LaunchedDriver:
        if self.deploy_mode == "cluster":
            return self._launch_cluster(request)
        workdir = Path(request.workdir)
        entry = workdir / ".streamkeeper" / "airflow" / "streamkeeper_driver.py"
        entry.parent.mkdir(parents=True, exist_ok=True)
        if not entry.is_file() or entry.read_text() != DRIVER_ENTRY:
            entry.write_text(DRIVER_ENTRY)
        command = self.command(request, entry)
        process, log_path = self._start(request, command)
        return LaunchedDriver.of_process(self.name, process.pid, str(log_path.resolve()))

    def _start(
        self, request: LaunchRequest, command: list[str]
    ) -> tuple[subprocess.Popen[bytes], Path]:
        workdir = Path(request.workdir)
        env = driver_environment(request, dict(os.environ))
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        log_path = workdir / ".streamkeeper" / "logs" / f"{request.job}.spark-submit.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log_file:
            try:
                process = subprocess.Popen(
                    command,
                    cwd=workdir,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # outlives the task; stopped by its own signals
                )
            except OSError as error:
                raise LaunchError(f"could not run {command[0]!r}: {error.strerror}") from None
        return process, log_path

    # -- cluster mode ---------------------------------------------------------------------

    def cluster_launch(self, request: LaunchRequest) -> ClusterLaunch:
        """What cluster mode submits for `request` (no side effect).

        Raises:
            LaunchError: a master without Python cluster mode, no py_file, no image.
        """
        if not request.master:
            raise LaunchError(
                f"deploy_mode 'cluster' needs a k8s:// or yarn master for job {request.job!r}; "
                "pass spark_master"
            )
        manager = cluster_manager(request.master)
        if not self.py_file:
            raise LaunchError(
                f"deploy_mode 'cluster' runs the driver on the cluster, where "
                f"{request.workdir} is not: pass py_file, the entry file where the driver "
                "runs, in launcher_options (e.g. "
                "'local:///opt/streamkeeper/streamkeeper_driver.py' in the image)"
            )
        if manager == "k8s":
            return self._kubernetes_launch(request)
        return self._yarn_launch(request)

    def _kubernetes_launch(self, request: LaunchRequest) -> ClusterLaunch:
        from streamkeeper_airflow.launchers import kubernetes as k8s

        image = self.conf.get("spark.kubernetes.container.image")
        if not image:
            raise LaunchError(
                "deploy_mode 'cluster' on Kubernetes needs the driver's image: set "
                "spark.kubernetes.container.image in the launcher's conf"
            )
        try:
            options = k8s.KubernetesOptions(
                namespace=self.conf.get("spark.kubernetes.namespace", "default"),
                image=image,
                service_account=self.conf.get(
                    "spark.kubernetes.authenticate.driver.serviceAccountName"
                ),
                pod_identity=self.pod_identity,
                py_file=str(self.py_file),
                **self.kube,
            )
            options.check()
        except ValueError as error:
            raise LaunchError(f"spark_submit launcher, cluster mode: {error}") from None
        name = k8s.app_name(request.job, request.run_token)
        secret = k8s.render_secret(request, options, name)
        conf = k8s.spark_submit_conf(
            request,
            name=name,
            namespace=options.namespace,
            image=image,
            secret_name=None if secret is None else name,
            secret_keys=tuple(secret["stringData"]) if secret else (),
            service_account=options.service_account,
        )
        pod = k8s.submit_driver_pod(name)
        return ClusterLaunch(
            entry=options.py_file,
            conf=conf,
            host=f"k8s:{options.namespace}/{pod}",
            log_hint=f"kubectl -n {options.namespace} logs {pod}",
            secret=secret,
        )

    def _yarn_launch(self, request: LaunchRequest) -> ClusterLaunch:
        from streamkeeper_airflow.launchers.kubernetes import label_value

        keys = sorted(k for k in request.env if k in AWS_KEY_NAMES)
        if keys:
            raise LaunchError(
                f"deploy_mode 'cluster' on YARN would put {', '.join(keys)} of the "
                "connection on spark-submit's command line (spark.yarn.appMasterEnv.*), "
                "which every user of the host sees: give the cluster's nodes storage "
                "credentials of their own (an instance profile) and use a connection "
                "without keys, or run in client mode"
            )
        conf = {
            "spark.yarn.submit.waitAppCompletion": "false",
            "spark.yarn.tags": f"streamkeeper,{request.job},{label_value(request.run_token)}",
            "spark.yarn.appMasterEnv.STREAMKEEPER_DEPLOY_MODE": "cluster",
        }
        for key, value in sorted(request.env.items()):  # region, endpoint: no key
            conf[f"spark.yarn.appMasterEnv.{key}"] = value
            conf[f"spark.executorEnv.{key}"] = value
        return ClusterLaunch(
            entry=str(self.py_file),
            conf=conf,
            host=f"yarn:streamkeeper-{request.job}",
            log_hint=f"yarn logs, application tag {label_value(request.run_token)}",
        )

    def _launch_cluster(self, request: LaunchRequest) -> LaunchedDriver:
        from streamkeeper_airflow.launchers import kubernetes as k8s

        plan = self.cluster_launch(request)
        if self.driver_spec_path:
            request = replace(request, spec_path=self.driver_spec_path)
        command = self.command(request, plan.entry, plan.conf)
        k8s.check_no_secret_values(command, request.env, "spark-submit's command line")
        if plan.secret is not None:
            from urllib3.exceptions import HTTPError

            with k8s.api_client(**self.kube) as api:
                try:
                    k8s.create_secret(api, plan.secret, request.run_token)
                except HTTPError as error:
                    raise k8s.unreachable(error, api) from None
        process, log_path = self._start(request, command)
        self._await_submission(process, request, log_path)
        return LaunchedDriver(
            launcher=self.name,
            pid=0,  # the driver is no process of this host: followed by its heartbeat
            host=plan.host,
            process_started_at=None,
            log=plan.log_hint,
        )

    def _await_submission(
        self, process: subprocess.Popen[bytes], request: LaunchRequest, log_path: Path
    ) -> None:
        """Wait for spark-submit to submit; a refusal raises with its log's tail."""
        from streamkeeper_airflow.secrets import redact

        try:
            code = process.wait(timeout=self.submit_timeout)
        except subprocess.TimeoutExpired:
            log.warning(
                "spark-submit of job %s still runs after %.0f s; the driver's heartbeat "
                "will tell whether it started (see %s)",
                request.job,
                self.submit_timeout,
                log_path,
            )
            return
        if code != 0:
            tail = log_path.read_bytes()[-1500:].decode("utf-8", errors="replace")
            raise LaunchError(
                f"spark-submit could not submit job {request.job!r} to {request.master} "
                f"(exit {code}); see {log_path}: "
                f"{redact(tail.strip(), list(request.env.values())) or '(no output)'}"
            )
