"""Operator arguments as a user's DAG may pass them: rendered natively, or as text."""

from __future__ import annotations

from typing import Any

from airflow.sdk.exceptions import AirflowFailException


def flag(name: str, value: Any) -> bool:
    """A boolean option as rendered (native), or as a plain text true/false; else an error.

    `bool("False")` is True: a Param that reached the operator unrendered must not turn
    into the opposite of what the user chose (a takeover fences the running job).
    """
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "false"):
        return text == "true"
    raise AirflowFailException(f"{name} must be true or false, got {value!r}")
