"""The S3 fault proxy, between real clients (boto3, delta-rs, pyarrow) and a real SeaweedFS."""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.s3_proxy import Fault, FaultPlan, S3FaultProxy

pytestmark = pytest.mark.s3

NO_RETRIES = {"total_max_attempts": 1}


@pytest.fixture
def proxy(seaweed: Any) -> Iterator[S3FaultProxy]:
    with S3FaultProxy(f"127.0.0.1:{seaweed.port}") as running:
        yield running


@pytest.fixture
def prefix() -> str:
    return f"proxy-{uuid.uuid4().hex[:12]}"


def _client(proxy: S3FaultProxy, seaweed: Any, retries: dict[str, Any] | None = None) -> Any:
    """A boto3 client that talks to SeaweedFS through the proxy."""
    import boto3
    from botocore.config import Config

    options: dict[str, Any] = {"s3": {"addressing_style": "path"}}
    if retries is not None:
        options["retries"] = retries
    return boto3.client(
        "s3",
        endpoint_url=proxy.endpoint_url,
        aws_access_key_id=seaweed.access_key,
        aws_secret_access_key=seaweed.secret_key,
        region_name="us-east-1",
        config=Config(**options),
    )


def _exists(seaweed: Any, key: str) -> bool:
    """Ask SeaweedFS directly, bypassing the proxy."""
    from botocore.exceptions import ClientError

    try:
        seaweed.client().head_object(Bucket=seaweed.bucket, Key=key)
    except ClientError as exc:
        if exc.response["ResponseMetadata"]["HTTPStatusCode"] == 404:
            return False
        raise
    return True


def _direct_get(seaweed: Any, key: str) -> bytes:
    return seaweed.client().get_object(Bucket=seaweed.bucket, Key=key)["Body"].read()


# --------------------------------------------------------------------------
# 1. Transparent with no faults
# --------------------------------------------------------------------------


def test_boto3_put_get_list_delete(proxy: S3FaultProxy, seaweed: Any, prefix: str) -> None:
    client = _client(proxy, seaweed)
    bucket = seaweed.bucket
    for i in range(3):
        client.put_object(Bucket=bucket, Key=f"{prefix}/k{i}", Body=f"value {i}".encode())
    assert client.get_object(Bucket=bucket, Key=f"{prefix}/k1")["Body"].read() == b"value 1"
    assert client.head_object(Bucket=bucket, Key=f"{prefix}/k2")["ContentLength"] == 7
    listed = client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/")
    assert [o["Key"] for o in listed["Contents"]] == [f"{prefix}/k{i}" for i in range(3)]
    client.delete_object(Bucket=bucket, Key=f"{prefix}/k0")
    assert not _exists(seaweed, f"{prefix}/k0")
    assert _direct_get(seaweed, f"{prefix}/k2") == b"value 2"

    stats = proxy.stats()
    assert stats["forwarded"] == stats["requests"] >= 7
    # boto3 keeps its connection alive: many requests, few connections.
    assert stats["connections"] < stats["requests"]


def test_boto3_multipart_upload(
    proxy: S3FaultProxy, seaweed: Any, prefix: str, tmp_path: Path
) -> None:
    data = os.urandom(9 * 1024 * 1024 + 123)  # above boto3's 8 MiB multipart threshold
    source = tmp_path / "big.bin"
    source.write_bytes(data)
    client = _client(proxy, seaweed)
    client.upload_file(str(source), seaweed.bucket, f"{prefix}/big.bin")

    target = tmp_path / "back.bin"
    client.download_file(seaweed.bucket, f"{prefix}/big.bin", str(target))
    assert target.read_bytes() == data
    assert _direct_get(seaweed, f"{prefix}/big.bin") == data
    # Create, two parts and complete went through the proxy (plus head and get).
    assert proxy.stats()["forwarded"] >= 4


def test_deltalake_write_and_read(
    proxy: S3FaultProxy,
    seaweed: Any,
    s3_env: dict[str, str],
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    # As a driver subprocess would be routed: through the environment, too.
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint_url)
    options = {
        **s3_env,
        "AWS_ENDPOINT_URL": proxy.endpoint_url,
        "AWS_ALLOW_HTTP": "true",
        "AWS_S3_LOCKING_PROVIDER": "none",
        "AWS_CONDITIONAL_PUT": "etag",
    }
    uri = f"s3://{seaweed.bucket}/{prefix}/table"
    first = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "name": ["a", "b", "c"]})
    write_deltalake(uri, first, storage_options=options)
    second = pa.table({"id": pa.array([4], pa.int64()), "name": ["d"]})
    write_deltalake(uri, second, mode="append", storage_options=options)

    table = DeltaTable(uri, storage_options=options)
    assert table.version() == 1
    result = table.to_pyarrow_dataset().to_table(use_threads=False).sort_by("id")
    assert result.column("id").to_pylist() == [1, 2, 3, 4]
    assert result.column("name").to_pylist() == ["a", "b", "c", "d"]
    assert _exists(seaweed, f"{prefix}/table/_delta_log/00000000000000000001.json")
    assert proxy.stats()["forwarded"] > 0


