"""The status payload triggers send and operators return (and so push to XCom).

A subset of `streamkeeper status --json` (field names as the README documents them):
what a downstream task or a person needs, and nothing that could hold a credential.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from streamkeeper_airflow.secrets import redact_value

if TYPE_CHECKING:
    from streamkeeper.client import StatusReport

_STATUS_FIELDS = (
    "job",
    "lineage",
    "state",
    "healthy",
    "reason",
    "last_committed_seq",
    "last_committed_batch",
    "last_commit_at",
    "consecutive_failures",
    "rewind_pending",
    "checked_at",
)
_RUNNER_FIELDS = ("state", "reason", "pid", "host", "epoch", "heartbeat_at", "run_token")


def status_payload(report: StatusReport | None, job: str | None = None) -> dict[str, Any]:
    """The job's status as a small JSON object; `state` UNKNOWN for a job that never ran."""
    if report is None:
        return {"job": job, "state": "UNKNOWN", "healthy": None, "reason": "never ran here"}
    data = report.to_json()
    payload = {name: data.get(name) for name in _STATUS_FIELDS}
    runner = data.get("runner")
    payload["runner"] = None if runner is None else {k: runner.get(k) for k in _RUNNER_FIELDS}
    return redact_value(payload)
