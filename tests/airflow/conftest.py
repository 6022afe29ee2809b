"""Tests of the Airflow layer (streamkeeper_airflow, dags/, plugins/).

Airflow reads AIRFLOW_HOME when it is first imported, so each test process gets its own
home (and SQLite metadata DB, created only by the tests that need one) before that.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _dags_folder() -> str:
    """The production DAG files and this folder's test DAGs, side by side (symlinks)."""
    folder = Path(tempfile.mkdtemp(prefix="sk-airflow-dags-"))
    for source in [*(REPO / "dags").glob("*.py"), *(Path(__file__).parent / "dags").glob("*.py")]:
        (folder / source.name).symlink_to(source)
    return str(folder)


# Always a fresh home: never a deployment's (whose database a test would migrate), and
# never one inherited from pytest-xdist's controller (two workers on one SQLite file).
os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="sk-airflow-home-")
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", _dags_folder())

CANARY_KEY = "AKIACANARYKEY0000001"
CANARY_SECRET = "canary-Secret-7f3a9c2e51d4b8"  # must never reach a log, an XCom, an alert


def connection_json(
    root: str,
    *,
    login: str = CANARY_KEY,
    password: str = CANARY_SECRET,
    host: str | None = None,
    **extra: object,
) -> str:
    """An `AIRFLOW_CONN_*` value of a streamkeeper connection."""
    return json.dumps(
        {
            "conn_type": "streamkeeper",
            "host": host,
            "login": login,
            "password": password,
            "extra": {"root": root, **extra},
        }
    )


@pytest.fixture
def conn_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """Set a connection by id: `conn_env("sk_test", root)` (env var, as deployments do)."""

    def set_connection(conn_id: str, root: str, **kwargs: object) -> str:
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", connection_json(root, **kwargs))
        return conn_id

    yield set_connection


@pytest.fixture(scope="session")
def airflow_db() -> float:
    """This process's metadata DB (SQLite in its AIRFLOW_HOME), migrated once."""
    from tests.support.airflow_runs import migrate_metadata_db

    return migrate_metadata_db()


@pytest.fixture
def local_root(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    root.mkdir()
    return root
