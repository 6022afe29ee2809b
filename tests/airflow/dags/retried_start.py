"""A start DAG (test only) whose first try gives up right after launching: its retry must
attach to the driver the first try launched, by run token, and never start a second."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from airflow.sdk import DAG, Param

from streamkeeper_airflow.dag_factory import START_DATE
from streamkeeper_airflow.operators.start import StartJobOperator

SPEC = Path(__file__).resolve().parents[3] / "jobs" / "keyed_totals" / "job.yaml"

with DAG(
    dag_id="keyed-totals.retried-start",
    schedule=None,
    start_date=START_DATE,
    render_template_as_native_obj=True,
    params={"overrides": Param({}, type="object")},
) as dag:
    StartJobOperator(
        task_id="start",
        job="keyed-totals",
        spec_path=str(SPEC),
        overrides="{{ params.overrides }}",
        start_timeout="{{ 0 if ti.try_number == 1 else 900 }}",  # try 1 gives up at once
        retries=1,
        retry_delay=timedelta(seconds=1),
    )
