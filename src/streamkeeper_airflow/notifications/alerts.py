"""Alerts on a job's failure: to the task log and through Airflow's notifiers.

    on_failure_callback=StreamkeeperAlertNotifier(job="keyed-totals")

Every alert goes to the task log. Where else it goes is the deployment's choice, made in
Airflow's configuration only: `[streamkeeper] alert_notifiers` names Airflow notifiers
(subclasses of `airflow.sdk.BaseNotifier`) by import path, with keyword arguments, as
JSON: a list whose items are an import path or `{"class": path, "kwargs": {...}}`:

    [streamkeeper]
    alert_notifiers = [{"class": "airflow.providers.slack.notifications.slack.SlackNotifier",
        "kwargs": {"slack_conn_id": "slack", "channel": "#streaming",
                   "text": "{{ alert.job }}: {{ alert.message }}"}}]

Each is built anew for each alert and called with the task's context plus `alert` (the
dict below), so its templates may say `{{ alert.message }}`, `{{ ti.dag_id }}`, ...
Importing a class by path runs code, so nothing but Airflow's configuration (owned by
the deployment) may name one: never a DAG run's Params, a spec, or anything read from
storage. A DAG author passes notifier instances (`notifiers=`) instead.

An alert names the DAG, task, run, try, job and what happened; every string in it, the
context's exception and every rendered template field of a notifier pass `redact` (the
job connection's credentials, URL passwords, secret-named pairs), so no notifier ever
receives a secret. A notifier that fails, or a setting that names none, is logged, never
raised: the task's own failure is the news, and the other notifiers still run.

`[streamkeeper] alert_sink` remains for two plain cases: an http(s):// URL gets a JSON
POST (Slack-compatible), and a file path (or file://...) one JSON line per alert. That
file is per host (on a worker, nobody else sees it): for a single machine (the
quickstart) only. Unset, as both are by default, alerts go to the task log alone.
"""

from __future__ import annotations

import copy
import fcntl
import importlib
import json
import logging
import time
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from airflow.sdk import BaseNotifier

from streamkeeper_airflow import settings
from streamkeeper_airflow.errors import SecretSafeError, StreamkeeperAirflowError
from streamkeeper_airflow.secrets import redact, redact_value

NOTIFIERS_OPTION = "[streamkeeper] alert_notifiers"
_EXAMPLE = (
    '[{"class": "airflow.providers.smtp.notifications.smtp.SmtpNotifier", '
    '"kwargs": {"to": "oncall@example.com"}}]'
)


class AlertConfigError(StreamkeeperAirflowError, ValueError):
    """`[streamkeeper] alert_notifiers` does not name notifiers as it should."""


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


@dataclass(frozen=True)
class NotifierEntry:
    """One notifier the configuration names: its class's import path and its arguments."""

    path: str
    kwargs: dict[str, Any] = field(default_factory=dict, repr=False)  # may name a secret

    def build(self) -> BaseNotifier:
        """A new instance (each alert renders its own templates).

        Raises:
            AlertConfigError: the class is not importable, not a notifier, or refuses
                the arguments.
        """
        cls = notifier_class(self.path)
        try:
            return cls(**self.kwargs)
        except Exception as error:
            raise AlertConfigError(
                f"{NOTIFIERS_OPTION}: {self.path}(**kwargs) failed: "
                f"{type(error).__name__}: {redact(str(error))}; check its keyword "
                "arguments against the notifier's documentation"
            ) from None


def notifier_class(path: str) -> type[BaseNotifier]:
    """The notifier class `path` (module.Class) names.

    Raises:
        AlertConfigError: not an import path, not importable, or not a subclass of
            airflow.sdk.BaseNotifier (the message names the value and the fix).
    """
    module_name, _, name = path.rpartition(".")
    if not module_name or not name.isidentifier():
        raise AlertConfigError(
            f"{NOTIFIERS_OPTION}: {path!r} is not an import path; expected module.Class, "
            "e.g. airflow.providers.slack.notifications.slack.SlackNotifier"
        )
    try:
        found = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as error:
        raise AlertConfigError(
            f"{NOTIFIERS_OPTION}: cannot import {path!r} ({type(error).__name__}: {error}); "
            "install the provider that has it on every worker (e.g. "
            "apache-airflow-providers-slack) or correct the path"
        ) from None
    if not (isinstance(found, type) and issubclass(found, BaseNotifier)):
        raise AlertConfigError(
            f"{NOTIFIERS_OPTION}: {path!r} is not an Airflow notifier (a subclass of "
            "airflow.sdk.BaseNotifier); name a notifier class such as "
            "airflow.providers.smtp.notifications.smtp.SmtpNotifier"
        )
    return found


def configured_notifiers(value: str | None = None) -> list[NotifierEntry]:
    """The notifiers `[streamkeeper] alert_notifiers` (or `value`) names; none if unset.

    Only the shape is checked here; `NotifierEntry.build` imports the class.

    Raises:
        AlertConfigError: not JSON, or an entry of another shape (the message names the
            entry, never the arguments, which may hold a secret).
    """
    text = settings.alert_notifiers() if value is None else value
    if not text or not text.strip():
        return []
    try:
        parsed = json.loads(text)
    except ValueError as error:
        raise AlertConfigError(
            f"{NOTIFIERS_OPTION} is not JSON ({error.msg} at character {error.pos}); "
            f"expected a list such as {_EXAMPLE}"
        ) from None
    items = parsed if isinstance(parsed, list) else [parsed]
    return [_entry(position, item) for position, item in enumerate(items)]


