"""Starting Airflow's components for the tests and the quickstart (infra/components)."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest

import infra.components.airflow as airflow_components
from infra.components.airflow import start_airflow


def test_the_api_server_moves_to_another_port_when_its_port_was_taken(
    tmp_path: Path, airflow_db: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The port chosen for the API was free a moment ago; here it is taken before the
    api-server binds it (as an outgoing connection's source port took one in CI)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        chosen = iter([port])
        free = airflow_components.free_port
        monkeypatch.setattr(airflow_components, "free_port", lambda: next(chosen, None) or free())
        services = start_airflow(tmp_path / "airflow", {}, components=("api-server",))
        try:
            assert services.port != port
            health = f"{services.api_url}/api/v2/monitor/health"
            with urllib.request.urlopen(health, timeout=10) as reply:
                assert reply.status == 200
        finally:
            services.stop()