def test_pyarrow_s3filesystem_parquet(proxy: S3FaultProxy, seaweed: Any, prefix: str) -> None:
    import pyarrow as pa
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    fs = pafs.S3FileSystem(
        access_key=seaweed.access_key,
        secret_key=seaweed.secret_key,
        region="us-east-1",
        endpoint_override=f"127.0.0.1:{proxy.port}",
        scheme="http",
    )
    # Incompressible and large enough for a multipart upload with bodies over 1 MB.
    blobs = [os.urandom(8192) for _ in range(1500)]
    table = pa.table({"id": pa.array(range(1500), pa.int64()), "blob": blobs})
    path = f"{seaweed.bucket}/{prefix}/data.parquet"
    pq.write_table(table, path, filesystem=fs, compression="none", use_dictionary=False)
    assert pq.read_table(path, filesystem=fs).equals(table)
    assert fs.get_file_info(path).size > 10 * 1024 * 1024
    assert _exists(seaweed, f"{prefix}/data.parquet")
    assert proxy.stats()["forwarded"] > 0


def test_raw_chunked_keep_alive_and_stop(seaweed: Any) -> None:
    """Framing below the clients: a chunked request, then another on the same connection."""
    import http.client

    proxy = S3FaultProxy(f"127.0.0.1:{seaweed.port}").start()
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    # Unsigned, so SeaweedFS refuses it; what matters is that both answers arrive.
    conn.request("PUT", f"/{seaweed.bucket}/raw", body=iter([b"abc", b"def"]), encode_chunked=True)
    first = conn.getresponse()
    assert first.status == 403
    first.read()
    conn.request("HEAD", f"/{seaweed.bucket}/raw")
    second = conn.getresponse()
    assert second.status in (403, 404)
    assert second.read() == b""
    conn.close()
    assert proxy.stats()["connections"] == 1
    assert proxy.stats()["forwarded"] == 2

    proxy.stop()
    proxy.stop()  # idempotent
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=2)


# --------------------------------------------------------------------------
# 2-4. Each fault alone
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "status", "code"),
    [("error_503", 503, "SlowDown"), ("error_500", 500, "InternalError")],
)
def test_error_is_answered_without_applying(
    proxy: S3FaultProxy, seaweed: Any, prefix: str, kind: str, status: int, code: str
) -> None:
    from botocore.exceptions import ClientError

    client = _client(proxy, seaweed, NO_RETRIES)
    key = f"{prefix}/never"
    proxy.set_faults(FaultPlan([Fault(kind, 1.0)]))
    with pytest.raises(ClientError) as info:
        client.put_object(Bucket=seaweed.bucket, Key=key, Body=b"lost")
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == status
    assert info.value.response["Error"]["Code"] == code
    with pytest.raises(ClientError) as head_info:  # HEAD: an error without a body
        client.head_object(Bucket=seaweed.bucket, Key=key)
    assert head_info.value.response["ResponseMetadata"]["HTTPStatusCode"] == status

    assert not _exists(seaweed, key)
    stats = proxy.stats()
    assert stats[kind] == 2
    assert stats["forwarded"] == 0

    proxy.clear_faults()
    client.put_object(Bucket=seaweed.bucket, Key=key, Body=b"now")
    assert _direct_get(seaweed, key) == b"now"


def test_reset_after_apply_loses_the_response_not_the_write(
    proxy: S3FaultProxy, seaweed: Any, prefix: str
) -> None:
    from botocore.exceptions import ConnectionClosedError

    client = _client(proxy, seaweed, NO_RETRIES)
    key = f"{prefix}/landed"
    proxy.set_faults(FaultPlan([Fault("reset_after_apply", 1.0, methods={"PUT"})]))
    with pytest.raises(ConnectionClosedError):
        client.put_object(Bucket=seaweed.bucket, Key=key, Body=b"applied anyway")

    assert _direct_get(seaweed, key) == b"applied anyway"
    # Only PUTs are reset: a GET through the same client still gets its answer.
    assert client.get_object(Bucket=seaweed.bucket, Key=key)["Body"].read() == b"applied anyway"
    stats = proxy.stats()
    assert stats["reset_after_apply"] == 1
    assert stats["forwarded"] == 2


