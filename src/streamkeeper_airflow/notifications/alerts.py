"""Alerts on a job's failure: to the task log and to a pluggable sink.

    on_failure_callback=StreamkeeperAlertNotifier(job="keyed-totals")

The sink is `[streamkeeper] alert_sink` unless given: a file path (or file://...) gets
one JSON line per alert, an http(s):// URL a JSON POST. Another sink is any object with
`send(alert: dict) -> None` passed as `sink`. An alert names the DAG, task, run, try,
job and what happened; every string in it passes `redact` (the connection's
credentials, URL passwords, secret-named pairs), so no sink ever receives a secret.
A sink that fails is logged, never raised: the task's own failure is the news.
"""

from __future__ import annotations

import fcntl
import json
import time
import urllib.request
from pathlib import Path
from typing import Any, Protocol

from airflow.sdk import BaseNotifier

from streamkeeper_airflow import settings
from streamkeeper_airflow.secrets import redact_value


class AlertSink(Protocol):
    """Where alerts go besides the task log."""

    def send(self, alert: dict[str, Any]) -> None: ...


class JsonLinesSink:
    """Appends one JSON object per line (whole lines: written under an exclusive lock)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def send(self, alert: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(alert, sort_keys=True, default=str) + "\n"
        with open(self.path, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            handle.write(line)

    def __repr__(self) -> str:
        return f"JsonLinesSink({str(self.path)!r})"


class WebhookSink:
    """POSTs the alert as JSON (Slack-compatible: a `text` field holds the message)."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url = url
        self.timeout = timeout

    def send(self, alert: dict[str, Any]) -> None:
        body = json.dumps({"text": alert.get("message"), **alert}, default=str).encode()
        request = urllib.request.Request(
            self.url, data=body, headers={"Content-Type": "application/json"}, method="POST"
        )
        with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
            response.read()

    def __repr__(self) -> str:
        return "WebhookSink(<url hidden>)"  # a webhook URL is often a credential itself


def sink_for(target: str | AlertSink | None) -> AlertSink | None:
    """The sink a setting names: None, a path / file:// URL, or an http(s):// URL.

    Raises:
        ValueError: any other kind of value (names it and the accepted forms).
    """
    if target is None or target == "":
        return None
    if not isinstance(target, str):
        return target
    if target.startswith(("http://", "https://")):
        return WebhookSink(target)
    if target.startswith("file://"):
        return JsonLinesSink(target.removeprefix("file://"))
    if target.startswith("/"):
        return JsonLinesSink(target)
    raise ValueError(
        f"alert sink {target!r} is not a sink; expected an absolute path or file:// URL "
        "(JSON lines) or an http(s):// URL (webhook)"
    )


def build_alert(
    context: dict[str, Any] | Any, *, job: str | None, message: str | None = None
) -> dict[str, Any]:
    """The alert for a task's context: who failed, and why (the exception, or `message`)."""
    ti = context.get("ti") if hasattr(context, "get") else None
    exception = context.get("exception") if hasattr(context, "get") else None
    text = message or (f"{type(exception).__name__}: {exception}" if exception else "failed")
    return {
        "kind": "streamkeeper.alert",
        "job": job,
        "message": text,
        "dag_id": getattr(ti, "dag_id", None),
        "task_id": getattr(ti, "task_id", None),
        "run_id": getattr(ti, "run_id", None),
        "try_number": getattr(ti, "try_number", None),
        "at": time.time(),
    }


class StreamkeeperAlertNotifier(BaseNotifier):
    """Writes an alert to the task log and the sink (see module doc).

    Args:
        job: the job the alert is about.
        sink: a path, URL or `AlertSink`; default `[streamkeeper] alert_sink`.
        conn_id: the job's connection, whose credentials are redacted (others that
            Airflow masks are masked in the log by Airflow).
        message: the alert text; default: the task's exception.
    """

    template_fields = ("job", "message")

    def __init__(
        self,
        *,
        job: str | None = None,
        sink: str | AlertSink | None = None,
        conn_id: str | None = None,
        message: str | None = None,
    ) -> None:
        super().__init__()
        self.job = job
        self.sink = sink
        self.conn_id = conn_id
        self.message = message

    def notify(self, context: Any) -> None:
        alert = build_alert(context, job=self.job, message=self.message)
        send_alert(alert, self.sink, conn_id=self.conn_id, log=self.log)


def send_alert(
    alert: dict[str, Any],
    sink: str | AlertSink | None = None,
    *,
    conn_id: str | None = None,
    secrets: tuple[str, ...] = (),
    log: Any = None,
) -> dict[str, Any]:
    """Redact, log and deliver one alert; returns what was delivered."""
    import logging

    log = log or logging.getLogger(__name__)
    alert = redact_value(alert, (*secrets, *_connection_secrets(conn_id)))
    log.error("streamkeeper alert for job %s: %s", alert.get("job"), alert.get("message"))
    target = sink_for(sink if sink is not None else settings.alert_sink())
    if target is not None:
        try:
            target.send(alert)
        except Exception as error:  # noqa: BLE001 - the task's failure stays the news
            log.warning("alert not delivered to %r: %s", target, type(error).__name__)
    return alert


def _connection_secrets(conn_id: str | None) -> tuple[str, ...]:
    if not conn_id:
        return ()
    try:
        from streamkeeper_airflow.hooks.streamkeeper import StreamkeeperHook

        return StreamkeeperHook(conn_id).settings.secrets
    except Exception:  # noqa: BLE001 - no connection: nothing of it to redact
        return ()
