"""Fixtures of the integration tests: a real NATS server with JetStream."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.services import NatsServer, start_nats


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "nats: needs the NATS server started by the test")


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """A real nats-server with JetStream on 127.0.0.1 for the whole session."""
    server = start_nats(tmp_path_factory.mktemp("nats"))
    yield server
    server.stop()