def test_reset_is_a_tcp_reset(proxy: S3FaultProxy, seaweed: Any) -> None:
    proxy.set_faults(FaultPlan([Fault("reset_after_apply", 1.0)]))
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        sock.sendall(f"GET /{seaweed.bucket}/x HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        with pytest.raises(ConnectionResetError):  # a FIN would read b"" instead
            sock.recv(1024)
    assert proxy.stats()["reset_after_apply"] == 1


def test_latency_delays_matching_requests(proxy: S3FaultProxy, seaweed: Any, prefix: str) -> None:
    client = _client(proxy, seaweed, NO_RETRIES)
    key = f"{prefix}/slow"
    client.put_object(Bucket=seaweed.bucket, Key=key, Body=b"x")

    proxy.set_faults(FaultPlan([Fault("latency", 1.0, methods={"GET"}, latency_ms=400)]))
    started = time.monotonic()
    assert client.get_object(Bucket=seaweed.bucket, Key=key)["Body"].read() == b"x"
    assert time.monotonic() - started >= 0.4

    proxy.set_faults(FaultPlan([Fault("latency", 1.0, path=r"/slow$", latency_ms=(250, 300))]))
    started = time.monotonic()
    client.head_object(Bucket=seaweed.bucket, Key=key)
    assert time.monotonic() - started >= 0.25
    assert proxy.stats()["latency"] == 2


def test_unreachable_upstream_answers_502(seaweed: Any) -> None:
    from botocore.exceptions import ClientError

    from tests.support.services import free_port

    with S3FaultProxy(f"127.0.0.1:{free_port()}") as proxy:
        client = _client(proxy, seaweed, NO_RETRIES)
        with pytest.raises(ClientError) as info:
            client.get_object(Bucket=seaweed.bucket, Key="anything")
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 502
        assert proxy.stats()["upstream_errors"] == 1


# --------------------------------------------------------------------------
# 5. Mixed faults, default retries
# --------------------------------------------------------------------------


def _eventually(call: Any, *args: Any, attempts: int = 5, **kwargs: Any) -> tuple[Any, int]:
    """Retry a call the way an application would once boto3 gives up; return (result, tries)."""
    from botocore.exceptions import BotoCoreError, ClientError

    for attempt in range(1, attempts + 1):
        try:
            return call(*args, **kwargs), attempt
        except (BotoCoreError, ClientError):
            if attempt == attempts:
                raise
    raise AssertionError("unreachable")


def _read(client: Any, bucket: str, key: str) -> bytes:
    return client.get_object(Bucket=bucket, Key=key)["Body"].read()


# Each key is a PUT and a GET through 30 % 503s and 20 % lost answers, under boto3's
# default back-off (sleeps of up to seconds): 20 keys see every fault many times over.
MIXED_KEYS = 20


def test_mixed_faults_with_default_retries(proxy: S3FaultProxy, seaweed: Any, prefix: str) -> None:
    client = _client(proxy, seaweed)  # boto3's default retry policy
    bucket = seaweed.bucket
    proxy.set_faults(
        FaultPlan([Fault("error_503", 0.3), Fault("reset_after_apply", 0.2)], seed=20240501)
    )
    app_retries = 0  # calls boto3 gave up on, retried by the loop
    for i in range(MIXED_KEYS):
        key, value = f"{prefix}/k{i:02d}", f"value {i}".encode()
        _, put_tries = _eventually(client.put_object, Bucket=bucket, Key=key, Body=value)
        body, get_tries = _eventually(_read, client, bucket, key)
        assert body == value
        app_retries += put_tries + get_tries - 2
    proxy.clear_faults()

    for i in range(MIXED_KEYS):
        assert _direct_get(seaweed, f"{prefix}/k{i:02d}") == f"value {i}".encode()
    stats = proxy.stats()
    assert stats["error_503"] > 0
    assert stats["reset_after_apply"] > 0
    assert stats["requests"] >= 2 * MIXED_KEYS + stats["error_503"] + stats["reset_after_apply"]
    print(f"mixed faults: {stats}, application-level retries: {app_retries}")


# --------------------------------------------------------------------------
# 6. Bad configuration
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Fault("error_503", 1.5), r"probability 1\.5 is outside 0\.\.1"),
        (lambda: Fault("error_503", -0.1), r"probability -0\.1 is outside 0\.\.1"),
        (lambda: Fault("error_503", 0.5, methods={"PUT", "FETCH"}), r"\['FETCH'\].*use some of"),
        (lambda: Fault("error_503", 0.5, path="(unclosed"), r"'\(unclosed' does not compile"),
        (lambda: Fault("timeout", 0.5), r"unknown fault kind 'timeout'; use one of"),
        (lambda: Fault("latency", 0.5), r"needs latency_ms"),
        (lambda: Fault("latency", 0.5, latency_ms=(300, 100)), r"low <= high"),
        (lambda: Fault("error_500", 0.5, latency_ms=10), r"only for kind 'latency'"),
        (lambda: S3FaultProxy("localhost"), r"'localhost' is not host:port"),
        (lambda: S3FaultProxy("127.0.0.1:1", port=70000), r"70000 is outside 0\.\.65535"),
    ],
)
def test_bad_configuration_is_refused_clearly(build: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


def test_busy_port_and_wrong_plan_type(proxy: S3FaultProxy) -> None:
    with pytest.raises(RuntimeError, match=r"cannot listen on .*give port=0"):
        S3FaultProxy("127.0.0.1:1", port=proxy.port).start()
    with pytest.raises(TypeError, match="takes a FaultPlan"):
        proxy.set_faults([Fault("error_503", 1.0)])  # type: ignore[arg-type]
