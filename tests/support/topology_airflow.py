"""A distributed Airflow across the hosts of a topology (tests/support/topology.py).

PostgreSQL (the metadata DB and Celery's result backend) and Redis (Celery's broker) on
one host, bound to its address only; Airflow's components (api-server, scheduler,
dag-processor, triggerer, Celery workers) started one by one on whichever hosts a test
picks, each with its log server off. The test process reaches the API through the
topology's uplink, as a user on another machine would, and triggers and follows DAG runs
through the REST API only (it never imports Airflow: its own home stays untouched).

Namespaces share the filesystem, so every host reads the same AIRFLOW_HOME, DAG folder
and jobs folder, as a deployment ships them to each machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.services.postgres import _as_server_user, postgres_bin
from tests.support.topology import Topology
from tests.support.topology_services import ServiceNotReady, connects, wait_for

REPO = Path(__file__).resolve().parents[2]
POSTGRES_PORT = 5432
REDIS_PORT = 6379
API_PORT = 8080
TERMINAL = ("success", "failed")


def redis_server() -> str | None:
    """Debian's redis-server (infra/setup.sh installs it), or None."""
    return shutil.which("redis-server")


# -- PostgreSQL and Redis on one host ----------------------------------------------------


@dataclass
class PostgresOnHost:
    """A throwaway PostgreSQL server on a host's address (its data in `data_dir`)."""

    address: str
    password: str
    data_dir: Path
    user: str = "airflow"
    database: str = "airflow"
    port: int = POSTGRES_PORT

    def url(self, scheme: str = "postgresql+psycopg2") -> str:
        credentials = f"{self.user}:{self.password}"
        return f"{scheme}://{credentials}@{self.address}:{self.port}/{self.database}"

    def connect(self, database: str | None = None) -> Any:
        import psycopg2

        connection = psycopg2.connect(
            host=self.address,
            port=self.port,
            dbname=database or self.database,
            user=self.user,
            password=self.password,
            connect_timeout=5,
        )
        connection.autocommit = True
        return connection

    def cleanup(self) -> None:
        shutil.rmtree(self.data_dir, ignore_errors=True)


def start_postgres_on(topology: Topology, host: str, log: Path) -> PostgresOnHost:
    """initdb a cluster that accepts password logins from the topology's subnet, start it
    on `host`'s address only, create the `airflow` database.

    Its folder is a fresh temp dir the `postgres` user owns (as root the server runs as
    that user, and pytest's tmp_path is private to root); `cleanup` removes it.
    """
    binaries = postgres_bin()
    if binaries is None:
        raise RuntimeError("PostgreSQL is not installed: apt-get install postgresql")
    data_dir = Path(tempfile.mkdtemp(prefix="sk-topology-pg-"))
    server = PostgresOnHost(topology.address(host), secrets.token_hex(12), data_dir)
    try:
        (data_dir / "pwfile").write_text(server.password)
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            for path in (data_dir, data_dir / "pwfile"):
                os.chown(path, owner.pw_uid, owner.pw_gid)
        cluster = data_dir / "cluster"
        initdb = [str(binaries / "initdb"), "-D", str(cluster), "-U", server.user]
        initdb += ["--auth=scram-sha-256", f"--pwfile={data_dir / 'pwfile'}", "--no-sync"]
        subprocess.run(_as_server_user(initdb), check=True, capture_output=True)
        with open(cluster / "pg_hba.conf", "a") as hba:  # the other hosts of this run only
            hba.write(f"host all all {topology.subnet.with_prefixlen} scram-sha-256\n")
        argv = [str(binaries / "postgres"), "-D", str(cluster)]
        for setting in (
            f"listen_addresses={server.address}",
            f"port={server.port}",
            f"unix_socket_directories={data_dir}",
            "fsync=off",
            "synchronous_commit=off",
            "max_connections=300",
        ):
            argv += ["-c", setting]
        topology.run(host, _as_server_user(argv), log=log)
        wait_for("PostgreSQL", lambda: connects(server.address, server.port), log, timeout=60)
        with contextlib.closing(server.connect("postgres")) as connection:
            connection.cursor().execute(f'CREATE DATABASE "{server.database}"')
    except BaseException:
        server.cleanup()
        raise
    return server


@dataclass
class RedisOnHost:
    address: str
    password: str
    data_dir: Path
    port: int = REDIS_PORT

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@{self.address}:{self.port}/0"

    def cleanup(self) -> None:
        shutil.rmtree(self.data_dir, ignore_errors=True)


