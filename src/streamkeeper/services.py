"""Start real local services (SeaweedFS S3, Spark standalone, NATS) for tests,
demos and benchmarks.

Every service is started from the scripts in ``<repo>/infra`` as its own
process group (``start_new_session=True``), bound to ``127.0.0.1`` only, with
its output in a log file. Stopping a service signals only that process group:
SIGTERM first, SIGKILL after a grace period.

Example:
    >>> s3 = start_seaweedfs(tmp / "s3", "lake", "key", "secret")  # doctest: +SKIP
    >>> try:
    ...     write_deltalake(f"s3://{s3.bucket}/t", df, storage_options=s3.env())
    ... finally:
    ...     s3.stop()

The infra directory is ``<repo>/infra`` (this module lives in
``<repo>/src/streamkeeper``); set ``STREAMKEEPER_INFRA_DIR`` to override it.
The binaries (``weed``, ``nats-server``, ``spark-class``) are looked up next
to the running Python interpreter first (a virtualenv's ``bin``), then on
``PATH``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

__all__ = [
    "HOST",
    "INFRA_DIR_ENV",
    "LocalService",
    "NatsServer",
    "SeaweedFS",
    "ServiceError",
    "SparkStandalone",
    "free_port",
    "infra_dir",
    "start_nats",
    "start_seaweedfs",
    "start_spark_standalone",
]

HOST = "127.0.0.1"
"""The only address any service binds to."""

INFRA_DIR_ENV = "STREAMKEEPER_INFRA_DIR"
"""Environment variable overriding the location of the infra scripts."""

_LOG_TAIL_CHARS = 4000

# SeaweedFS derives its internal ports from the S3 port (see infra/seaweedfs.sh).
_SEAWEED_HTTP_OFFSETS = (0, 1, 2, 3, 8)
_SEAWEED_GRPC_OFFSETS = (10001, 10002, 10003, 10007, 10008)
_SEAWEED_MAX_PORT = 55527
# Auto-picked S3 ports come from a range whose derived ports (up to +10008)
# stay below Linux's default ephemeral range (32768+), so outgoing
# connections cannot grab them between the check and the server's bind.
_SEAWEED_AUTO_RANGE = (15000, 22700)


class ServiceError(RuntimeError):
    """A local service failed to start or exited early."""


def infra_dir() -> Path:
    """Return the directory holding the service start scripts.

    Returns:
        ``$STREAMKEEPER_INFRA_DIR`` if set, else ``<repo>/infra``.
    """
    override = os.environ.get(INFRA_DIR_ENV)
    if override:
        return Path(override)
    return Path(__file__).resolve().parents[2] / "infra"


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago.

    Returns:
        A port number chosen by the kernel (bind to port 0).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


def _tcp_connects(port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=timeout):
            return True
    except OSError:
        return False


def _find_executable(name: str) -> str:
    """Find ``name`` beside the running interpreter, else on ``PATH``."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"executable {name!r} not found next to {sys.executable} or on PATH")
    return found


def _base_env() -> dict[str, str]:
    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", "")])
    return env


