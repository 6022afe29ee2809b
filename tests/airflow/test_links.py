"""The operators' extra links: the job on the operations page, the driver's Spark UI and
log."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamkeeper_airflow.links import DriverLogLink, SparkUILink, StreamingJobLink
from streamkeeper_airflow.operators.commands import SavepointOperator
from streamkeeper_airflow.operators.health import JobHealthOperator
from streamkeeper_airflow.operators.start import StartJobOperator
from tests.unit.test_client import JOB, write_control_plane


def test_the_job_link_points_at_the_operations_page_below_airflows_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    operator = JobHealthOperator(task_id="check", job="orders & co")
    link = StreamingJobLink().get_link(operator, ti_key=None)  # type: ignore[arg-type]
    assert link == "/streamkeeper/#job=orders%20%26%20co"
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example.com/af/")
    link = StreamingJobLink().get_link(operator, ti_key=None)  # type: ignore[arg-type]
    assert link == "https://airflow.example.com/af/streamkeeper/#job=orders%20%26%20co"


def test_the_spark_ui_link_is_the_drivers_from_its_heartbeat(
    conn_env: object, local_root: Path
) -> None:
    conn_env("sk_links", str(local_root))  # type: ignore[operator]
    operator = SavepointOperator(task_id="savepoint", job=JOB, conn_id="sk_links")
    assert SparkUILink().get_link(operator, ti_key=None) == ""  # type: ignore[arg-type]
    write_control_plane(local_root, seqs=range(2), heartbeat={"spark_ui": "http://h1:4041"})
    assert SparkUILink().get_link(operator, ti_key=None) == "http://h1:4041"  # type: ignore[arg-type]
    never = SavepointOperator(task_id="other", job="never-ran", conn_id="sk_links")
    assert SparkUILink().get_link(never, ti_key=None) == ""  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "operator",
    [
        StartJobOperator(task_id="start", job=JOB, spec_path="/jobs/x/job.yaml"),
        SavepointOperator(task_id="savepoint", job=JOB),
        JobHealthOperator(task_id="check", job=JOB),
    ],
    ids=lambda o: type(o).__name__,
)
def test_the_job_operators_carry_the_three_links(operator: object) -> None:
    names = [link.name for link in operator.operator_extra_links]  # type: ignore[attr-defined]
    assert names == ["Streaming job", "Spark UI", "Driver log"]


def test_the_driver_log_link_is_the_pages_route_below_airflows_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    operator = JobHealthOperator(task_id="check", job="orders & co")
    link = DriverLogLink().get_link(operator, ti_key=None)  # type: ignore[arg-type]
    assert link == "/streamkeeper/api/jobs/orders%20%26%20co/driver-log"
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example.com/af/")
    link = DriverLogLink().get_link(operator, ti_key=None)  # type: ignore[arg-type]
    assert (
        link == "https://airflow.example.com/af/streamkeeper/api/jobs/orders%20%26%20co/driver-log"
    )
