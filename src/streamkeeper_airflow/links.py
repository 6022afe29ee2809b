"""Extra links on the streamkeeper operators' task pages: the job on the operations page,
and the driver's Spark UI.

Airflow 3 computes each link in the worker when the task ends (`get_link` with the live
operator) and keeps it in an XCom the UI reads, so a link says where things were when
the task ran. The Spark UI's address is the one the driver put in its heartbeat (none
when `spark.ui.enabled` is false, or before the driver beat: the link is then empty).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey


def operations_page_url(job: str) -> str:
    """The job on the operations page, below Airflow's own address (`[api] base_url`;
    unset: a path on the same host)."""
    from streamkeeper_airflow.ui import URL_PREFIX

    try:
        from airflow.sdk import conf

        base = (conf.get("api", "base_url", fallback="") or "").rstrip("/")
    except Exception:  # noqa: BLE001 - outside a configured Airflow: same host
        base = ""
    return f"{base}{URL_PREFIX}/#job={quote(job, safe='')}"


class StreamingJobLink(BaseOperatorLink):
    """The job on the operations page (status, checkpoints, savepoints, upgrades)."""

    name = "Streaming job"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        job = getattr(operator, "job", None)
        return operations_page_url(str(job)) if job else ""


class SparkUILink(BaseOperatorLink):
    """The Spark UI of the job's current driver, as its heartbeat gives it."""

    name = "Spark UI"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        from streamkeeper_airflow.hooks.streamkeeper import StreamkeeperHook

        job: Any = getattr(operator, "job", None)
        if not job:
            return ""
        hook = StreamkeeperHook(operator.conn_id, root=operator.root)  # type: ignore[attr-defined]
        report = hook.status(str(job), missing_ok=True)
        runner = None if report is None else report.runner
        return (runner.spark_ui or "") if runner is not None else ""


JOB_LINKS = (StreamingJobLink(), SparkUILink())
