"""Who may see and act on which job through the operations page, inside a real Airflow.

A real api-server (with the streamkeeper plugin) and dag-processor run on 127.0.0.1 with
`DagPrefixAuthManager` (tests/support: Airflow's SimpleAuthManager whose users may be
confined to DAG id prefixes, set through `[core] auth_manager`). Two jobs, `alpha` and
`beta`, are defined in the jobs folder and have run below the root. `alice` (role USER)
may read and trigger `alpha.*` only; `admin` may do anything.

- `beta` is invisible to alice: absent from the jobs table, 404 (the same answer as for
  a job that does not exist) on its detail, runs and DAG-run routes and on every action,
  and no DAG run of it results.
- A forged `Host` header changes nothing: the action reaches this api-server, never the
  address in the header (a listener there records every request it gets: none).
- Error text from storage reaches the browser redacted (the connection's secret key).
- The page's responses carry a Content-Security-Policy that allows framing by Airflow's
  own UI only, `nosniff` and a Referrer-Policy.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from infra.components.airflow import AirflowServices, start_airflow
from infra.components.process import HOST
from streamkeeper_airflow.ui.actions import lifecycle_dag_ids
from tests.airflow.conftest import CANARY_SECRET, connection_json
from tests.unit.test_client import write_control_plane

pytestmark = [pytest.mark.integration, pytest.mark.airflow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
PASSWORDS = {"admin": "admin-pw-1", "alice": "alice-pw-1"}
MINE, THEIRS = "alpha", "beta"
LEAKED = f"upload refused: s3://AKIA:{CANARY_SECRET}@10.0.0.9/bucket, token={CANARY_SECRET}"


class _Recorder(BaseHTTPRequestHandler):
    def _record(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        self.server.requests.append((self.command, self.path, dict(self.headers), body))  # type: ignore[attr-defined]
        reply = json.dumps({"dag_id": "forged", "dag_run_id": "forged", "state": "success"})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(reply.encode())

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _record

    def log_message(self, *args: object) -> None:
        pass


@dataclass
class Listener:
    """A loopback HTTP server standing for an internal address an attacker would name."""

    server: ThreadingHTTPServer
    requests: list[tuple[str, str, dict[str, str], bytes]] = field(default_factory=list)

    @property
    def netloc(self) -> str:
        return f"{HOST}:{self.server.server_address[1]}"


@pytest.fixture(scope="module")
def listener() -> Iterator[Listener]:
    server = ThreadingHTTPServer((HOST, 0), _Recorder)
    found = Listener(server)
    server.requests = found.requests  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield found
    finally:
        server.shutdown()
        server.server_close()


def _jobs_folder(place: Path) -> Path:
    """The sample job's spec twice, named alpha and beta, without schedules."""
    jobs = place / "jobs"
    for name in (MINE, THEIRS):
        shutil.copytree(REPO / "jobs" / "keyed_totals", jobs / name)
        spec = jobs / name / "job.yaml"
        text = re.sub(r"(monitor|savepoint)_schedule: .*", r"\1_schedule: null", spec.read_text())
        spec.write_text(re.sub(r"(?m)^name: .*$", f"name: {name}", text))
    return jobs


