"""Shared fixtures: real services started by the tests, never mocks on the paths that matter."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SAMPLE_SPEC = REPO / "jobs" / "keyed_totals" / "job.yaml"

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

S3_ACCESS_KEY = "streamkeeper-test"
S3_SECRET_KEY = "streamkeeper-test-secret"
S3_BUCKET = "streamkeeper"


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A real SeaweedFS S3 server on 127.0.0.1 for the whole session."""
    from tests.support.services import start_seaweedfs

    server = start_seaweedfs(
        tmp_path_factory.mktemp("seaweedfs"), S3_BUCKET, S3_ACCESS_KEY, S3_SECRET_KEY
    )
    yield server
    server.stop()


@pytest.fixture
def s3_env(seaweed: object, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Point this test's process (and the runners it starts) at the SeaweedFS server."""
    env = seaweed.env()  # type: ignore[attr-defined]
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


@pytest.fixture
def s3_root(s3_env: dict[str, str]) -> str:
    """A fresh prefix in the test bucket."""
    return f"s3://{S3_BUCKET}/test-{uuid.uuid4().hex[:12]}"


# The longest tests, longest first (minutes each on 2 cores; see CI's --durations). CI's
# `--dist loadgroup` gives the next test to whichever worker is free, so collecting these
# first schedules longest first: the long ones overlap and the short ones fill the gaps.
LONGEST_FIRST = (
    "test_fault_run.py::",  # 8-13 min: collected last, it alone ran 10 min past the rest
    "test_crash_recovery.py::test_exactly_once_survives_kills_on_local_storage",
    "test_crash_recovery.py::test_exactly_once_survives_kills_and_s3_faults",
    "test_split_brain.py::test_repeated_takeovers_keep_the_output_exact",
    "test_fan_in.py::test_two_lineages_append_to_one_table_through_kills",
    "test_savepoint_kills.py::",
    "test_sources.py::test_nats_source_survives_sigkills",
    "test_savepoints.py::test_stop_with_savepoint_at_random_instants",
    "test_sources.py::test_delta_source_survives_sigkills",
    "test_fencing.py::",
    "test_slow_committer.py::",
)


def _rank(item: pytest.Item) -> int:
    for rank, name in enumerate(LONGEST_FIRST):
        if name in item.nodeid:
            return rank
    return len(LONGEST_FIRST)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_rank)  # stable: everything else keeps its collected order
