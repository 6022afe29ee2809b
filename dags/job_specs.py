"""Checks the job specs the DAGs are generated from; defines no DAG.

A spec that does not validate (or repeats another job's name) gets no DAGs, so its job
has no monitor and no alerts: this file then fails to import, and Airflow shows, as
its import error on the DAG list, every such spec with the field and the fix. The
other DAG files keep every valid job's DAGs.
"""

from __future__ import annotations

from pathlib import Path

from streamkeeper_airflow.dag_factory import check_specs

JOBS = Path(__file__).resolve().parents[1] / "jobs"
check_specs(default_jobs_folder=JOBS)
