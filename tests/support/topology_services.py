"""The services of a multi-host topology, each bound to its own host's address only.

Each namespace has its own ports, so services keep their usual fixed ports (S3 8333,
NATS 4222, Spark 7077) without clashing with a test running beside them on the machine.
Readiness is probed from the test process, through the topology's uplink: as a client on
another host would see it.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.services.launch import base_env, find_executable
from tests.support.topology import Topology

S3_PORT = 8333
NATS_PORT = 4222
SPARK_PORT = 7077
SPARK_UI_PORT = 8080
# Short-lived JVMs on 2 cores: the C1 compiler only and a serial GC leave the CPU to the job.
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


class ServiceNotReady(RuntimeError):
    """A service did not come up in time, or its process exited."""


def wait_for(what: str, check: Callable[[], bool], log: Path, timeout: float = 90.0) -> float:
    """Poll `check` (an exception means not yet); the seconds it took."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            if check():
                return time.monotonic() - started
        except Exception:  # noqa: BLE001 - not ready yet
            pass
        time.sleep(0.2)
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    raise ServiceNotReady(f"{what} not ready within {timeout:.0f}s; {log}:\n{tail}")


def connects(address: str, port: int) -> bool:
    with socket.create_connection((address, port), timeout=1):
        return True


@dataclass(frozen=True)
class S3Service:
    endpoint_url: str
    bucket: str
    access_key: str
    secret_key: str

    def env(self) -> dict[str, str]:
        """The AWS_* variables a driver, an executor or the test itself uses."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        }

    def client(self) -> Any:
        from tests.support.services.seaweedfs import _s3_client

        return _s3_client(self.endpoint_url, self.access_key, self.secret_key)


def start_seaweedfs(topology: Topology, host: str, data_dir: Path, bucket: str) -> S3Service:
    """`weed mini` (S3 on port 8333) on `host`, as infra/seaweedfs.sh starts it locally."""
    address = topology.address(host)
    data_dir.mkdir(parents=True, exist_ok=True)
    service = S3Service(f"http://{address}:{S3_PORT}", bucket, "sk-topology", "sk-topology-secret")
    env = {**base_env(), **service.env()}
    argv = [
        find_executable("weed"),
        "mini",
        f"-dir={data_dir}",
        f"-ip={address}",
        f"-ip.bind={address}",
        "-webdav=false",
        "-admin.ui=false",
        f"-bucket={bucket}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-master.telemetry=false",
        *_private_seaweedfs_sockets(topology, data_dir),
    ]
    log = data_dir / "seaweedfs.log"
    topology.run(host, argv, env=env, log=log, cwd=data_dir)
    client = service.client()
    wait_for("SeaweedFS", lambda: bool(client.head_bucket(Bucket=bucket)), log)
    return service


def _private_seaweedfs_sockets(topology: Topology, data_dir: Path) -> list[str]:
    """SeaweedFS also listens on Unix sockets named by port, `/tmp/seaweedfs-<service>-
    <port>.sock`, and its clients dial such a socket, if the file exists, instead of the
    address they were given. Namespaces share the filesystem: two topologies running at
    once (pytest -n 2) with the default ports would serve each other's requests (seen: one
    run's S3 gateway storing chunks on the other's volume server, unreachable). Its gRPC
    ports are therefore the run's own (from its subnet, unique among live runs), and its
    other sockets live in its data folder."""
    base = 20000 + 10 * int(str(topology.subnet.network_address).split(".")[2])
    grpc = {"master": 0, "volume": 1, "filer": 2, "s3": 3, "admin": 4}
    flags = [f"-{service}.port.grpc={base + offset}" for service, offset in grpc.items()]
    return [
        *flags,
        f"-filer.localSocket={data_dir / 'filer.sock'}",
        f"-s3.localSocket={data_dir / 's3.sock'}",
    ]


def start_nats(topology: Topology, host: str, data_dir: Path) -> str:
    """nats-server with JetStream on `host`; its URL."""
    address = topology.address(host)
    data_dir.mkdir(parents=True, exist_ok=True)
    argv = [find_executable("nats-server"), "-js", "-a", address, "-p", str(NATS_PORT)]
    log = data_dir / "nats.log"
    topology.run(host, [*argv, "-sd", str(data_dir / "jetstream")], log=log, cwd=data_dir)
    wait_for("NATS", lambda: connects(address, NATS_PORT), log)
    return f"nats://{address}:{NATS_PORT}"


def spark_env(address: str) -> dict[str, str]:
    """What every Spark process on a host needs: its address (never 0.0.0.0, never a
    hostname: every namespace shares the machine's), and this interpreter for Python."""
    env = base_env()
    repo = str(Path(__file__).resolve().parents[2])
    paths = [repo, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env.update(
        SPARK_LOCAL_IP=address,
        SPARK_LOCAL_HOSTNAME=address,
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        PYTHONPATH=os.pathsep.join(dict.fromkeys(paths)),
    )
    return env


def start_spark_master(topology: Topology, host: str, work_dir: Path) -> str:
    """A standalone master on `host`; its URL."""
    address = topology.address(host)
    env = spark_env(address)
    env["SPARK_MASTER_OPTS"] = "-Dspark.master.rest.enabled=false"
    env["SPARK_DAEMON_JAVA_OPTS"] = QUICK_JVM
    argv = [find_executable("spark-class"), "org.apache.spark.deploy.master.Master"]
    argv += ["--host", address, "--port", str(SPARK_PORT), "--webui-port", str(SPARK_UI_PORT)]
    log = work_dir / f"{host}.log"
    topology.run(host, argv, env=env, log=log, cwd=work_dir)
    wait_for("Spark master", lambda: connects(address, SPARK_PORT), log)
    return f"spark://{address}:{SPARK_PORT}"


def start_spark_worker(
    topology: Topology,
    host: str,
    master_url: str,
    work_dir: Path,
    cores: int = 1,
    memory: str = "1g",
) -> None:
    """A standalone worker on `host`; its executors are its children, so on `host` too."""
    address = topology.address(host)
    argv = [find_executable("spark-class"), "org.apache.spark.deploy.worker.Worker"]
    argv += ["--host", address, "--webui-port", "8081", "--cores", str(cores), "--memory", memory]
    argv += ["--work-dir", str(work_dir / host), master_url]
    env = {**spark_env(address), "SPARK_DAEMON_JAVA_OPTS": QUICK_JVM}
    topology.run(host, argv, env=env, log=work_dir / f"{host}.log", cwd=work_dir)


def alive_workers(master_address: str) -> list[str]:
    """The hosts of the master's ALIVE workers (its /json/ document)."""
    url = f"http://{master_address}:{SPARK_UI_PORT}/json/"
    with urllib.request.urlopen(url, timeout=2) as response:
        state = json.loads(response.read())
    return sorted(w["host"] for w in state.get("workers", []) if w.get("state") == "ALIVE")