@pytest.fixture(scope="module")
def airflow(
    tmp_path_factory: pytest.TempPathFactory, airflow_db: float
) -> Iterator[AirflowServices]:
    place = tmp_path_factory.mktemp("ui-access")
    root = place / "data"
    failed = {"state": "FAILED", "reason": LEAKED, "time": time.time()}
    write_control_plane(root, job=MINE, heartbeat=failed)
    write_control_plane(root, job=THEIRS)
    passwords = place / "passwords.json"
    passwords.write_text(json.dumps(PASSWORDS))
    python_path = [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {
        "PYTHONPATH": os.pathsep.join(python_path),  # the auth manager lives in tests/support
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "AIRFLOW__CORE__AUTH_MANAGER": "tests.support.dag_prefix_auth_manager.DagPrefixAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,alice:user",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "STREAMKEEPER_TEST_DAG_PREFIXES": json.dumps({"alice": [f"{MINE}."]}),
        "AIRFLOW_CONN_STREAMKEEPER_DEFAULT": connection_json(str(root)),
        "AIRFLOW__STREAMKEEPER__JOBS_FOLDER": str(_jobs_folder(place)),
        "AIRFLOW__STREAMKEEPER__WORKDIR": str(place / "work"),
    }
    services = start_airflow(place / "airflow", env, components=("api-server", "dag-processor"))
    try:
        with _as(services, "admin") as admin:
            for dag_id in lifecycle_dag_ids(MINE) + lifecycle_dag_ids(THEIRS):
                _wait_parsed(admin, dag_id)
        yield services
    finally:
        services.stop()


def _as(services: AirflowServices, user: str) -> httpx.Client:
    body = {"username": user, "password": PASSWORDS[user]}
    reply = httpx.post(f"{services.api_url}/auth/token", json=body, timeout=30)
    assert reply.status_code == 201, reply.text
    headers = {"Authorization": f"Bearer {reply.json()['access_token']}"}
    return httpx.Client(base_url=services.api_url, headers=headers, timeout=60)


def _wait_parsed(admin: httpx.Client, dag_id: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if admin.get(f"/api/v2/dags/{dag_id}").status_code == 200:
            return
        time.sleep(2)
    raise AssertionError(f"DAG {dag_id} not parsed within {timeout} s")


def _runs(admin: httpx.Client, job: str) -> dict[str, list[str]]:
    found = {}
    for dag_id in lifecycle_dag_ids(job):
        reply = admin.get(f"/api/v2/dags/{dag_id}/dagRuns")
        assert reply.status_code == 200, reply.text
        found[dag_id] = sorted(run["dag_run_id"] for run in reply.json()["dag_runs"])
    return found


PAGE = {"X-Streamkeeper-Page": "1"}
ACTIONS = {
    "savepoint": {"format": "native"},
    "stop": {"format": "native"},
    "restart": {},
    "upgrade": {"green_spec_path": "/any/v2.yaml"},
    "rollback": {"savepoint_id": "sp-any"},
}


def test_a_job_whose_dags_the_user_may_not_read_is_invisible(airflow: AirflowServices) -> None:
    with _as(airflow, "admin") as admin:
        everything = admin.get("/streamkeeper/api/jobs").json()
        assert [j["job"] for j in everything["jobs"]] == [MINE, THEIRS]
    with _as(airflow, "alice") as alice:
        page = alice.get("/streamkeeper/api/jobs").json()
        assert [j["job"] for j in page["jobs"]] == [MINE] and page["total"] == 1
        assert alice.get(f"/streamkeeper/api/jobs/{MINE}").status_code == 200
        assert alice.get(f"/streamkeeper/api/jobs/{MINE}/runs").status_code == 200
        for path in (
            f"/streamkeeper/api/jobs/{THEIRS}",
            f"/streamkeeper/api/jobs/{THEIRS}/runs",
            f"/streamkeeper/api/jobs/{THEIRS}/driver-log",
            f"/streamkeeper/api/dag-runs/{THEIRS}.savepoint/any-run",
        ):
            hidden = alice.get(path)
            assert hidden.status_code == 404, (path, hidden.text)
            # The answer a job that does not exist gets, word for word: existence not leaked.
            absent = alice.get(path.replace(THEIRS, "no-such-job"))
            assert absent.status_code == 404
            assert hidden.text.replace(THEIRS, "?") == absent.text.replace("no-such-job", "?")


def test_actions_on_a_job_the_user_may_not_trigger_are_refused_and_change_nothing(
    airflow: AirflowServices, listener: Listener
) -> None:
    with _as(airflow, "admin") as admin:
        before = _runs(admin, THEIRS)
        with _as(airflow, "alice") as alice:
            for action, options in ACTIONS.items():
                url = f"/streamkeeper/api/jobs/{THEIRS}/actions/{action}"
                refused = alice.post(url, json=options, headers=PAGE)
                assert refused.status_code == 404, (action, refused.text)
                forged = alice.post(url, json=options, headers={**PAGE, "Host": listener.netloc})
                assert forged.status_code == 404, (action, forged.text)
        assert _runs(admin, THEIRS) == before
    assert listener.requests == []


def test_a_forged_host_header_sends_nothing_to_the_host_it_names(
    airflow: AirflowServices, listener: Listener
) -> None:
    forged = {**PAGE, "Host": listener.netloc}
    with _as(airflow, "alice") as alice:
        url = f"/streamkeeper/api/jobs/{MINE}/actions/savepoint"
        reply = alice.post(url, json=ACTIONS["savepoint"], headers=forged)
        assert reply.status_code == 200, reply.text
        run = reply.json()
        assert run["dag_id"] == f"{MINE}.savepoint" and run["dag_run_id"] != "forged"
        runs = alice.get(f"/streamkeeper/api/jobs/{MINE}/runs", headers=forged)
        assert runs.status_code == 200, runs.text
        state = alice.get(
            f"/streamkeeper/api/dag-runs/{MINE}.savepoint/{run['dag_run_id']}", headers=forged
        )
        assert state.status_code == 200 and state.json()["dag_run_id"] == run["dag_run_id"]
    with _as(airflow, "admin") as admin:  # the run is this Airflow's own
        assert run["dag_run_id"] in _runs(admin, MINE)[f"{MINE}.savepoint"]
    assert listener.requests == []


def test_error_text_reaching_the_browser_is_redacted(airflow: AirflowServices) -> None:
    with _as(airflow, "alice") as alice:
        for path in ("/streamkeeper/api/jobs", f"/streamkeeper/api/jobs/{MINE}"):
            reply = alice.get(path)
            assert reply.status_code == 200, reply.text
            assert CANARY_SECRET not in reply.text, path
        row = alice.get("/streamkeeper/api/jobs").json()["jobs"][0]
        assert row["state"] == "FAILED" and "upload refused" in row["reason"]
        assert "***" in row["reason"]


def test_the_page_says_where_it_may_be_framed_and_sniffed(airflow: AirflowServices) -> None:
    with _as(airflow, "alice") as alice:
        for path in ("/streamkeeper/", "/streamkeeper/static/page.js", "/streamkeeper/api/jobs"):
            headers = alice.get(path).headers
            policy = headers.get("content-security-policy", "")
            assert "default-src 'self'" in policy and "frame-ancestors 'self'" in policy, path
            assert headers.get("x-content-type-options") == "nosniff", path
            assert headers.get("referrer-policy"), path
