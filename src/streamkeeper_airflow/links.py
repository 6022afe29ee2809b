"""Extra links on the streamkeeper operators' task pages: the job on the operations page,
the driver's Spark UI and the driver's log.

Airflow 3 computes each link in the worker when the task ends (`get_link` with the live
operator) and keeps it in an XCom the UI reads, so a link says where things were when
the task ran. The Spark UI's address is the one the driver put in its heartbeat (none
when `spark.ui.enabled` is false, or before the driver beat: the link is then empty).
The driver's log is served by the operations page (ui/driver_log.py), behind Airflow's
login and the job's DAG permissions like the rest of the page.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey


def _page_base() -> str:
    """The operations page below Airflow's own address (`[api] base_url`; unset: a path
    on the same host)."""
    from streamkeeper_airflow.ui import URL_PREFIX

    try:
        from airflow.sdk import conf

        base = (conf.get("api", "base_url", fallback="") or "").rstrip("/")
    except Exception:  # noqa: BLE001 - outside a configured Airflow: same host
        base = ""
    return f"{base}{URL_PREFIX}"


def operations_page_url(job: str) -> str:
    """The job on the operations page."""
    return f"{_page_base()}/#job={quote(job, safe='')}"


def driver_log_url(job: str) -> str:
    """The tail of the job's driver log, as the operations page serves it."""
    return f"{_page_base()}/api/jobs/{quote(job, safe='')}/driver-log"


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


class DriverLogLink(BaseOperatorLink):
    """The tail of the job's driver log (the latest launch's), on the operations page."""

    name = "Driver log"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        job = getattr(operator, "job", None)
        return driver_log_url(str(job)) if job else ""


JOB_LINKS = (StreamingJobLink(), SparkUILink(), DriverLogLink())
