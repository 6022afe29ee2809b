"""Airflow's components, started one by one on 127.0.0.1, on a test's metadata database.

`airflow standalone` serves logs on every interface, so the api-server (also the task
execution API), scheduler (LocalExecutor), dag-processor and triggerer are started
here, each with its log server off. SQLite allows one task at a time (parallelism 1).
The components share the calling process's AIRFLOW_HOME and database, so a test reads
DAG runs, task instances and XComs through Airflow's models in-process.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import sys
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from infra.components.process import HOST, LocalService, ServiceError, Stoppable, free_port


@dataclass
class AirflowServices(Stoppable):
    """The running components and the environment they share."""

    env: dict[str, str]
    port: int
    services: list[LocalService] = field(default_factory=list)

    @property
    def api_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def stop(self, grace: float = 20.0) -> None:
        for service in reversed(self.services):
            service.stop(grace)
        _drop_pooled_connections()

    def component(self, name: str) -> LocalService:
        """The running component `name` (api-server, scheduler, dag-processor, triggerer)."""
        for service in self.services:
            if service.name == f"airflow {name}":
                return service
        known = ", ".join(s.name.removeprefix("airflow ") for s in self.services)
        raise KeyError(f"no Airflow component {name!r}; running: {known}")

    def kill(self, name: str) -> None:
        """SIGKILL a component's process group: it, and the processes it forked (the
        scheduler's LocalExecutor workers and their task processes), die at once."""
        service = self.component(name)
        if service.pid is not None:  # the group's leader: started in a session of its own
            with contextlib.suppress(ProcessLookupError):
                os.killpg(service.pid, signal.SIGKILL)
        service.stop(grace=0.0)  # reaps it

    def restart(self, name: str, *, grace: float = 20.0) -> LocalService:
        """Stop a component as a service manager would (SIGTERM to its group, SIGKILL after
        `grace` seconds; 0: SIGKILL at once) and start a new one with the same command,
        environment and log file."""
        old = self.component(name)
        if grace <= 0:
            self.kill(name)
        else:
            old.stop(grace=grace)
        new = LocalService(old.name, old.argv, old.log_path, env=old.env, cwd=old.cwd).start()
        self.services[self.services.index(old)] = new
        return new


def _drop_pooled_connections() -> None:
    """Close this process's pooled SQLite connections once the components are gone.

    The last component to close the database checkpoints and deletes its WAL files; a
    connection pooled here across that keeps the old shared-memory index mapped, and a
    later query in this process (the next test's) read "database disk image is malformed"
    in CI. Fresh connections map the new one.
    """
    settings = sys.modules.get("airflow.settings")
    if settings is None:
        return
    for engine in (settings.engine, getattr(settings.async_engine, "sync_engine", None)):
        if engine is not None:
            engine.dispose()


def airflow_env(extra: Mapping[str, str], port: int) -> dict[str, str]:
    """This process's environment (AIRFLOW_HOME, DAG folder) plus the components' settings."""
    jwt_secret = secrets.token_hex(16)
    return {
        **os.environ,
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "1",  # SQLite: one task at a time
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://{HOST}:{port}/execution/",
        "AIRFLOW__API__HOST": HOST,
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__SECRET_KEY": secrets.token_hex(16),
        "AIRFLOW__API_AUTH__JWT_SECRET": jwt_secret,
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
        "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "1",
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
        **extra,
    }


COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")


def _healthy(port: int) -> bool:
    with urllib.request.urlopen(f"http://{HOST}:{port}/api/v2/monitor/health", timeout=2) as r:
        return r.status == 200


def start_airflow(
    work_dir: Path,
    extra_env: Mapping[str, str],
    timeout: float = 180.0,
    components: tuple[str, ...] = COMPONENTS,
) -> AirflowServices:
    """Start api-server, scheduler, dag-processor and triggerer; wait for the API.

    The API's port was free when it was chosen; another process may take it before the
    api-server binds it (an outgoing connection's source port comes from the same range).
    Then everything is started again on another port, up to `BIND_ATTEMPTS` times.

    Args:
        work_dir: where each component's log goes (`airflow-{component}.log`).
        extra_env: more environment for every component (connections, settings).
        components: those to start (the api-server always, first).
    """
    for attempt in range(1, BIND_ATTEMPTS + 1):
        try:
            return _start_on(free_port(), work_dir, extra_env, timeout, components)
        except ServiceError as error:
            if attempt == BIND_ATTEMPTS or "address already in use" not in str(error):
                raise
    raise AssertionError("unreachable")  # the last attempt returned or raised


BIND_ATTEMPTS = 3


def _start_on(
    port: int,
    work_dir: Path,
    extra_env: Mapping[str, str],
    timeout: float,
    components: tuple[str, ...],
) -> AirflowServices:
    env = airflow_env(extra_env, port)
    airflow = [sys.executable, "-m", "airflow"]
    commands = {
        "api-server": [*airflow, "api-server", "--host", HOST, "--port", str(port)],
        "scheduler": [*airflow, "scheduler", "--skip-serve-logs"],
        "dag-processor": [*airflow, "dag-processor"],
        "triggerer": [*airflow, "triggerer", "--skip-serve-logs"],
    }
    commands = {
        name: argv for name, argv in commands.items() if name in {"api-server", *components}
    }
    running = AirflowServices(env=env, port=port)
    try:
        for name, argv in commands.items():
            service = LocalService(
                f"airflow {name}", argv, work_dir / f"airflow-{name}.log", env=env, cwd=work_dir
            )
            running.services.append(service.start())
        started = time.monotonic()
        running.services[0].wait_until_ready(lambda: _healthy(port), timeout=timeout)
        for service in running.services[1:]:
            if not service.is_running():
                raise service.failure(f"exited {time.monotonic() - started:.0f} s after start")
    except BaseException:
        running.stop()
        raise
    return running
