"""Integration tests: each real local service starts in tmp_path and works."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.services import (
    LocalService,
    NatsServer,
    SeaweedFS,
    ServiceError,
    SparkStandalone,
    free_port,
    infra_dir,
    start_nats,
    start_seaweedfs,
    start_spark_standalone,
)

pytestmark = pytest.mark.integration

ACCESS_KEY = "streamkeeper-test"
SECRET_KEY = "streamkeeper-test-secret"
BUCKET = "lake"


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


# --------------------------------------------------------------------------
# LocalService itself
# --------------------------------------------------------------------------


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_infra_dir_has_scripts() -> None:
    for name in ("seaweedfs.sh", "spark_standalone.sh", "nats.sh"):
        assert os.access(infra_dir() / name, os.X_OK), name


def test_infra_dir_env_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("STREAMKEEPER_INFRA_DIR", str(tmp_path))
    assert infra_dir() == tmp_path


def test_local_service_timeout_names_log_and_stop_kills_group(tmp_path: Path) -> None:
    log = tmp_path / "svc.log"
    # The shell starts a child in the same process group; stop() must end both.
    service = LocalService(
        "sleeper",
        ["bash", "-c", "echo hello-from-sleeper; sleep 300 & wait"],
        log,
    ).start()
    try:
        with pytest.raises(ServiceError) as info:
            service.wait_until_ready(lambda: False, timeout=0.5)
        assert str(log) in str(info.value)
        assert "hello-from-sleeper" in str(info.value)
        assert isinstance(info.value, RuntimeError)
    finally:
        service.stop(grace=2.0)
    assert not service.is_running()
    assert _live_group_members(service.pid) == []  # type: ignore[arg-type]


def _listen_addresses(pgid: int) -> set[str]:
    """Local IPs of the listening TCP sockets of processes in group ``pgid``."""
    import psutil

    addresses: set[str] = set()
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) != pgid:
                continue
            for conn in proc.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    addresses.add(conn.laddr.ip)
        except (ProcessLookupError, psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return addresses


LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1"}


def _live_group_members(pgid: int, settle: float = 5.0) -> list[int]:
    """Pids of non-zombie processes in group ``pgid`` (after letting them die)."""
    import psutil

    deadline = time.monotonic() + settle
    while True:
        members = []
        for proc in psutil.process_iter(["pid", "status"]):
            try:
                if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                    members.append(proc.pid)
            except (ProcessLookupError, psutil.NoSuchProcess):
                continue
        if not members or time.monotonic() > deadline:
            return members
        time.sleep(0.1)


def test_local_service_early_exit_is_reported(tmp_path: Path) -> None:
    service = LocalService("failing", ["bash", "-c", "echo boom; exit 3"], tmp_path / "f.log")
    service.start()
    try:
        with pytest.raises(ServiceError, match="exited with code 3(.|\n)*boom"):
            service.wait_until_ready(lambda: False, timeout=30)
    finally:
        service.stop()


# --------------------------------------------------------------------------
# SeaweedFS
# --------------------------------------------------------------------------


@pytest.fixture
def seaweedfs(tmp_path: Path) -> Iterator[SeaweedFS]:
    server = start_seaweedfs(tmp_path / "seaweedfs", BUCKET, ACCESS_KEY, SECRET_KEY)
    try:
        yield server
    finally:
        server.stop()
    assert _live_group_members(server.service.pid) == []  # type: ignore[arg-type]


@pytest.mark.s3
def test_seaweedfs_put_get(seaweedfs: SeaweedFS) -> None:
    assert seaweedfs.endpoint_url == f"http://127.0.0.1:{seaweedfs.port}"
    client = seaweedfs.client()
    client.put_object(Bucket=BUCKET, Key="dir/hello.txt", Body=b"hello world")
    body = client.get_object(Bucket=BUCKET, Key="dir/hello.txt")["Body"].read()
    assert body == b"hello world"
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=BUCKET)["Contents"]]
    assert keys == ["dir/hello.txt"]


@pytest.mark.s3
def test_seaweedfs_rejects_bad_credentials(seaweedfs: SeaweedFS) -> None:
    from botocore import UNSIGNED
    from botocore.config import Config
    from botocore.exceptions import ClientError

    seaweedfs.client().put_object(Bucket=BUCKET, Key="secret.txt", Body=b"x")
    bad_clients = [
        seaweedfs.client(secret_key="wrong-secret"),
        seaweedfs.client(access_key="nobody", secret_key="whatever"),
    ]
    for client in bad_clients:
        with pytest.raises(ClientError) as info:
            client.get_object(Bucket=BUCKET, Key="secret.txt")
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
        with pytest.raises(ClientError):
            client.put_object(Bucket=BUCKET, Key="evil.txt", Body=b"x")

    import boto3

    anonymous = boto3.client(
        "s3",
        endpoint_url=seaweedfs.endpoint_url,
        region_name="us-east-1",
        config=Config(signature_version=UNSIGNED, s3={"addressing_style": "path"}),
    )
    with pytest.raises(ClientError):
        anonymous.get_object(Bucket=BUCKET, Key="secret.txt")


@pytest.mark.s3
def test_seaweedfs_env_and_binding(seaweedfs: SeaweedFS) -> None:
    env = seaweedfs.env()
    assert env == {
        "AWS_ENDPOINT_URL": seaweedfs.endpoint_url,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
    }
    # Internal ports derive from the S3 port (infra/seaweedfs.sh).
    for offset in (1, 2, 3, 8, 10001, 10002, 10003, 10007, 10008):
        assert _listening(seaweedfs.port + offset), offset
    addresses = _listen_addresses(seaweedfs.service.pid)  # type: ignore[arg-type]
    assert addresses and addresses <= LOOPBACK


@pytest.mark.s3
def test_seaweedfs_deltalake_roundtrip(seaweedfs: SeaweedFS) -> None:
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    uri = f"s3://{BUCKET}/t"
    options = seaweedfs.env()
    data = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "name": ["a", "b", "c"]})
    write_deltalake(uri, data, storage_options=options)
    write_deltalake(
        uri,
        pa.table({"id": pa.array([4], pa.int64()), "name": ["d"]}),
        mode="append",
        storage_options=options,
    )

    table = DeltaTable(uri, storage_options=options)
    assert table.version() == 1
    result = table.to_pyarrow_table().sort_by("id")
    assert result.column("id").to_pylist() == [1, 2, 3, 4]
    assert result.column("name").to_pylist() == ["a", "b", "c", "d"]

    listed = seaweedfs.client().list_objects_v2(Bucket=BUCKET, Prefix="t/_delta_log/")
    assert any(o["Key"].endswith("00000000000000000001.json") for o in listed["Contents"])


@pytest.mark.s3
def test_two_seaweedfs_side_by_side(tmp_path: Path, seaweedfs: SeaweedFS) -> None:
    other = start_seaweedfs(tmp_path / "other", "other-bucket", "k2", "s2-secret")
    try:
        assert other.port != seaweedfs.port
        other.client().put_object(Bucket="other-bucket", Key="x", Body=b"2")
        seaweedfs.client().put_object(Bucket=BUCKET, Key="x", Body=b"1")
        assert other.client().get_object(Bucket="other-bucket", Key="x")["Body"].read() == b"2"
        assert seaweedfs.client().get_object(Bucket=BUCKET, Key="x")["Body"].read() == b"1"
    finally:
        other.stop()
    assert not other.service.is_running()
    assert not _listening(other.port)


# --------------------------------------------------------------------------
# Spark standalone
# --------------------------------------------------------------------------


@pytest.fixture
def spark_cluster(tmp_path: Path) -> Iterator[SparkStandalone]:
    cluster = start_spark_standalone(tmp_path / "spark", cores=2, memory="2g")
    try:
        yield cluster
    finally:
        cluster.stop()
    for service in (cluster.master, cluster.worker):
        assert _live_group_members(service.pid) == []  # type: ignore[arg-type]


@pytest.mark.cluster
def test_spark_standalone_runs_a_job(
    spark_cluster: SparkStandalone, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyspark.sql import SparkSession

    assert spark_cluster.master_url == f"spark://127.0.0.1:{spark_cluster.port}"
    for service in (spark_cluster.master, spark_cluster.worker):
        addresses = _listen_addresses(service.pid)  # type: ignore[arg-type]
        assert addresses and addresses <= LOOPBACK
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    # Earlier tests in this process may have left a local session; getOrCreate would reuse it.
    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()
    spark = (
        SparkSession.builder.master(spark_cluster.master_url)
        .appName("streamkeeper-services-test")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.executor.memory", "1g")
        .config("spark.cores.max", "2")
        .getOrCreate()
    )
    try:
        assert spark.sparkContext.master == spark_cluster.master_url
        assert spark.range(100).selectExpr("sum(id)").collect()[0][0] == 4950
        # A Python UDF proves executors can start Python workers too.
        total = spark.sparkContext.parallelize(range(10), 2).map(lambda x: x * 2).sum()
        assert total == 90
        apps = spark_cluster.state()["activeapps"]
        assert isinstance(apps, list) and len(apps) == 1
    finally:
        spark.stop()


# --------------------------------------------------------------------------
# NATS
# --------------------------------------------------------------------------


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    server = start_nats(tmp_path / "nats")
    try:
        yield server
    finally:
        server.stop()
    assert _live_group_members(server.service.pid) == []  # type: ignore[arg-type]


def test_nats_jetstream_publish_fetch(nats_server: NatsServer) -> None:
    import nats

    assert nats_server.url == f"nats://127.0.0.1:{nats_server.port}"
    addresses = _listen_addresses(nats_server.service.pid)  # type: ignore[arg-type]
    assert addresses and addresses <= LOOPBACK

    async def scenario() -> list[bytes]:
        nc = await nats.connect(nats_server.url, connect_timeout=5, max_reconnect_attempts=0)
        try:
            js = nc.jetstream()
            await js.add_stream(name="EVENTS", subjects=["events.>"])
            ack = await js.publish("events.created", b"payload-1")
            assert ack.stream == "EVENTS" and ack.seq == 1
            sub = await js.pull_subscribe("events.>", durable="reader")
            msgs = await sub.fetch(1, timeout=5)
            for msg in msgs:
                await msg.ack()
            return [m.data for m in msgs]
        finally:
            await nc.close()

    assert asyncio.run(scenario()) == [b"payload-1"]
    assert (nats_server.data_dir / "jetstream").is_dir()


@pytest.mark.s3
def test_seaweedfs_readiness_probe_creates_missing_bucket(seaweedfs: SeaweedFS) -> None:
    from dataclasses import replace

    from tests.support.services.seaweedfs import _bucket_probe

    late = replace(seaweedfs, bucket="late-bucket")
    probe = _bucket_probe(late, create_after=0.2)
    deadline = time.monotonic() + 10
    while not probe():
        assert time.monotonic() < deadline, "bucket was not created"
        time.sleep(0.1)
    names = {b["Name"] for b in seaweedfs.client().list_buckets()["Buckets"]}
    assert names == {BUCKET, "late-bucket"}
    # With a wrong secret the probe never succeeds (and never creates anything).
    assert not _bucket_probe(replace(seaweedfs, bucket="x-bucket", secret_key="bad"), 0)()
