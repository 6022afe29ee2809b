"""Real Airflow notifiers for the alert tests, named by import path in
`[streamkeeper] alert_notifiers` as a deployment would name a provider's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from airflow.sdk import BaseNotifier


class RecordingNotifier(BaseNotifier):
    """Appends one JSON line per call to `path`: its rendered `text` and what the context
    held (keys, the exception, the alert)."""

    template_fields = ("text",)

    def __init__(self, path: str, text: str = "{{ alert.message }}") -> None:
        super().__init__()
        self.path = path
        self.text = text

    def notify(self, context: Any) -> None:
        record = {
            "text": self.text,
            "keys": sorted(context),
            "exception": str(context.get("exception")),
            "alert": context.get("alert"),
            "dag_id": getattr(context.get("ti"), "dag_id", None),
        }
        with open(Path(self.path), "a") as handle:
            handle.write(json.dumps(record, default=str) + "\n")


class FailingNotifier(BaseNotifier):
    """Fails as a notifier whose service is down does, quoting what it was sent."""

    template_fields = ("text",)

    def __init__(self, text: str = "{{ alert.message }}") -> None:
        super().__init__()
        self.text = text

    def notify(self, context: Any) -> None:
        raise ConnectionError(f"service unavailable, could not send {self.text!r}")


class NotANotifier:
    """Has `notify`, but is no airflow.sdk.BaseNotifier: configuration must refuse it."""

    def notify(self, context: Any) -> None:  # pragma: no cover - never called
        raise AssertionError("called")
