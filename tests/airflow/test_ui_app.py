"""The operations page's app in-process: summaries, one job's details, paging, actions'
DAG runs. Airflow's auth and REST API are covered against a real api-server in
test_ui_browser.py; here the app runs without them (`authenticate=False`)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from streamkeeper.client import StreamkeeperClient
from streamkeeper.upgrade.record import UpgradeRecord, UpgradeRecords
from streamkeeper_airflow.ui.actions import dag_run_for
from streamkeeper_airflow.ui.airflow_api import AirflowApi, api_base_url
from streamkeeper_airflow.ui.app import create_app
from tests.unit.test_client import JOB, NOW, write_control_plane


def _app(root: Path, specs: dict[str, list[str]] | None = None) -> TestClient:
    return TestClient(
        create_app(
            client_factory=lambda: StreamkeeperClient(str(root)),
            spec_jobs=lambda: specs or {},
            authenticate=False,
        )
    )


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    live = {"state": "RUNNING", "reason": None, "time": time.time(), "last_committed_seq": 39}
    write_control_plane(root, heartbeat={**live, "pending_commits": 2, "epoch": 7})
    write_control_plane(root, job="other-job", seqs=range(3))
    return root


def test_the_jobs_table_has_each_jobs_status_head_and_runner(root: Path) -> None:
    page = _app(root, {"spec-only": []}).get("/api/jobs").json()
    assert [j["job"] for j in page["jobs"]] == [JOB, "other-job", "spec-only"]
    running, stopped, never = page["jobs"]
    assert running["state"] == "RUNNING" and running["epoch"] == 7
    assert running["runner"] == "4242@h1" and running["pending_commits"] == 2
    assert running["last_checkpoint_id"] == 39 and running["last_checkpoint_at"] == NOW - 1400 + 39
    assert running["last_checkpoint_age_s"] is not None
    assert stopped["state"] == "STOPPED" and "finished" in stopped["reason"]
    assert never["state"] == "STOPPED" and "never started" in never["reason"]


def test_paging_and_the_name_filter(root: Path) -> None:
    http = _app(root)
    first = http.get("/api/jobs", params={"limit": 1}).json()
    assert first["total"] == 2 and [j["job"] for j in first["jobs"]] == [JOB]
    second = http.get("/api/jobs", params={"limit": 1, "offset": 1}).json()
    assert [j["job"] for j in second["jobs"]] == ["other-job"]
    assert http.get("/api/jobs", params={"q": "OTHER"}).json()["total"] == 1
    refused = http.get("/api/jobs", params={"limit": 5000})
    assert refused.status_code == 400 and "page size" in refused.json()["detail"]


def test_one_job_has_chart_series_over_the_window_savepoints_and_upgrades(root: Path) -> None:
    client = StreamkeeperClient(str(root))
    UpgradeRecords(client.store, JOB).create(
        UpgradeRecord(
            id="up-1",
            job=JOB,
            lineage=JOB,
            phase="promoted",
            blue={},
            green={"spec_path": "/specs/v2.yaml"},
            validation={"success": True, "reason": "outputs equal"},
            handover={"gap_s": 1.25},
        )
    )
    detail = _app(root).get(f"/api/jobs/{JOB}", params={"window": 50}).json()
    history = detail["history"]
    assert history["checkpoint_id"] == list(range(40))  # all 40: fewer than the window
    assert history["input_rows_per_second"] == [50.0] * 40
    assert history["state_bytes_by_operator"] == {"0:agg": [9] * 40}
    assert history["bytes_uploaded"][-1] == 390
    assert set(history["duration_parts_ms"]) >= {"planning_ms", "write_ms"}
    assert detail["upgrades"] == [
        {
            "id": "up-1",
            "phase": "promoted",
            "reason": None,
            "created_at": detail["upgrades"][0]["created_at"],
            "green_spec": "/specs/v2.yaml",
            "validation_passed": True,
            "validation_reason": "outputs equal",
            "validation": {"success": True, "reason": "outputs equal"},
            "handover_gap_s": 1.25,
            "probation_passed": None,
        }
    ]
    assert detail["savepoints"] == []


def test_an_unknown_job_or_window_is_refused_with_the_choices(root: Path) -> None:
    http = _app(root)
    missing = http.get("/api/jobs/nope")
    assert missing.status_code == 404 and "other-job" in missing.json()["detail"]
    bad = http.get(f"/api/jobs/{JOB}", params={"window": 7})
    assert bad.status_code == 400 and "50, 200, 1000" in bad.json()["detail"]


def test_the_page_and_its_files_are_served(root: Path) -> None:
    http = _app(root)
    assert "<title>Streaming jobs" in http.get("/").text
    assert "refreshJobs" in http.get("/static/page.js").text
    assert http.get("/static/../app.py").status_code == 404
    library = http.get("/static/vendor/uPlot.iife.min.js")  # the charts, vendored from npm
    assert library.status_code == 200 and "var uPlot=" in library.text
    assert "javascript" in library.headers["content-type"]
    assert http.get("/static/vendor/uPlot.min.css").headers["content-type"].startswith("text/css")
    for refused in ("uPlot.LICENSE", "..%2Fpage.js", "nope.js"):
        assert http.get(f"/static/vendor/{refused}").status_code == 404, refused


def test_an_action_without_the_pages_header_or_a_token_is_refused(root: Path) -> None:
    http = _app(root)
    assert http.post(f"/api/jobs/{JOB}/actions/savepoint", json={}).status_code == 403
    anonymous = http.post(
        f"/api/jobs/{JOB}/actions/savepoint", json={}, headers={"X-Streamkeeper-Page": "1"}
    )
    assert anonymous.status_code == 401


def test_each_action_asks_for_its_lifecycle_dag_run() -> None:
    assert dag_run_for("j", "savepoint", {"format": "canonical"}).conf == {
        "format": "canonical",
        "self_contained": False,
    }
    stop = dag_run_for("j", "stop", {})
    assert (stop.dag_id, stop.conf["mode"], stop.conf["savepoint"]) == ("j.stop", "stop", True)
    restart = dag_run_for("j", "restart", {"takeover": True})
    assert restart.dag_id == "j.start"
    assert restart.conf == {"start_from": "latest_checkpoint", "takeover": True}
    assert dag_run_for("j", "upgrade", {"green_spec_path": "/v2.yaml"}).dag_id == "j.upgrade"
    assert dag_run_for("j", "rollback", {"savepoint_id": "sp-1"}).conf == {"savepoint_id": "sp-1"}
    for action, options, words in [
        ("rollback", {}, "savepoint_id"),
        ("upgrade", {"green_spec_path": " "}, "green_spec_path"),
        ("savepoint", {"format": "zip"}, "'zip'"),
        ("delete", {}, "'delete'"),
    ]:
        with pytest.raises(ValueError, match=words):
            dag_run_for("j", action, options)


# -- trust boundaries: where actions go, what reaches the browser -----------------------


def test_the_airflow_api_is_the_configured_url_or_this_api_servers_loopback_address() -> None:
    loopback = {"base_url": None, "host": "0.0.0.0", "port": "8080", "ssl": False}
    assert api_base_url(None, **loopback) == "http://127.0.0.1:8080"
    assert api_base_url(None, **{**loopback, "host": "::"}) == "http://[::1]:8080"
    assert api_base_url(None, **{**loopback, "host": "127.0.0.5"}) == "http://127.0.0.5:8080"
    assert api_base_url(None, **{**loopback, "ssl": True}) == "https://127.0.0.1:8080"
    behind_a_prefix = {**loopback, "base_url": "https://airflow.example.com/ops/"}
    assert api_base_url(None, **behind_a_prefix) == "http://127.0.0.1:8080/ops"
    for configured in ("https://airflow.internal/", "http://127.0.0.1:9090", "http://[::1]:1"):
        assert api_base_url(configured, **loopback) == configured.rstrip("/")
    with pytest.raises(ValueError, match=r"'http://airflow\.internal:8080'.*https://"):
        api_base_url("http://airflow.internal:8080", **loopback)
    for bad in ("ftp://127.0.0.1/", "https://user:pw@airflow.example.com", "airflow:8080"):
        with pytest.raises(ValueError, match="airflow_api_url"):
            api_base_url(bad, **loopback)
    with pytest.raises(ValueError, match=r"\[api\] host '10\.1\.2\.3'.*airflow_api_url"):
        api_base_url(None, **{**loopback, "host": "10.1.2.3"})


@pytest.fixture
def upstream() -> Iterator[tuple[str, list[str]]]:
    """A loopback HTTP server standing for Airflow's API; records each request's raw path."""
    paths: list[str] = []

    class Recorder(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            paths.append(self.path)
            self.rfile.read(int(self.headers.get("content-length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b"{}")

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", paths
    finally:
        server.shutdown()
        server.server_close()


def test_every_path_segment_sent_to_airflow_is_quoted_and_dot_segments_refused(
    upstream: tuple[str, list[str]],
) -> None:
    url, paths = upstream
    api = AirflowApi(url, "token")
    api.trigger("j/../../config", {}, "note")
    api.dag_run("j.savepoint", "manual__2024-01-01T00:00:00+00:00/../x")
    assert paths == [
        "/api/v2/dags/j%2F..%2F..%2Fconfig/dagRuns",
        "/api/v2/dags/j.savepoint/dagRuns/manual__2024-01-01T00%3A00%3A00%2B00%3A00%2F..%2Fx",
    ]
    for dag_id, run_id in ((".", "x"), ("..", "x"), ("j.start", ".."), ("", "x")):
        with pytest.raises(ValueError, match="path segment"):
            api.dag_run(dag_id, run_id)
    assert len(paths) == 2  # refused before any request


def test_the_page_sends_a_strict_content_security_policy(root: Path) -> None:
    http = _app(root)
    for path in ("/", "/static/page.js", "/api/jobs", "/api/jobs/nope"):
        headers = http.get(path).headers
        policy = dict(
            part.strip().split(" ", 1) for part in headers["content-security-policy"].split(";")
        )
        assert policy["default-src"] == "'self'" and policy["frame-ancestors"] == "'self'"
        assert policy["script-src"] == "'self'" and policy["object-src"] == "'none'"
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["x-frame-options"] == "SAMEORIGIN"
        assert headers["referrer-policy"] == "same-origin"
    assert "style=" not in http.get("/").text  # inline styles would be blocked


def test_error_text_from_storage_reaches_the_browser_redacted(tmp_path: Path) -> None:
    secret = "canary-Secret-7f3a9c2e51d4b8"
    root = tmp_path / "data"
    failed = {"state": "FAILED", "reason": f"boom: nats://u:{secret}@h:4222 password={secret}"}
    write_control_plane(root, heartbeat={**failed, "time": time.time()})
    record = Path(write_control_plane(root, job="broken")) / "jobs" / "broken" / "job.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), "interval": secret}))
    http = TestClient(
        create_app(
            client_factory=lambda: StreamkeeperClient(str(root)),
            secrets=lambda: [secret],
            authenticate=False,
        )
    )
    replies = {
        path: http.get(path) for path in ("/api/jobs", f"/api/jobs/{JOB}", "/api/jobs/broken")
    }
    assert all(secret not in reply.text for reply in replies.values()), replies
    assert "***" in replies[f"/api/jobs/{JOB}"].json()["summary"]["reason"]
    unreadable = replies["/api/jobs"].json()["jobs"][0]  # a raw error quoting a stored value
    assert unreadable["state"] == "UNKNOWN" and "could not convert" in unreadable["reason"]
    assert replies["/api/jobs/broken"].status_code == 400  # the same error, as the detail's
