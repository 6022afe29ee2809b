"""NATS server with JetStream on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from infra.components.process import (
    HOST,
    LocalService,
    Stoppable,
    free_port,
    infra_dir,
    tcp_connects,
)
from tests.support.services.launch import base_env, find_executable, start_with_port_retries


@dataclass
class NatsServer(Stoppable):
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
        """Stop the server (SIGTERM, then SIGKILL after ``grace`` seconds)."""
        self.service.stop(grace)


def _nats_probe(server: NatsServer) -> Callable[[], bool]:
    """Probe: the process runs and its client port accepts connections."""
    return lambda: server.service.is_running() and tcp_connects(server.port)


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
        ServiceError: If the server does not become ready in time (the
            message names the log file and includes its tail).
    """
    data_dir = Path(data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    env = base_env()
    env["NATS_SERVER_BIN"] = find_executable("nats-server")

    def launch(nats_port: int) -> NatsServer:
        service = LocalService(
            "nats-server",
            [str(infra_dir() / "nats.sh"), str(data_dir / "jetstream"), str(nats_port)],
            data_dir / "nats.log",
            env=env,
            cwd=data_dir,
        ).start()
        return NatsServer(service, nats_port, data_dir)

    return start_with_port_retries(launch, _nats_probe, port, free_port, timeout)
