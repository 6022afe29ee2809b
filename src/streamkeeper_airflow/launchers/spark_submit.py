"""The spark-submit launcher: the driver runs against a Spark cluster's master.

Python applications run in client mode on a standalone master, so the driver process
runs here (the Airflow worker's host) and its executors on the cluster. The app is a
two-line entry file written into the working directory (`python -m streamkeeper` as a
file, since spark-submit wants a file), and the CLI's `--master` is passed too: the
runner's session would otherwise apply the spec's master over spark-submit's.

spark-submit runs in the foreground of its own new session, detached from the task,
with its output in `{workdir}/.streamkeeper/logs/{job}.spark-submit.log`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from streamkeeper_airflow.errors import LaunchError
from streamkeeper_airflow.launchers.base import LaunchedDriver, LaunchRequest, driver_environment

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


class SparkSubmitLauncher:
    """`spark-submit --master URL --deploy-mode client entry.py run SPEC ...`, detached."""

    name = "spark_submit"

    def __init__(
        self,
        spark_submit: str | None = None,
        conf: dict[str, str] | None = None,
        deploy_mode: str = "client",
    ) -> None:
        if deploy_mode != "client":
            raise ValueError(
                f"deploy_mode {deploy_mode!r} is not supported: Python drivers on a "
                "standalone master run in client mode; use 'client' (or Kubernetes, see README)"
            )
        self.spark_submit = spark_submit
        self.conf = dict(conf or {})
        self.deploy_mode = deploy_mode

    def command(self, request: LaunchRequest, entry: Path) -> list[str]:
        if not request.master:
            raise LaunchError(
                f"the spark_submit launcher needs a Spark master for job {request.job!r}; "
                "set the spec's spark.master (e.g. spark://host:7077) or the spark_master "
                "parameter"
            )
        conf = [
            arg for key, value in sorted(self.conf.items()) for arg in ("--conf", f"{key}={value}")
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
        workdir = Path(request.workdir)
        entry = workdir / ".streamkeeper" / "airflow" / "streamkeeper_driver.py"
        entry.parent.mkdir(parents=True, exist_ok=True)
        if not entry.is_file() or entry.read_text() != DRIVER_ENTRY:
            entry.write_text(DRIVER_ENTRY)
        command = self.command(request, entry)
        env = driver_environment(request, dict(os.environ))
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        log_path = workdir / ".streamkeeper" / "logs" / f"{request.job}.spark-submit.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            try:
                process = subprocess.Popen(
                    command,
                    cwd=workdir,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # outlives the task; stopped by its own signals
                )
            except OSError as error:
                raise LaunchError(f"could not run {command[0]!r}: {error.strerror}") from None
        return LaunchedDriver.of_process(self.name, process.pid, str(log_path.resolve()))