def start_redis_on(topology: Topology, host: str, log: Path) -> RedisOnHost:
    """redis-server on `host`'s address only, with a password, nothing persisted (its
    working folder is a temp dir `cleanup` removes)."""
    binary = redis_server()
    if binary is None:
        raise RuntimeError("redis-server is not installed: apt-get install redis-server")
    data_dir = Path(tempfile.mkdtemp(prefix="sk-topology-redis-"))
    server = RedisOnHost(topology.address(host), secrets.token_hex(12), data_dir)
    argv = [binary, "--bind", server.address, "--port", str(server.port), "--save", ""]
    argv += ["--appendonly", "no", "--dir", str(data_dir), "--requirepass", server.password]
    try:
        topology.run(host, argv, log=log, cwd=data_dir)
        wait_for("Redis", lambda: connects(server.address, server.port), log, timeout=30)
    except BaseException:
        server.cleanup()
        raise
    return server


# -- Airflow's components ----------------------------------------------------------------


def dags_folder(place: Path) -> Path:
    """The production DAG files (symlinks to dags/*.py): what a deployment ships."""
    place.mkdir(parents=True, exist_ok=True)
    for source in (REPO / "dags").glob("*.py"):
        (place / source.name).symlink_to(source)
    return place


@dataclass
class Component:
    """One Airflow process on one host, as started (to start it again alike)."""

    name: str
    host: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    process: subprocess.Popen[bytes] | None = None


@dataclass
class AirflowCluster:
    """Airflow's components on the hosts of `topology`, sharing `env` (one AIRFLOW_HOME,
    one metadata DB, one broker); the API on `api_host`'s address."""

    topology: Topology
    home: Path
    env: dict[str, str]
    api_host: str
    admin_password: str
    components: dict[str, Component] = field(default_factory=dict)
    _token: str | None = None

    @property
    def api_url(self) -> str:
        return f"http://{self.topology.address(self.api_host)}:{API_PORT}"

    # -- processes -----------------------------------------------------------------------

    def airflow(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "airflow", *args]

    def migrate(self, host: str, timeout: float = 300) -> float:
        """`airflow db migrate` on `host` (it also writes AIRFLOW_HOME's airflow.cfg, once,
        before several components would race to); the seconds it took."""
        started = time.monotonic()
        log = self.home / "logs-components" / "db-migrate.log"
        process = self.topology.run(host, self.airflow("db", "migrate"), self.env, log)
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
        if code != 0:
            raise RuntimeError(f"airflow db migrate failed ({code}): {_tail(log)}")
        return time.monotonic() - started

    def start(
        self, name: str, host: str, args: list[str], extra_env: Mapping[str, str] | None = None
    ) -> Component:
        """Start `airflow ARGS` on `host` as component `name` (its log beside the others)."""
        log = self.home / "logs-components" / f"{name}.log"
        env = {**self.env, **(extra_env or {})}
        component = Component(name, host, self.airflow(*args), env, log)
        self.components[name] = component
        return self._launch(component)

    def _launch(self, component: Component) -> Component:
        component.process = self.topology.run(
            component.host, component.argv, component.env, component.log, cwd=self.home
        )
        return component

    def kill(self, name: str) -> None:
        """SIGKILL a component and whatever it forked (its own session: `Topology.run`)."""
        process = self.components[name].process
        assert process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)

    def restart(self, name: str) -> Component:
        """Kill a component and start it again, same command, environment and log."""
        self.kill(name)
        return self._launch(self.components[name])

    def relaunch(self, name: str) -> Component:
        """Start a component again after its host was killed (`Topology.kill_host`)."""
        return self._launch(self.components[name])

    def check_running(self) -> None:
        for component in self.components.values():
            if component.process is not None and component.process.poll() is not None:
                raise ServiceNotReady(
                    f"airflow {component.name} on {component.host} exited "
                    f"{component.process.returncode}: {_tail(component.log)}"
                )

    # -- the REST API ----------------------------------------------------------------------

    def wait(self, what: str, check: Callable[[], bool], log: Path, timeout: float) -> float:
        """Poll `check` (an exception means not yet) as `wait_for` does, but fail at once
        when a component exited; the seconds it took."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            self.check_running()
            with contextlib.suppress(Exception):
                if check():
                    return time.monotonic() - started
            time.sleep(0.5)
        raise ServiceNotReady(f"{what} not ready within {timeout:.0f}s; {_tail(log)}")

    def wait_healthy(self, timeout: float = 180) -> float:
        def healthy() -> bool:
            with urllib.request.urlopen(f"{self.api_url}/api/v2/monitor/health", timeout=3) as r:
                return r.status == 200

        return self.wait("Airflow's API", healthy, self.components["api-server"].log, timeout)

    def call(self, method: str, path: str, body: Any = None) -> Any:
        """One REST call as the admin user; the decoded JSON answer."""
        if self._token is None:
            login = {"username": "admin", "password": self.admin_password}
            self._token = self._request("POST", "/auth/token", login, None)["access_token"]
        return self._request(method, path, body, self._token)

    def _request(self, method: str, path: str, body: Any, token: str | None) -> Any:
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.api_url}{path}", data=data, headers=headers, method=method
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                text = response.read()
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")[-1500:]
            raise ApiError(error.code, f"{method} {path}: {error.code} {detail}") from None
        return json.loads(text) if text else None

    def wait_parsed(self, dag_ids: list[str], timeout: float = 240) -> float:
        def parsed() -> bool:
            for dag_id in dag_ids:
                try:
                    self.call("GET", f"/api/v2/dags/{dag_id}")
                except ApiError as error:
                    if error.status == 404:
                        return False
                    raise
            return True

        log = self.components["dag-processor"].log
        return self.wait(f"DAGs {dag_ids}", parsed, log, timeout)

    def trigger(self, dag_id: str, conf: dict[str, Any]) -> str:
        body = {"logical_date": None, "conf": conf}
        return str(self.call("POST", f"/api/v2/dags/{dag_id}/dagRuns", body)["dag_run_id"])

    def run_state(self, dag_id: str, run_id: str) -> str:
        return str(self.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")["state"])

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, dict[str, Any]]:
        path = f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances"
        return {ti["task_id"]: ti for ti in self.call("GET", path)["task_instances"]}

    def tries(self, dag_id: str, run_id: str, task_id: str) -> list[dict[str, Any]]:
        """Every try of a task instance (the current one included)."""
        path = f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/tries"
        return list(self.call("GET", path)["task_instances"])

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value") -> Any:
        path = f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/{key}"
        return self.call("GET", path)["value"]

    def runs(self, dag_id: str) -> list[dict[str, Any]]:
        return list(self.call("GET", f"/api/v2/dags/{dag_id}/dagRuns?limit=100")["dag_runs"])

    def wait_finished(self, dag_id: str, run_id: str, timeout: float) -> str:
        """The run's final state; raises naming its task instances if it does not end."""
        deadline = time.monotonic() + timeout
        state = None
        while time.monotonic() < deadline:
            state = self.run_state(dag_id, run_id)
            if state in TERMINAL:
                return state
            time.sleep(1)
        raise AssertionError(
            f"{dag_id} {run_id} still {state} after {timeout:.0f} s: "
            f"{self.describe(dag_id, run_id)}"
        )

    def describe(self, dag_id: str, run_id: str) -> str:
        """Each task's state, try and queue; a failed task's last error from its log."""
        tasks = self.task_instances(dag_id, run_id).values()
        return ", ".join(
            f"{t['task_id']}={t['state']} (try {t['try_number']}, queue {t['queue']})"
            + (f" [{self.last_error(dag_id, run_id, t)}]" if t["state"] == "failed" else "")
            for t in tasks
        )

    def last_error(self, dag_id: str, run_id: str, task: dict[str, Any]) -> str:
        """The last error a task's try logged (its log file in the shared home)."""
        log = (
            self.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}"
            / f"task_id={task['task_id']}" / f"attempt={task['try_number']}.log"
        )  # fmt: skip
        if not log.exists():
            return f"no log at {log}"
        errors = []
        for line in log.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("level") != "error":
                continue
            detail = entry.get("error_detail")
            if isinstance(detail, list) and detail:  # the exception that failed the try
                errors.append(f"{detail[-1].get('exc_type')}: {detail[-1].get('exc_value')}")
            else:
                errors.append(str(entry.get("event", "")))
        return errors[-1][:600] if errors else "no error logged"


