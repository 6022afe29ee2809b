"""The reliability and security suite (issue 10): bad input, faults, secrets.

Some of its tests build Airflow DAGs and operators (never a metadata DB): Airflow reads
AIRFLOW_HOME when it is first imported, so this process gets a fresh home first, unless
tests/airflow's conftest already gave it one.
"""

from __future__ import annotations

import os
import tempfile

import pytest

if "sk-airflow-home-" not in os.environ.get("AIRFLOW_HOME", ""):
    os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="sk-airflow-home-")
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "corpus: the bad-input corpus (tests/reliability/test_bad_input_corpus.py)"
    )
