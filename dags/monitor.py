"""Monitor DAGs, one per job spec in jobs/: `{job}.monitor` (alert; restart a FAILED job).

Run on each health change of the job (its `{job}.health` asset, watched in the
triggerer) and once a day as a safety net; `airflow.monitor: schedule` polls on a cron.

Thin: the DAGs are built by streamkeeper_airflow.dag_factory from the specs in
`[streamkeeper] jobs_folder` (default: this repository's jobs/).
"""

from __future__ import annotations

from pathlib import Path

from streamkeeper_airflow.dag_factory import generate

JOBS = Path(__file__).resolve().parents[1] / "jobs"
globals().update(generate("monitor", default_jobs_folder=JOBS))
