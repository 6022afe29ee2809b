"""Rollback DAGs, one per job spec in jobs/: `{job}.rollback` (manual).

Thin: the DAGs are built by streamkeeper_airflow.dag_factory from the specs in
`[streamkeeper] jobs_folder` (default: this repository's jobs/).
"""

from __future__ import annotations

from pathlib import Path

from streamkeeper_airflow.dag_factory import generate

JOBS = Path(__file__).resolve().parents[1] / "jobs"
globals().update(generate("rollback", default_jobs_folder=JOBS))
