"""Alerts: the task log, a JSON-lines file and a real webhook receive them, never a secret."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from streamkeeper_airflow.notifications.alerts import (
    JsonLinesSink,
    StreamkeeperAlertNotifier,
    WebhookSink,
    build_alert,
    send_alert,
    sink_for,
)
from tests.airflow.conftest import CANARY_KEY, CANARY_SECRET


def _context(message: str) -> dict[str, Any]:
    ti = SimpleNamespace(dag_id="k.monitor", task_id="check", run_id="r1", try_number=1)
    return {"ti": ti, "exception": RuntimeError(message)}


def test_an_alert_goes_to_the_log_and_a_json_lines_file_without_the_secret(
    tmp_path: Path,
    conn_env: object,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    conn_env("sk_alert", str(tmp_path))  # type: ignore[operator]
    sink = tmp_path / "alerts" / "alerts.jsonl"
    notifier = StreamkeeperAlertNotifier(job="keyed-totals", sink=str(sink), conn_id="sk_alert")
    caplog.set_level(logging.INFO)
    leaky = f"job 'keyed-totals' is FAILED: heartbeat lost (endpoint key {CANARY_SECRET})"
    notifier.notify(_context(leaky))
    notifier.notify(_context("job 'keyed-totals' is DEGRADED: falling behind"))
    lines = [json.loads(line) for line in sink.read_text().splitlines()]
    assert [a["task_id"] for a in lines] == ["check", "check"]
    assert lines[0]["job"] == "keyed-totals" and lines[0]["dag_id"] == "k.monitor"
    assert "RuntimeError: job 'keyed-totals' is FAILED: heartbeat lost" in lines[0]["message"]
    assert "is DEGRADED: falling behind" in lines[1]["message"]
    logged = caplog.text + "".join(capfd.readouterr())  # Airflow's structlog prints
    assert "streamkeeper alert for job keyed-totals" in logged
    for text in (sink.read_text(), logged):
        assert CANARY_SECRET not in text and CANARY_KEY not in text


def test_an_alert_is_posted_to_a_webhook(tmp_path: Path) -> None:
    received: list[dict[str, Any]] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/hook"
        alert = build_alert(_context("x"), job="j", message=f"FAILED token={CANARY_SECRET}")
        sent = send_alert(alert, url, secrets=(CANARY_SECRET,))
    finally:
        server.shutdown()
    assert received and received[0]["text"] == sent["message"]
    assert received[0]["job"] == "j" and CANARY_SECRET not in json.dumps(received)


def test_a_sink_that_fails_does_not_raise(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.WARNING)
    send_alert({"job": "j", "message": "m"}, "http://127.0.0.1:9/unreachable")
    logged = caplog.text + "".join(capfd.readouterr())
    assert "alert not delivered to WebhookSink(<url hidden>)" in logged


def test_sinks_are_chosen_by_the_setting() -> None:
    assert sink_for(None) is None and sink_for("") is None
    assert isinstance(sink_for("/var/log/a.jsonl"), JsonLinesSink)
    assert isinstance(sink_for("file:///var/log/a.jsonl"), JsonLinesSink)
    assert isinstance(sink_for("https://hooks.example/x"), WebhookSink)
    with pytest.raises(ValueError, match="alert sink 'alerts.jsonl' is not a sink; expected"):
        sink_for("alerts.jsonl")
