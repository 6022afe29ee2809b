"""The topology tests reuse the NATS helpers of tests/integration/test_sources.py, whose
`nats` mark is registered by tests/integration/conftest.py: register it here too, so a
run of tests/topology alone does not warn about it."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "nats: needs the NATS server started by the test")
