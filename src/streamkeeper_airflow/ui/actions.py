"""The page's actions: which lifecycle DAG each one triggers, and with which Params.

Every action is a DAG run (`{job}.savepoint`, `.stop`, `.start`, `.upgrade`,
`.rollback`, see `dag_factory`), never a command written to the control plane from the
web server: the run is recorded, retried, alerted on and authorised like any other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Action = Literal["savepoint", "stop", "restart", "upgrade", "rollback"]
FORMATS = ("native", "canonical")


@dataclass(frozen=True)
class DagRunRequest:
    """The DAG run an action asks Airflow for."""

    dag_id: str
    conf: dict[str, Any]


def _format(options: dict[str, Any]) -> str:
    chosen = options.get("format") or "native"
    if chosen not in FORMATS:
        raise ValueError(f"Invalid savepoint format {chosen!r}; expected native or canonical")
    return str(chosen)


def _required(options: dict[str, Any], key: str, what: str) -> str:
    value = options.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"Missing {key!r}: {what}")
    return value.strip()


def dag_run_for(job: str, action: str, options: dict[str, Any]) -> DagRunRequest:
    """The DAG run of `action` on `job`, with the Params the page's form gave.

    Raises:
        ValueError: an unknown action or a bad option (names it and what is expected).
    """
    if action == "savepoint":
        conf = {"format": _format(options), "self_contained": bool(options.get("self_contained"))}
        return DagRunRequest(f"{job}.savepoint", conf)
    if action == "stop":
        conf = {"mode": "stop", "savepoint": True, "format": _format(options)}
        return DagRunRequest(f"{job}.stop", conf)
    if action == "restart":
        # The newest checkpoint, local or externalized; a live runner is fenced only if asked.
        conf = {"start_from": "latest_checkpoint", "takeover": bool(options.get("takeover"))}
        return DagRunRequest(f"{job}.start", conf)
    if action == "upgrade":
        spec = _required(options, "green_spec_path", "the job spec of the new version")
        return DagRunRequest(f"{job}.upgrade", {"green_spec_path": spec})
    if action == "rollback":
        savepoint = _required(options, "savepoint_id", "the savepoint to roll back to")
        return DagRunRequest(f"{job}.rollback", {"savepoint_id": savepoint})
    raise ValueError(
        f"Invalid action {action!r}; expected savepoint, stop, restart, upgrade or rollback"
    )


def lifecycle_dag_ids(job: str) -> list[str]:
    """The job's DAGs whose runs the page lists."""
    return [f"{job}.{a}" for a in ("start", "savepoint", "stop", "upgrade", "rollback")]
