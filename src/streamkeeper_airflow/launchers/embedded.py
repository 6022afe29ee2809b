"""The embedded launcher: the driver runs on the Airflow worker's host, detached.

It runs `streamkeeper run SPEC ... --detach`, which validates the spec, starts the
driver in a new session (so it outlives the task) and prints its pid and log file.
"""

from __future__ import annotations

import os
import subprocess
import sys

from streamkeeper_airflow.errors import LaunchError
from streamkeeper_airflow.launchers.base import (
    LaunchedDriver,
    LaunchRequest,
    detached_driver,
    driver_environment,
)
from streamkeeper_airflow.secrets import redact

DETACH_TIMEOUT = 300.0  # the CLI validates the spec before it detaches; pydantic is quick


class EmbeddedLauncher:
    """`python -m streamkeeper run ... --detach` in the request's working directory."""

    name = "embedded"

    def __init__(self, python: str | None = None) -> None:
        self.python = python or sys.executable

    def command(self, request: LaunchRequest) -> list[str]:
        return [self.python, "-m", "streamkeeper", request.command, *request.run_args(), "--detach"]

    def launch(self, request: LaunchRequest) -> LaunchedDriver:
        os.makedirs(request.workdir, exist_ok=True)
        done = subprocess.run(
            self.command(request),
            cwd=request.workdir,
            env=driver_environment(request, dict(os.environ)),
            capture_output=True,
            text=True,
            timeout=DETACH_TIMEOUT,
        )
        secrets = list(request.env.values())
        if done.returncode != 0:
            raise LaunchError(
                f"`streamkeeper run {request.spec_path} --detach` refused to start job "
                f"{request.job!r} (exit {done.returncode}): "
                f"{redact(done.stderr.strip()[-2000:], secrets) or '(no output)'}"
            )
        started = detached_driver(done.stdout, request.job, secrets)
        return LaunchedDriver.of_process(self.name, started["pid"], started.get("log"))
