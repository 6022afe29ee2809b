"""Alerts: the task log, Airflow notifiers named in `[streamkeeper] alert_notifiers`
(real ones: a recording notifier of this folder, Airflow's SMTP notifier against a local
SMTP server), a JSON-lines file and a real webhook receive them, never a secret."""

from __future__ import annotations

import email
import json
import logging
import threading
import warnings
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from streamkeeper_airflow import settings
from streamkeeper_airflow.notifications.alerts import (
    AlertConfigError,
    JsonLinesSink,
    NotifierEntry,
    StreamkeeperAlertNotifier,
    WebhookSink,
    build_alert,
    configured_notifiers,
    send_alert,
    sink_for,
)
from tests.airflow.alert_notifiers import RecordingNotifier
from tests.airflow.conftest import CANARY_KEY, CANARY_SECRET

NOTIFIERS_ENV = "AIRFLOW__STREAMKEEPER__ALERT_NOTIFIERS"
RECORDING = "tests.airflow.alert_notifiers.RecordingNotifier"
FAILING = "tests.airflow.alert_notifiers.FailingNotifier"


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


def _configure(monkeypatch: pytest.MonkeyPatch, *entries: object) -> None:
    monkeypatch.setenv(NOTIFIERS_ENV, json.dumps(list(entries)))


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_configured_notifiers_get_the_alert_and_its_context_never_a_secret(
    tmp_path: Path,
    conn_env: object,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Each configured notifier is built and called with the task's context plus `alert`;
    the context's exception and every rendered template field are redacted, even a
    template that reaches for the connection's password itself."""
    conn_env("sk_alert", str(tmp_path))  # type: ignore[operator]
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    text = "{{ alert.job }} on {{ ti.dag_id }}: {{ exception }} [{{ conn.sk_alert.password }}]"
    _configure(
        monkeypatch,
        {"class": RECORDING, "kwargs": {"path": str(first), "text": text}},
        {"class": RECORDING, "kwargs": {"path": str(second)}},
    )
    leaky = f"heartbeat lost (endpoint key {CANARY_SECRET}, password=hunter2-local)"
    context = {
        **_context(leaky),
        "conn": SimpleNamespace(sk_alert=SimpleNamespace(password=CANARY_SECRET)),
    }
    caplog.set_level(logging.INFO)
    StreamkeeperAlertNotifier(job="keyed-totals", conn_id="sk_alert").notify(context)
    [one], [two] = _records(first), _records(second)
    redacted = "heartbeat lost (endpoint key ***, password=***"
    assert one["text"] == f"keyed-totals on k.monitor: {redacted} [***]"
    assert two["text"] == f"RuntimeError: {redacted}"  # the default: {{ alert.message }}
    assert {"alert", "ti", "exception"} <= set(one["keys"])
    assert one["alert"]["job"] == "keyed-totals" and one["alert"]["task_id"] == "check"
    assert one["dag_id"] == "k.monitor"
    logged = caplog.text + "".join(capfd.readouterr())
    for seen in (first.read_text(), second.read_text(), logged):
        assert CANARY_SECRET not in seen and "hunter2-local" not in seen


def test_a_failing_notifier_is_logged_and_the_others_still_run(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    recorded = tmp_path / "recorded.jsonl"
    _configure(
        monkeypatch,
        FAILING,
        {"class": "tests.airflow.alert_notifiers.NoSuchNotifier"},
        {"class": RECORDING, "kwargs": {"path": str(recorded)}},
    )
    caplog.set_level(logging.WARNING)
    notifier = StreamkeeperAlertNotifier(job="j", message=f"FAILED token={CANARY_SECRET}")
    notifier.notify(_context("x"))  # never raises: the task's failure is the news
    assert _records(recorded)[0]["text"] == "FAILED token=***"
    logged = caplog.text + "".join(capfd.readouterr())
    assert f"alert notifier {FAILING} failed: ConnectionError: service unavailable" in logged
    assert "cannot import 'tests.airflow.alert_notifiers.NoSuchNotifier'" in logged
    assert CANARY_SECRET not in logged


def test_a_dag_author_passes_notifier_instances(tmp_path: Path) -> None:
    """From DAG code, notifiers come as instances (no import path to resolve); each alert
    renders a copy, so the instance's templates stay templates."""
    recorded = tmp_path / "recorded.jsonl"
    mine = RecordingNotifier(str(recorded), text="{{ alert.job }}: {{ alert.message }}")
    notifier = StreamkeeperAlertNotifier(job="j", notifiers=[mine])
    notifier.notify(_context("first"))
    notifier.notify(_context("second"))
    assert [r["text"] for r in _records(recorded)] == [
        "j: RuntimeError: first",
        "j: RuntimeError: second",
    ]
    assert mine.text == "{{ alert.job }}: {{ alert.message }}"


def test_nothing_configured_means_the_task_log_only(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv(NOTIFIERS_ENV, raising=False)
    monkeypatch.delenv("AIRFLOW__STREAMKEEPER__ALERT_SINK", raising=False)
    assert settings.alert_notifiers() is None and configured_notifiers() == []
    caplog.set_level(logging.INFO)
    sent = send_alert(build_alert(_context("down"), job="j"), context=_context("down"))
    assert sent["message"] == "RuntimeError: down"
    logged = caplog.text + "".join(capfd.readouterr())
    assert "streamkeeper alert for job j: RuntimeError: down" in logged
    assert "not delivered" not in logged and "notifier" not in logged


def test_the_setting_names_notifiers_by_path_with_keyword_arguments() -> None:
    assert configured_notifiers(" ") == []
    assert configured_notifiers(f'["{RECORDING}", {{"class": "{FAILING}"}}]') == [
        NotifierEntry(RECORDING),
        NotifierEntry(FAILING),
    ]
    one = f'{{"class": "{RECORDING}", "kwargs": {{"path": "/tmp/x"}}}}'  # one, not a list
    assert configured_notifiers(one) == [NotifierEntry(RECORDING, {"path": "/tmp/x"})]
    built = configured_notifiers(one)[0].build()
    assert isinstance(built, RecordingNotifier) and built.path == "/tmp/x"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (
            "[{'class': 'x'}]",
            r"\[streamkeeper\] alert_notifiers is not JSON \(.*\); expected a list such as",
        ),
        ("[42]", r"entry 0 is a int; expected an import path or an object"),
        (
            f'[{{"class": "{RECORDING}", "path": "/tmp/x"}}]',
            r"entry 0 has unknown keys \['path'\]; .*arguments go inside 'kwargs'",
        ),
        ('[{"kwargs": {}}]', r"entry 0 has no 'class'; expected the notifier's import path"),
        (
            f'[{{"class": "{RECORDING}", "kwargs": ["/tmp/x"]}}]',
            r"'kwargs' is a list; expected an object of the notifier's keyword arguments",
        ),
    ],
)
def test_a_malformed_setting_names_the_entry_and_the_fix(value: str, expected: str) -> None:
    with pytest.raises(AlertConfigError, match=expected):
        configured_notifiers(value)


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        (NotifierEntry("SlackNotifier"), r"'SlackNotifier' is not an import path; expected"),
        (
            NotifierEntry("airflow.providers.slack.notifications.slack.SlackNotifier"),
            r"cannot import 'airflow.providers.slack.notifications.slack.SlackNotifier' "
            r"\(ModuleNotFoundError: .*install the provider that has it",
        ),
        (
            NotifierEntry("tests.airflow.alert_notifiers.NotANotifier"),
            r"'tests.airflow.alert_notifiers.NotANotifier' is not an Airflow notifier \(a "
            r"subclass of airflow.sdk.BaseNotifier\); name a notifier class such as",
        ),
        (
            NotifierEntry("os.system"),
            r"'os.system' is not an Airflow notifier",
        ),
        (
            NotifierEntry(RECORDING, {"pth": "/tmp/x"}),
            rf"{RECORDING}\(\*\*kwargs\) failed: TypeError: .*'pth'.*check its keyword",
        ),
    ],
)
def test_a_class_that_is_not_a_notifier_is_refused(entry: NotifierEntry, expected: str) -> None:
    with pytest.raises(AlertConfigError, match=expected):
        entry.build()