class ApiError(RuntimeError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def cluster_env(
    home: Path,
    api_address: str,
    database: PostgresOnHost,
    broker: RedisOnHost,
    admin_password: str,
    extra: Mapping[str, str],
) -> dict[str, str]:
    """What every component on every host shares: the home, the metadata DB, Celery's
    broker and result backend, the execution API's address, short heartbeats."""
    passwords = home / "simple_auth_manager_passwords.json"
    passwords.write_text(json.dumps({"admin": admin_password}))
    own = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AIRFLOW"))}
    return {
        **own,  # without storage keys (the connection has them) or another Airflow's settings
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
        "AIRFLOW__CORE__PARALLELISM": "8",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://{api_address}:{API_PORT}/execution/",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database.url(),
        "AIRFLOW__CELERY__BROKER_URL": broker.url,
        "AIRFLOW__CELERY__RESULT_BACKEND": database.url("db+postgresql+psycopg2"),
        "AIRFLOW__API__HOST": api_address,
        "AIRFLOW__API__PORT": str(API_PORT),
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API__SECRET_KEY": secrets.token_hex(16),
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(16),
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
        "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "1",
        **extra,
    }


def _tail(log: Path, chars: int = 3000) -> str:
    return f"{log}:\n{log.read_text(errors='replace')[-chars:]}" if log.exists() else str(log)
