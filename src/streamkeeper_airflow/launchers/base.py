"""What every launcher is given and gives back, and the `streamkeeper run` command line.

A launcher starts one driver in the background and returns at once: waiting for the
driver is the job of a deferrable trigger, never of a worker slot. Credentials reach
the driver through its environment (`LaunchRequest.env`), never its command line,
which `ps` shows to every user of the host.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import psutil


@dataclass(frozen=True)
class LaunchRequest:
    """One start of one job: everything `streamkeeper run` needs."""

    job: str
    spec_path: str
    root: str
    run_token: str
    workdir: str  # the driver's working directory: relative spec paths resolve here
    overrides: dict[str, str] = field(default_factory=dict)  # `--set dotted.key=value`
    checkpoint_dir: str | None = None
    from_checkpoint: str | None = None  # latest | an externalized checkpoint id
    from_savepoint: str | None = None  # a savepoint id (the savepoint CLI's option)
    takeover: bool = False
    master: str | None = None  # Spark master; the spec's if None
    allow_rewind: bool = False  # a savepoint behind the lineage's head (a rollback)
    # `run`, or `upgrade-green` (an upgrade's green driver, with `--upgrade-id` in extra_args)
    command: str = "run"
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict, repr=False)  # AWS_* credentials
    # Spark properties the Airflow layer adds (OpenLineage's parent run: lineage.py), given
    # as `--set spark.conf.KEY=VALUE`; never a credential (the command line shows them)
    spark_conf: dict[str, str] = field(default_factory=dict)
    # The spec's path inside the jobs folder (the DAG bundle), which every worker holds,
    # though at a path of its own: what a restart on another worker resolves (starts.py)
    spec_in_jobs_folder: str | None = None

    def run_args(self) -> list[str]:
        """Arguments of the command (after `run`), without any credential."""
        args = [self.spec_path, "--root", self.root, "--run-token", self.run_token]
        if self.checkpoint_dir:
            args += ["--checkpoint-dir", self.checkpoint_dir]
        for key, value in sorted(self.overrides.items()):
            args += ["--set", f"{key}={value}"]
        for key, value in sorted(self.spark_conf.items()):
            args += ["--set", f"spark.conf.{key}={value}"]
        if self.from_checkpoint is not None:
            args += ["--from-checkpoint", str(self.from_checkpoint)]
        if self.from_savepoint is not None:
            args += ["--from-savepoint", str(self.from_savepoint)]
        if self.allow_rewind:
            args.append("--allow-rewind")
        if self.takeover:
            args.append("--takeover")
        if self.master:
            args += ["--master", self.master]
        return [*args, *self.extra_args]


@dataclass(frozen=True)
class LaunchedDriver:
    """The background process a launcher started (on this host)."""

    launcher: str
    pid: int
    host: str
    process_started_at: float | None
    log: str | None

    @classmethod
    def of_process(cls, launcher: str, pid: int, log: str | None) -> LaunchedDriver:
        return cls(launcher, pid, socket.gethostname(), process_started_at(pid), log)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Launcher(Protocol):
    """Starts a driver in the background and returns at once."""

    name: str

    def launch(self, request: LaunchRequest) -> LaunchedDriver:
        """Raises LaunchError naming the command's failure (never a credential)."""
        ...


# The driver runs the job's transformation, user code: it gets the variables a Python
# Spark driver needs, not the worker's (database URLs, cloud credential files, Airflow's
# own settings and secrets). `[streamkeeper] driver_env` adds names or patterns.
DRIVER_ENV_NAMES = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "HOSTNAME",
    "TMPDIR",
    "TMP",
    "TEMP",
    "TZ",
    "LANG",
    "LANGUAGE",
    "JAVA_HOME",
    "HADOOP_HOME",
    "HADOOP_CONF_DIR",
    "VIRTUAL_ENV",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONUNBUFFERED",
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONHASHSEED",
    "PYTHONIOENCODING",
    "PYTHONUTF8",
    "PYTHONWARNINGS",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
)
DRIVER_ENV_PREFIXES = ("LC_", "SPARK_", "PYSPARK_", "STREAMKEEPER_")
# The default AWS credential chain's pointers (web identity, container and instance
# credentials, profiles): never a key itself. Keys come from the connection only.
AWS_CHAIN_NAMES = (
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
    "AWS_ROLE_SESSION_NAME",
    "AWS_PROFILE",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CA_BUNDLE",
    "AWS_STS_REGIONAL_ENDPOINTS",
    "AWS_ENDPOINT_URL_STS",  # where web identity is exchanged: an endpoint, never a key
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
)
AWS_CHAIN_PREFIXES = ("AWS_CONTAINER_", "AWS_EC2_METADATA_")
# Keys the worker holds (a session's, with its token): the driver's when the connection
# gives none; a connection's key replaces them all (a token of another key is no use).
AWS_KEY_NAMES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def _passes(name: str, extra: tuple[str, ...]) -> bool:
    import fnmatch

    if name in DRIVER_ENV_NAMES or name.startswith(DRIVER_ENV_PREFIXES):
        return True
    if name in AWS_CHAIN_NAMES or name.startswith(AWS_CHAIN_PREFIXES):
        return True
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in extra)


def driver_environment(request: LaunchRequest, base: dict[str, str]) -> dict[str, str]:
    """The driver's environment: the allow-listed variables of the worker's (`base`),
    plus the storage settings of the connection (`request.env`, which replace any AWS_*
    of the worker's; without them the worker's AWS_* pass as they are). The default
    credential chain's pointers always pass; the worker's keys and session token pass
    unless the connection gives a key."""
    from streamkeeper_airflow import settings

    extra = settings.driver_env()
    keys_of_the_worker = "AWS_ACCESS_KEY_ID" not in request.env
    if request.env:
        env = {
            k: v
            for k, v in base.items()
            if _passes(k, extra) or (keys_of_the_worker and k in AWS_KEY_NAMES)
        }
    else:  # no connection settings: the worker's own storage settings are the driver's
        env = {k: v for k, v in base.items() if _passes(k, extra) or k.startswith("AWS_")}
    if env.get("PYTHONPATH"):  # the driver runs in another directory: anchor relative entries
        entries = env["PYTHONPATH"].split(os.pathsep)
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(e) if e else e for e in entries)
    env.update(request.env)
    return env


def detached_driver(stdout: str, job: str, secrets: list[str], hint: str = "") -> dict[str, Any]:
    """The `{"job", "pid", "log"}` line `streamkeeper run --detach` prints last.

    Raises:
        LaunchError: no such line (what was printed instead, redacted, and `hint`).
    """
    from streamkeeper_airflow.errors import LaunchError
    from streamkeeper_airflow.secrets import redact

    try:
        started = json.loads(stdout.strip().splitlines()[-1])
        return {**started, "pid": int(started["pid"])}
    except (IndexError, KeyError, TypeError, ValueError):
        raise LaunchError(
            f"`streamkeeper run --detach` printed no pid for job {job!r}: "
            f"{redact(stdout.strip()[-500:], secrets)!r}; expected a JSON line "
            '{"job", "pid", "log"}' + (f": {hint}" if hint else "")
        ) from None


def process_started_at(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None