def test_a_malformed_setting_is_logged_and_the_alert_still_reaches_the_log(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(NOTIFIERS_ENV, "SlackNotifier")
    monkeypatch.setenv("AIRFLOW__STREAMKEEPER__ALERT_SINK", "hooks.example/T0K3N-4f9a")
    caplog.set_level(logging.INFO)
    StreamkeeperAlertNotifier(job="j").notify(_context("down"))
    logged = caplog.text + "".join(capfd.readouterr())
    assert "streamkeeper alert for job j: RuntimeError: down" in logged
    assert "alert sink not used: [streamkeeper] alert_sink is neither" in logged
    assert "T0K3N" not in logged  # a sink's value is not shown: it may be a webhook's token
    assert "no configured alert notifier called: [streamkeeper] alert_notifiers is not JSON" in (
        logged
    )


def _smtpd() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            import asyncore
            import smtpd
        except ImportError:  # Python 3.12+: no smtpd, and aiosmtpd is not a dependency
            pytest.skip("no SMTP server module (smtpd) in this Python")
    return asyncore, smtpd


def test_airflows_smtp_notifier_mails_the_alert_without_the_secret(
    tmp_path: Path, conn_env: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real SmtpNotifier of apache-airflow-providers-smtp, configured by path, sends
    through a real SMTP server on 127.0.0.1."""
    asyncore, smtpd = _smtpd()
    received: list[tuple[str, list[str], bytes]] = []

    class Server(smtpd.SMTPServer):  # type: ignore[misc, name-defined]
        def process_message(self, peer: Any, mailfrom: str, rcpttos: list[str], data: bytes,
                            **kwargs: Any) -> None:  # fmt: skip
            received.append((mailfrom, rcpttos, data))

    channels: dict[int, Any] = {}
    server = Server(("127.0.0.1", 0), None, map=channels, decode_data=False)
    port = server.socket.getsockname()[1]
    loop = threading.Thread(
        target=asyncore.loop, kwargs={"timeout": 0.05, "map": channels}, daemon=True
    )
    loop.start()
    conn_env("sk_alert", str(tmp_path))  # type: ignore[operator]
    monkeypatch.setenv(
        "AIRFLOW_CONN_SK_SMTP",
        json.dumps(
            {
                "conn_type": "smtp",
                "host": "127.0.0.1",
                "port": port,
                "extra": {"disable_tls": True, "disable_ssl": True, "retry_limit": 0},
            }
        ),
    )
    _configure(
        monkeypatch,
        {
            "class": "airflow.providers.smtp.notifications.smtp.SmtpNotifier",
            "kwargs": {
                "smtp_conn_id": "sk_smtp",
                "from_email": "airflow@example.com",
                "to": "oncall@example.com",
                "subject": "[streamkeeper] {{ alert.job }} failed in {{ ti.dag_id }}",
                "html_content": "<p>{{ alert.message }}</p><p>{{ exception }}</p>",
            },
        },
    )
    try:
        notifier = StreamkeeperAlertNotifier(job="keyed-totals", conn_id="sk_alert")
        notifier.notify(_context(f"heartbeat lost (endpoint key {CANARY_SECRET})"))
    finally:
        server.close()
        loop.join(timeout=5)
    [(sender, recipients, data)] = received
    assert sender == "airflow@example.com" and recipients == ["oncall@example.com"]
    mail = email.message_from_bytes(data)
    assert mail["Subject"] == "[streamkeeper] keyed-totals failed in k.monitor"
    body = "".join(
        part.get_payload(decode=True).decode() for part in mail.walk() if not part.is_multipart()
    )
    assert "<p>RuntimeError: heartbeat lost (endpoint key ***)</p>" in body
    assert CANARY_SECRET not in data.decode(errors="replace")


PROBE_DAG = """
from datetime import datetime

from airflow.sdk import DAG, task

from streamkeeper_airflow.notifications.alerts import StreamkeeperAlertNotifier

with DAG("sk_alert_probe", schedule=None, start_date=datetime(2026, 1, 1)):

    @task(retries=0, on_failure_callback=StreamkeeperAlertNotifier(job="keyed-totals",
                                                                   conn_id="sk_alert"))
    def check() -> None:
        raise RuntimeError("job 'keyed-totals' is FAILED: heartbeat lost (%s)")

    check()
"""


@pytest.mark.airflow
def test_a_failed_task_in_a_real_dag_run_reaches_the_configured_notifier(
    tmp_path: Path, conn_env: object, monkeypatch: pytest.MonkeyPatch, airflow_db: float
) -> None:
    """Airflow's task runner calls the failure callback with the real context (`ti`,
    `dag_run`, `exception`, `dag` for the template environment)."""
    from airflow.dag_processing.dagbag import DagBag

    # Not the canary: this DAG's source (which holds the secret) is stored in the metadata
    # DB, which test_secret_canary.py searches for the canary.
    secret = "dag-run-Secret-5b1e0c9a7d"
    conn_env("sk_alert", str(tmp_path), password=secret)  # type: ignore[operator]
    folder = tmp_path / "dags"
    folder.mkdir()
    (folder / "sk_alert_probe.py").write_text(PROBE_DAG % secret)
    from airflow import settings as airflow_settings

    # dag.test() serializes the DAG from the dags-folder bundle: this test's own folder
    monkeypatch.setattr(airflow_settings, "DAGS_FOLDER", str(folder))
    recorded = tmp_path / "recorded.jsonl"
    text = "{{ ti.dag_id }}.{{ ti.task_id }} try {{ ti.try_number }} of {{ dag_run.run_id }}"
    entry = {
        "class": RECORDING,
        "kwargs": {"path": str(recorded), "text": text + ": {{ exception }}"},
    }
    _configure(monkeypatch, entry)
    run = DagBag(dag_folder=str(folder)).dags["sk_alert_probe"].test()
    [record] = _records(recorded)
    assert record["text"] == (
        f"sk_alert_probe.check try 1 of {run.run_id}: "
        "job 'keyed-totals' is FAILED: heartbeat lost (***)"
    )
    assert record["alert"]["dag_id"] == "sk_alert_probe"
    assert record["alert"]["job"] == "keyed-totals"
    assert {"dag", "dag_run", "ti", "exception", "alert"} <= set(record["keys"])
    assert secret not in recorded.read_text()
