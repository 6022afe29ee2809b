"""The provider installs and works without Spark: a venv with Airflow and the two
distributions' base (no pyspark, deltalake, pandas or Great Expectations, no JVM)
imports every provider module, parses the repository's DAGs, runs a trigger to its event,
loads the plugin and serves the operations page, and gets what the full install gets."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import venv
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from streamkeeper.client import StreamkeeperClient
from streamkeeper_airflow.dag_factory import find_jobs
from streamkeeper_airflow.payloads import status_payload
from streamkeeper_airflow.ui.app import create_app
from tests.airflow.conftest import connection_json
from tests.conftest import REPO
from tests.unit.test_client import JOB, write_control_plane

pytestmark = pytest.mark.packaging

PROBE = Path(__file__).with_name("provider_only_probe.py")
ACTIONS = ("start", "monitor", "savepoint", "stop", "upgrade", "rollback")


def _pinned(name: str) -> str:
    text = (REPO / "requirements.txt").read_text()
    return re.search(rf"^{re.escape(name)}==(\S+)$", text, re.M).group(0)


def _source_copy(into: Path) -> Path:
    """The two projects as a fresh clone has them: a build in the working tree would leave
    egg-info there, which the editable dev install would then see as a second copy."""
    ignore = shutil.ignore_patterns("*.egg-info", "__pycache__", "node_modules")
    shutil.copytree(REPO / "src", into / "src", ignore=ignore)
    shutil.copytree(REPO / "provider", into / "provider", symlinks=True, ignore=ignore)
    shutil.copy(REPO / "pyproject.toml", into / "pyproject.toml")
    return into


@pytest.fixture(scope="module")
def provider_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    place = tmp_path_factory.mktemp("provider-only")
    source = _source_copy(place / "source")
    env_dir = place / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    started = time.monotonic()
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "--no-compile",  # bytecode is not under test: imports compile what they use
         "-c", str(REPO / "requirements.txt"), _pinned("apache-airflow"),
         str(source), str(source / "provider")],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr[-4000:]
    print(f"provider-only venv installed in {time.monotonic() - started:.0f} s")
    return python


def test_the_provider_works_without_spark(provider_python: Path, tmp_path: Path) -> None:
    root = tmp_path / "data"
    live = {"state": "RUNNING", "reason": None, "time": time.time(), "last_committed_seq": 39}
    write_control_plane(root, heartbeat={**live, "pending_commits": 0, "epoch": 7})
    environment = {
        key: value for key, value in os.environ.items() if not key.startswith("PYTHON")
    } | {
        "AIRFLOW_HOME": str(tmp_path / "home"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(tmp_path / "no-plugins"),
        "AIRFLOW_CONN_STREAMKEEPER_DEFAULT": connection_json(str(root)),
    }
    done = subprocess.run(
        [str(provider_python), str(PROBE), str(REPO), str(root), JOB],
        capture_output=True, text=True, env=environment, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])

    assert seen["heavy_installed"] == [] and seen["heavy_imported"] == []
    assert seen["import_failures"] == {}
    # Every job spec's six DAGs, with no import error, as the full install parses them.
    jobs = [entry.name for entry in find_jobs(REPO / "jobs")]
    assert jobs, "the repository has job specs"
    assert seen["dags"]["errors"] == {}
    expected = {f"{job}.{action}" for job in jobs for action in ACTIONS}
    assert expected <= set(seen["dags"]["dag_ids"]), expected - set(seen["dags"]["dag_ids"])
    # The trigger's event: the runner and its status, as the full install reads them.
    event = seen["trigger_event"]
    assert event["status"] == "success", event
    report = StreamkeeperClient(str(root)).status(JOB)
    assert event["status_report"]["state"] == "RUNNING"
    assert (
        event["status_report"]["last_committed_seq"] == status_payload(report)["last_committed_seq"]
    )
    # The plugin loads from the provider's entry point, once, and serves the same answers.
    page = seen["page"]
    assert page["plugins"].count("streamkeeper") == 1 and page["plugin_errors"] == {}
    assert page["plugin_apps"] == ["/streamkeeper"]
    assert page["page_status"] == 200 and page["page_has_title"]
    full = TestClient(
        create_app(
            client_factory=lambda: StreamkeeperClient(str(root)),
            spec_jobs=lambda: {},
            authenticate=False,
        )
    )
    assert _timeless(page["jobs"]["jobs"]) == _timeless(full.get("/api/jobs").json()["jobs"])
    assert [j["job"] for j in page["jobs"]["jobs"]] == [JOB]
    detail = full.get(f"/api/jobs/{JOB}").json()
    assert page["job"]["history"] == detail["history"] and detail["history"]["checkpoint_id"]


def _timeless(jobs: list[dict]) -> list[dict]:
    """Without the ages, which depend on when each install answered."""
    return [{k: v for k, v in job.items() if not k.endswith("_age_s")} for job in jobs]