def _entry(position: int, item: Any) -> NotifierEntry:
    where = f"{NOTIFIERS_OPTION} entry {position}"
    if isinstance(item, str):
        return NotifierEntry(item.strip())
    if not isinstance(item, dict):
        raise AlertConfigError(
            f"{where} is a {type(item).__name__}; expected an import path or an object "
            f'{{"class": "module.Class", "kwargs": {{...}}}}, e.g. {_EXAMPLE}'
        )
    unknown = sorted(set(item) - {"class", "kwargs"})
    path, kwargs = item.get("class"), item.get("kwargs", {})
    if unknown:
        raise AlertConfigError(
            f"{where} has unknown keys {unknown}; expected only 'class' and 'kwargs' "
            "(the notifier's own arguments go inside 'kwargs')"
        )
    if not isinstance(path, str) or not path.strip():
        raise AlertConfigError(
            f"{where} has no 'class'; expected the notifier's import path, e.g. {_EXAMPLE}"
        )
    if not isinstance(kwargs, dict):
        raise AlertConfigError(
            f"{where} ({path}): 'kwargs' is a {type(kwargs).__name__}; expected an object "
            "of the notifier's keyword arguments"
        )
    return NotifierEntry(path.strip(), kwargs)


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
    """Writes an alert to the task log and hands it to the notifiers (see module doc).

    Args:
        job: the job the alert is about.
        sink: a path, URL or `AlertSink`; default `[streamkeeper] alert_sink`.
        conn_id: the job's connection, whose credentials are redacted (others that
            Airflow masks are masked in the log by Airflow).
        message: the alert text; default: the task's exception.
        notifiers: notifier instances from DAG code, called besides the configured ones.
    """

    template_fields = ("job", "message")

    def __init__(
        self,
        *,
        job: str | None = None,
        sink: str | AlertSink | None = None,
        conn_id: str | None = None,
        message: str | None = None,
        notifiers: Sequence[BaseNotifier] = (),
    ) -> None:
        super().__init__()
        self.job = job
        self.sink = sink
        self.conn_id = conn_id
        self.message = message
        self.notifiers = tuple(notifiers)

    def notify(self, context: Any) -> None:
        alert = build_alert(context, job=self.job, message=self.message)
        send_alert(
            alert,
            self.sink,
            conn_id=self.conn_id,
            log=self.log,
            context=context,
            notifiers=self.notifiers,
        )


def send_alert(
    alert: dict[str, Any],
    sink: str | AlertSink | None = None,
    *,
    conn_id: str | None = None,
    secrets: tuple[str, ...] = (),
    log: Any = None,
    context: Mapping[str, Any] | None = None,
    notifiers: Iterable[BaseNotifier] = (),
) -> dict[str, Any]:
    """Redact, log and deliver one alert (the sink, then every notifier, each on its own);
    returns what was delivered."""
    log = log or logging.getLogger(__name__)
    hidden = (*secrets, *_connection_secrets(conn_id))
    alert = redact_value(alert, hidden)
    log.error("streamkeeper alert for job %s: %s", alert.get("job"), alert.get("message"))
    try:
        target = sink_for(sink if sink is not None else settings.alert_sink())
    except ValueError:  # its value is not shown: a webhook URL holds its token
        log.warning(
            "alert sink not used: [streamkeeper] alert_sink is neither an http(s):// URL "
            "nor an absolute path or file:// URL"
        )
        target = None
    if target is not None:
        try:
            target.send(alert)
        except Exception as error:  # noqa: BLE001 - the task's failure stays the news
            log.warning("alert not delivered to %r: %s", target, type(error).__name__)
    safe_context = alert_context(context, alert, hidden)
    try:
        entries: list[NotifierEntry | BaseNotifier] = [*configured_notifiers(), *notifiers]
    except AlertConfigError as error:
        log.warning("no configured alert notifier called: %s", error)
        entries = list(notifiers)
    for entry in entries:
        _call(entry, safe_context, hidden, log)
    return alert


def alert_context(
    context: Mapping[str, Any] | None, alert: dict[str, Any], secrets: Iterable[str] = ()
) -> dict[str, Any]:
    """What a notifier is called with: the task's context, its exception and plain strings
    redacted, plus `alert`."""
    safe = dict(context) if isinstance(context, Mapping) else {}
    for key, value in list(safe.items()):
        if isinstance(value, str):
            safe[key] = redact(value, secrets)
    exception = safe.get("exception")
    if isinstance(exception, BaseException):
        text = str(exception)
        if redact(text, secrets) != text:
            safe["exception"] = SecretSafeError(redact(text, secrets))
    elif exception is not None:
        safe["exception"] = redact(str(exception), secrets)
    safe["alert"] = alert
    return safe


def _call(
    entry: NotifierEntry | BaseNotifier,
    context: dict[str, Any],
    secrets: tuple[str, ...],
    log: Any,
) -> None:
    name = entry.path if isinstance(entry, NotifierEntry) else type(entry).__qualname__
    try:
        notifier = entry.build() if isinstance(entry, NotifierEntry) else copy.copy(entry)
        notifier.render_template_fields(context)
        for field_name in notifier.template_fields:  # what the templates made of the context
            value = getattr(notifier, field_name, None)
            setattr(notifier, field_name, redact_value(value, secrets))
        notifier.notify(context)
    except Exception as error:  # noqa: BLE001 - one notifier failing stops no other
        text = redact(f"{type(error).__name__}: {error}", secrets)
        log.warning("alert notifier %s failed: %s", name, text)


def _connection_secrets(conn_id: str | None) -> tuple[str, ...]:
    if not conn_id:
        return ()
    try:
        from streamkeeper_airflow.hooks.streamkeeper import StreamkeeperHook

        return StreamkeeperHook(conn_id).settings.secrets
    except Exception:  # noqa: BLE001 - no connection: nothing of it to redact
        return ()
