"""The upgrade's quality gate reads tables on S3 with the connection's credentials.

Found by the fault run (benchmarks/fault_run.py): on S3, with the credentials only in
the Airflow connection (as deployments keep them), the validate task failed with
delta-rs looking for credentials in the worker's environment (IMDS), so no upgrade
could pass its gate; the comparison beside it, which reads through the hook's client,
worked.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from streamkeeper.storage import Location, S3Settings
from streamkeeper.upgrade.record import UpgradeRecord
from streamkeeper_airflow.operators.upgrade import run_quality_gate

pytestmark = [pytest.mark.integration, pytest.mark.s3]

SUITE = Path(__file__).resolve().parents[2] / "jobs" / "keyed_totals" / "expectations.yaml"


def test_the_quality_gate_reads_s3_tables_with_the_connections_credentials(
    seaweed: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3 = S3Settings(
        endpoint_url=seaweed.endpoint_url,  # type: ignore[attr-defined]
        access_key=seaweed.access_key,  # type: ignore[attr-defined]
        secret_key=seaweed.secret_key,  # type: ignore[attr-defined]
        allow_http=True,
    )
    uri = f"s3://{seaweed.bucket}/quality-gate/tables/totals"  # type: ignore[attr-defined]
    rows = pa.table({"key": ["k0001", "k0002"], "events": [1, 2], "total": [5, 7]})
    write_deltalake(uri, rows, storage_options=Location(uri, s3).storage_options())
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)  # a worker holds no credential of its own
    record = UpgradeRecord("up-1", "keyed-totals", "keyed-totals", "shadow", {}, {})
    monkeypatch.setenv("AIRFLOW__STREAMKEEPER__JOBS_FOLDER", str(SUITE.parents[1]))

    quality = run_quality_gate(
        str(SUITE), record, {"totals": (uri, None)}, logging.getLogger("test"), s3
    )

    assert quality is not None and quality["success"], quality