class LocalService:
    """One service process started from an infra script, in its own session.

    Args:
        name: Human-readable name used in messages.
        argv: Command line; ``argv[0]`` is usually an infra script.
        log_path: File receiving the process's stdout and stderr (appended).
        env: Environment of the process (default: this process's).
        cwd: Working directory of the process.

    Attributes:
        name: As given.
        argv: As given.
        log_path: As given.
        process: The ``Popen`` object once started, else ``None``.
        ready_seconds: Seconds from start until the readiness check passed,
            once ``wait_until_ready`` succeeded.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = [str(a) for a in argv]
        self.log_path = Path(log_path)
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.process: subprocess.Popen[bytes] | None = None
        self.ready_seconds: float | None = None
        self._pgid: int | None = None
        self._started_at = 0.0

    def start(self) -> Self:
        """Start the process in a new session (and so a new process group).

        Returns:
            ``self``, for chaining.

        Raises:
            RuntimeError: If the service was already started.
        """
        if self.process is not None:
            raise RuntimeError(f"{self.name} already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        # start_new_session makes the child a session and group leader.
        self._pgid = self.process.pid
        self._started_at = time.monotonic()
        return self

    @property
    def pid(self) -> int | None:
        """Process id of the started process, or ``None`` before start."""
        return self.process.pid if self.process is not None else None

    def is_running(self) -> bool:
        """Return whether the started process is still alive."""
        return self.process is not None and self.process.poll() is None

    def log_tail(self, max_chars: int = _LOG_TAIL_CHARS) -> str:
        """Return the end of the log file.

        Args:
            max_chars: How many characters at most.

        Returns:
            The last ``max_chars`` characters of the log, or ``""``.
        """
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-max_chars:].decode("utf-8", errors="replace")

    def failure(self, what: str) -> ServiceError:
        """Build an error about this service naming its log, with the log's tail.

        Args:
            what: What went wrong, e.g. ``"exited with code 1"``.

        Returns:
            The error (to be raised by the caller).
        """
        return ServiceError(
            f"{self.name} {what}; log file: {self.log_path}\n"
            f"--- last lines of {self.log_path} ---\n{self.log_tail()}"
        )

    def wait_until_ready(
        self,
        check: Callable[[], bool],
        timeout: float = 60.0,
        interval: float = 0.2,
    ) -> float:
        """Poll ``check`` until it returns true.

        Exceptions raised by ``check`` count as "not ready yet", except
        ``ServiceError``, which is raised at once (a probe may use it to report
        that a companion process died).

        Args:
            check: Readiness probe.
            timeout: Seconds to wait, counted from the call.
            interval: Seconds between probes.

        Returns:
            Seconds from the start of the process until it was ready.

        Raises:
            ServiceError: If the process exits or ``timeout`` passes first;
                the message names the log file and includes its tail.
                (``ServiceError`` is a ``RuntimeError``.)
        """
        if self.process is None:
            raise RuntimeError(f"{self.name} was not started")
        deadline = time.monotonic() + timeout
        while True:
            try:
                ok = bool(check())
            except ServiceError:
                raise
            except Exception:  # any probe error means "not ready yet"
                ok = False
            if ok:
                self.ready_seconds = time.monotonic() - self._started_at
                return self.ready_seconds
            code = self.process.poll()
            if code is not None:
                raise self.failure(f"exited with code {code} before it was ready")
            if time.monotonic() >= deadline:
                raise self.failure(f"was not ready within {timeout:.0f}s")
            time.sleep(interval)

    def stop(self, grace: float = 15.0) -> None:
        """Stop the process group this object started.

        Sends SIGTERM to the group, waits up to ``grace`` seconds for the
        process to exit, then sends SIGKILL to the group. Only the group
        created by ``start`` is signalled (its id is the started process's
        pid, which the kernel does not hand out again while any member of
        the group lives). Safe to call more than once.

        Args:
            grace: Seconds to wait between SIGTERM and SIGKILL.
        """
        if self.process is None or self._pgid is None:
            return
        pgid = self._pgid
        self._signal_group(pgid, signal.SIGTERM)
        try:
            self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        # Whatever is left of our group (the leader or its children) is killed.
        self._signal_group(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5.0)
        self._pgid = None

    @staticmethod
    def _signal_group(pgid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"LocalService(name={self.name!r}, pid={self.pid}, log={self.log_path})"


class _Stoppable:
    """Context-manager support for the service handles below."""

    def stop(self, grace: float = 15.0) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


# --------------------------------------------------------------------------
# SeaweedFS (S3)
# --------------------------------------------------------------------------


@dataclass
class SeaweedFS(_Stoppable):
    """A running SeaweedFS ``weed mini`` with its S3 gateway.

    Attributes:
        service: The managed process.
        port: S3 port on 127.0.0.1.
        bucket: Bucket created at start-up.
        access_key: The S3 access key the server accepts.
        secret_key: The matching secret key.
        data_dir: Where SeaweedFS keeps its data.
    """

    service: LocalService
    port: int
    bucket: str
    access_key: str
    secret_key: str = field(repr=False)
    data_dir: Path

    @property
    def endpoint_url(self) -> str:
        """S3 endpoint, ``http://127.0.0.1:PORT``."""
        return f"http://{HOST}:{self.port}"

    @property
    def ready_seconds(self) -> float | None:
        """Seconds the server took to become ready."""
        return self.service.ready_seconds

    def env(self) -> dict[str, str]:
        """Return S3 settings as environment variables / delta-rs options.

        The same dict works as ``os.environ`` additions for AWS SDKs and as
        ``storage_options`` for ``deltalake``.

        Returns:
            ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
            ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION`` and ``AWS_ALLOW_HTTP``.
        """
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        }

    def client(self, access_key: str | None = None, secret_key: str | None = None) -> Any:
        """Return a boto3 S3 client for this server.

        Args:
            access_key: Override the access key (e.g. to test rejection).
            secret_key: Override the secret key.

        Returns:
            A ``botocore`` S3 client using path-style addressing.
        """
        return _s3_client(
            self.endpoint_url,
            access_key if access_key is not None else self.access_key,
            secret_key if secret_key is not None else self.secret_key,
        )

    def stop(self, grace: float = 15.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``grace`` seconds).

        Args:
            grace: Seconds to wait between SIGTERM and SIGKILL.
        """
        self.service.stop(grace)


def _s3_client(endpoint_url: str, access_key: str, secret_key: str) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        region_name="us-east-1",
        config=Config(
            connect_timeout=2,
            read_timeout=10,
            retries={"max_attempts": 1, "mode": "standard"},
            s3={"addressing_style": "path"},
        ),
    )


def _seaweedfs_ports(port: int) -> list[int]:
    return [port + off for off in _SEAWEED_HTTP_OFFSETS + _SEAWEED_GRPC_OFFSETS]


def _pick_seaweedfs_port() -> int:
    low, high = _SEAWEED_AUTO_RANGE
    for _ in range(200):
        candidate = random.randint(low, high)
        if all(_port_is_free(p) for p in _seaweedfs_ports(candidate)):
            return candidate
    raise RuntimeError("no free block of ports for SeaweedFS found")


def start_seaweedfs(
    data_dir: Path,
    bucket: str,
    access_key: str,
    secret_key: str,
    port: int | None = None,
    timeout: float = 60.0,
) -> SeaweedFS:
    """Start SeaweedFS (``weed mini``) with an authenticated S3 gateway.

    The server accepts only requests signed with ``access_key`` /
    ``secret_key``. Besides ``port`` it uses ``port+1..port+8`` and
    ``port+10001..port+10008`` (see ``infra/seaweedfs.sh``).

    Args:
        data_dir: Data directory (created if missing); the log is
            ``data_dir/seaweedfs.log``.
        bucket: Bucket to create (3-63 characters).
        access_key: S3 access key to accept.
        secret_key: S3 secret key to accept.
        port: S3 port; by default a free block of ports is picked (and a
            start that loses a port race is retried with another block).
        timeout: Seconds to wait for the bucket to be reachable.

    Returns:
        The running server; call ``stop()`` when done.

    Raises:
        ServiceError: If the server does not become ready in time (a
            ``RuntimeError`` naming the log file, with the log's tail).
    """
    data_dir = Path(data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    env = _base_env()
    env.update(
        AWS_ACCESS_KEY_ID=access_key,
        AWS_SECRET_ACCESS_KEY=secret_key,
        WEED_BIN=_find_executable("weed"),
    )
    attempts = 1 if port is not None else 3
    last_error: ServiceError | None = None
    for _ in range(attempts):
        s3_port = port if port is not None else _pick_seaweedfs_port()
        if not 1024 <= s3_port <= _SEAWEED_MAX_PORT:
            raise ValueError(f"SeaweedFS S3 port must be in 1024..{_SEAWEED_MAX_PORT}")
        service = LocalService(
            "seaweedfs",
            [str(infra_dir() / "seaweedfs.sh"), str(data_dir), str(s3_port), bucket],
            data_dir / "seaweedfs.log",
            env=env,
            cwd=data_dir,
        ).start()
        server = SeaweedFS(service, s3_port, bucket, access_key, secret_key, data_dir)
        try:
            service.wait_until_ready(_bucket_probe(server), timeout=timeout)
        except ServiceError as exc:
            exited = not service.is_running()
            service.stop()
            if not exited:  # timed out: retrying would not help
                raise
            last_error = exc  # e.g. lost a race for a port: try other ports
            continue
        except BaseException:
            service.stop()
            raise
        return server
    assert last_error is not None
    raise last_error


def _bucket_probe(server: SeaweedFS, create_after: float = 5.0) -> Callable[[], bool]:
    """Probe: ``head_bucket`` succeeds; create the bucket if it stays 404."""
    from botocore.exceptions import ClientError

    client = server.client()
    first_missing: list[float] = []

    def check() -> bool:
        try:
            client.head_bucket(Bucket=server.bucket)
            return True
        except ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if status != 404 and code not in ("404", "NoSuchBucket", "NotFound"):
                return False
            if not first_missing:
                first_missing.append(time.monotonic())
            elif time.monotonic() - first_missing[0] >= create_after:
                with contextlib.suppress(ClientError):
                    client.create_bucket(Bucket=server.bucket)
            return False

    return check


# --------------------------------------------------------------------------
# Spark standalone
# --------------------------------------------------------------------------


@dataclass
class SparkStandalone(_Stoppable):
    """A running Spark standalone cluster: one master and one worker.

    Attributes:
        master: The master process.
        worker: The worker process.
        port: Master RPC port.
        webui_port: Master web UI port.
        work_dir: Logs and the worker's work directory live here.
    """

    master: LocalService
    worker: LocalService
    port: int
    webui_port: int
    work_dir: Path

    @property
    def master_url(self) -> str:
        """``spark://127.0.0.1:PORT``."""
        return f"spark://{HOST}:{self.port}"

    @property
    def webui_url(self) -> str:
        """Master web UI, ``http://127.0.0.1:WEBUI_PORT``."""
        return f"http://{HOST}:{self.webui_port}"

    @property
    def ready_seconds(self) -> float | None:
        """Seconds from the master's start until a worker was ALIVE."""
        return self.master.ready_seconds

    def state(self) -> dict[str, object]:
        """Return the master's cluster state (its ``/json/`` document)."""
        with urllib.request.urlopen(f"{self.webui_url}/json/", timeout=2) as resp:
            return json.loads(resp.read().decode("utf-8"))

    def stop(self, grace: float = 15.0) -> None:
        """Stop the worker, then the master (SIGTERM, then SIGKILL).

        Args:
            grace: Seconds to wait between SIGTERM and SIGKILL, per process.
        """
        self.worker.stop(grace)
        self.master.stop(grace)


def _spark_status(cluster: SparkStandalone) -> tuple[bool, int]:
    """Return (master is ALIVE, number of ALIVE workers)."""
    state = cluster.state()
    workers = state.get("workers", [])
    alive = (
        [w for w in workers if isinstance(w, dict) and w.get("state") == "ALIVE"]
        if isinstance(workers, list)
        else []
    )
    return state.get("status") == "ALIVE", len(alive)


def _spark_worker_probe(cluster: SparkStandalone) -> Callable[[], bool]:
    """Probe: the master is ALIVE with at least one ALIVE worker."""

    def check() -> bool:
        worker = cluster.worker
        if not worker.is_running():
            code = worker.process.poll() if worker.process else None
            raise worker.failure(f"exited with code {code}")
        master_alive, workers = _spark_status(cluster)
        return master_alive and workers >= 1

    return check


def start_spark_standalone(
    work_dir: Path,
    cores: int = 2,
    memory: str = "2g",
    timeout: float = 120.0,
) -> SparkStandalone:
    """Start a Spark standalone master and one worker on 127.0.0.1.

    Args:
        work_dir: Directory for logs (``spark-master.log``,
            ``spark-worker.log``) and the worker's work dir (``worker/``).
        cores: Cores the worker offers.
        memory: Memory the worker offers (e.g. ``"2g"``).
        timeout: Seconds to wait for one ALIVE worker.

    Returns:
        The running cluster; call ``stop()`` when done.

    Raises:
        ServiceError: If the cluster does not become ready in time (a
            ``RuntimeError`` naming the log files, with their tails).
    """
    work_dir = Path(work_dir).resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    script = str(infra_dir() / "spark_standalone.sh")
    env = _base_env()
    env.update(
        SPARK_LOCAL_IP=HOST,
        SPARK_CLASS=_find_executable("spark-class"),
        SPARK_WORKER_DIR=str(work_dir / "worker"),
        PYSPARK_PYTHON=env.get("PYSPARK_PYTHON", sys.executable),
    )
    port, webui_port, worker_webui_port = free_port(), free_port(), free_port()
    master = LocalService(
        "spark-master",
        [script, "master", str(port), str(webui_port)],
        work_dir / "spark-master.log",
        env=env,
        cwd=work_dir,
    ).start()
    cluster = SparkStandalone(
        master=master,
        worker=LocalService(
            "spark-worker",
            [
                script,
                "worker",
                f"spark://{HOST}:{port}",
                str(worker_webui_port),
                str(cores),
                memory,
            ],
            work_dir / "spark-worker.log",
            env=env,
            cwd=work_dir,
        ),
        port=port,
        webui_port=webui_port,
        work_dir=work_dir,
    )
    try:
        # Start the worker once the master's RPC port is open: a worker that
        # cannot reach the master backs off 5-15 s before it tries again. (The
        # master turns ALIVE about a second after binding the port, while the
        # worker's JVM needs several seconds before it first connects.)
        master.wait_until_ready(lambda: _tcp_connects(port), timeout=timeout)
        cluster.worker.start()
        try:
            master.wait_until_ready(_spark_worker_probe(cluster), timeout=timeout)
        except ServiceError as exc:
            raise ServiceError(
                f"{exc}\n--- last lines of {cluster.worker.log_path} ---\n"
                f"{cluster.worker.log_tail()}"
            ) from None
    except BaseException:
        cluster.stop()
        raise
    return cluster


# --------------------------------------------------------------------------
# NATS
# --------------------------------------------------------------------------


@dataclass
class NatsServer(_Stoppable):
    """A running NATS server with JetStream.

    Attributes:
        service: The managed process.
        port: Client port on 127.0.0.1.
        data_dir: Server directory: ``nats.log`` and the JetStream store
            ``jetstream/``.
    """

    service: LocalService
    port: int
    data_dir: Path

    @property
    def url(self) -> str:
        """``nats://127.0.0.1:PORT``."""
        return f"nats://{HOST}:{self.port}"

    @property
    def ready_seconds(self) -> float | None:
        """Seconds the server took to accept TCP connections."""
        return self.service.ready_seconds

    def stop(self, grace: float = 15.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``grace`` seconds).

        Args:
            grace: Seconds to wait between SIGTERM and SIGKILL.
        """
        self.service.stop(grace)


def _nats_probe(service: LocalService, port: int) -> Callable[[], bool]:
    return lambda: service.is_running() and _tcp_connects(port)


def start_nats(
    data_dir: Path,
    port: int | None = None,
    timeout: float = 30.0,
) -> NatsServer:
    """Start ``nats-server`` with JetStream on 127.0.0.1.

    Args:
        data_dir: Server directory (created if missing): the log is
            ``data_dir/nats.log``, the JetStream store ``data_dir/jetstream``.
        port: Client port; a free one by default (a start that loses a
            port race is retried with another port).
        timeout: Seconds to wait for the port to accept connections.

    Returns:
        The running server; call ``stop()`` when done.

    Raises:
        ServiceError: If the server does not become ready in time (a
            ``RuntimeError`` naming the log file, with the log's tail).
    """
    data_dir = Path(data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    env = _base_env()
    env["NATS_SERVER_BIN"] = _find_executable("nats-server")
    attempts = 1 if port is not None else 3
    last_error: ServiceError | None = None
    for _ in range(attempts):
        nats_port = port if port is not None else free_port()
        service = LocalService(
            "nats-server",
            [str(infra_dir() / "nats.sh"), str(data_dir / "jetstream"), str(nats_port)],
            data_dir / "nats.log",
            env=env,
            cwd=data_dir,
        ).start()
        try:
            service.wait_until_ready(_nats_probe(service, nats_port), timeout=timeout)
        except ServiceError as exc:
            exited = not service.is_running()
            service.stop()
            if not exited:  # timed out: retrying would not help
                raise
            last_error = exc  # e.g. lost a race for a port: try other ports
            continue
        except BaseException:
            service.stop()
            raise
        return NatsServer(service, nats_port, data_dir)
    assert last_error is not None
    raise last_error
