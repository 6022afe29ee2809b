"""Spark standalone cluster (one master, one worker) on 127.0.0.1."""

from __future__ import annotations

import json
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from infra.components.process import (
    HOST,
    LocalService,
    ServiceError,
    Stoppable,
    free_port,
    infra_dir,
    tcp_connects,
)
from tests.support.services.launch import base_env, find_executable


@dataclass
class SparkStandalone(Stoppable):
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
        ServiceError: If the cluster does not become ready in time (the
            message names the log files and includes their tails).
    """
    work_dir = Path(work_dir).resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    script = str(infra_dir() / "spark_standalone.sh")
    env = base_env()
    env.update(
        SPARK_LOCAL_IP=HOST,
        SPARK_CLASS=find_executable("spark-class"),
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
        master.wait_until_ready(lambda: tcp_connects(port), timeout=timeout)
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
