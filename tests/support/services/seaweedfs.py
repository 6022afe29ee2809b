"""SeaweedFS (``weed mini``) with an authenticated S3 gateway on 127.0.0.1."""

from __future__ import annotations

import contextlib
import random
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.components.process import HOST, LocalService, Stoppable, infra_dir
from tests.support.services.launch import base_env, find_executable, start_with_port_retries

# SeaweedFS derives its internal ports from the S3 port (see infra/seaweedfs.sh).
_SEAWEED_HTTP_OFFSETS = (0, 1, 2, 3, 8)
_SEAWEED_GRPC_OFFSETS = (10001, 10002, 10003, 10007, 10008)
_SEAWEED_MAX_PORT = 55527
# Auto-picked S3 ports come from a range whose derived ports (up to +10008)
# stay below Linux's default ephemeral range (32768+), so outgoing
# connections cannot grab them between the check and the server's bind.
_SEAWEED_AUTO_RANGE = (15000, 22700)


@dataclass
class SeaweedFS(Stoppable):
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
        """Return S3 settings usable as environment variables and as delta-rs options.

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
        """Return a boto3 S3 client (path-style addressing) for this server.

        Args:
            access_key: Override the access key (e.g. to test rejection).
            secret_key: Override the secret key.
        """
        return _s3_client(
            self.endpoint_url,
            access_key if access_key is not None else self.access_key,
            secret_key if secret_key is not None else self.secret_key,
        )

    def stop(self, grace: float = 15.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``grace`` seconds)."""
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


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


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
    iam_config: Path | None = None,
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
        iam_config: An advanced IAM config (roles, policies, the STS signing key): the
            S3 port then also answers STS AssumeRole for those roles.

    Returns:
        The running server; call ``stop()`` when done.

    Raises:
        ServiceError: If the server does not become ready in time (the
            message names the log file and includes its tail).
    """
    data_dir = Path(data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    env = base_env()
    env.update(
        AWS_ACCESS_KEY_ID=access_key,
        AWS_SECRET_ACCESS_KEY=secret_key,
        WEED_BIN=find_executable("weed"),
    )
    if iam_config is not None:
        env["SEAWEED_IAM_CONFIG"] = str(Path(iam_config).resolve())

    def launch(s3_port: int) -> SeaweedFS:
        if not 1024 <= s3_port <= _SEAWEED_MAX_PORT:
            raise ValueError(f"SeaweedFS S3 port must be in 1024..{_SEAWEED_MAX_PORT}")
        service = LocalService(
            "seaweedfs",
            [str(infra_dir() / "seaweedfs.sh"), str(data_dir), str(s3_port), bucket],
            data_dir / "seaweedfs.log",
            env=env,
            cwd=data_dir,
        ).start()
        return SeaweedFS(service, s3_port, bucket, access_key, secret_key, data_dir)

    return start_with_port_retries(launch, _bucket_probe, port, _pick_seaweedfs_port, timeout)


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
