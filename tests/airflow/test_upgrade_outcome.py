"""What an upgrade DAG run leaves when a task before the handover fails for good, and the
begin task's upgrade id across its tries (no Spark: a control plane written by hand)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException

from streamkeeper.client import StreamkeeperClient
from streamkeeper.upgrade.record import UpgradeRecord, UpgradeRecords
from streamkeeper.upgrade.shadow import check_upgrade_id
from streamkeeper_airflow.operators.upgrade import UpgradeOutcomeOperator, upgrade_id_for
from streamkeeper_airflow.starts import run_token_for
from tests.unit.test_client import JOB, write_control_plane

UPGRADE = "up-20261126t120000-0a1b2c3d"


@pytest.fixture
def plane(conn_env: Any, local_root: Path) -> StreamkeeperClient:
    conn_env("sk_outcome", str(local_root))
    write_control_plane(local_root, seqs=range(3), history_files=1)
    return StreamkeeperClient(str(local_root))


def _record(client: StreamkeeperClient, phase: str) -> UpgradeRecords:
    records = UpgradeRecords(client.store, JOB)
    records.create(
        UpgradeRecord(
            id=UPGRADE,
            job=JOB,
            lineage=JOB,
            phase=phase,  # type: ignore[arg-type]
            blue={"savepoint": "sp-0"},
            green={"shadow_job": f"{JOB}-shadow-0a1b2c3d"},
        )
    )
    return records


def _outcome() -> UpgradeOutcomeOperator:
    return UpgradeOutcomeOperator(
        task_id="outcome", job=JOB, conn_id="sk_outcome", upgrade_id=UPGRADE
    )


def test_an_upgrade_left_in_its_shadow_phase_is_rejected_by_the_outcome(
    plane: StreamkeeperClient,
) -> None:
    """start_green or validate failed for good: the shadow run must not run for ever."""
    records = _record(plane, "shadow")
    with pytest.raises(AirflowFailException, match="ended rejected: the upgrade's run ended"):
        _outcome().execute({})
    record = records.read(UPGRADE)
    assert record.phase == "rejected" and "blue runs untouched" in str(record.reason)


def test_an_upgrade_past_the_handover_is_left_as_it_is(plane: StreamkeeperClient) -> None:
    """Live without a verdict: green may be the job by now; the outcome decides nothing."""
    records = _record(plane, "live")
    with pytest.raises(AirflowFailException, match="ended live"):
        _outcome().execute({})
    assert records.read(UPGRADE).phase == "live"


def test_every_try_of_the_begin_task_names_the_same_upgrade() -> None:
    token = run_token_for("keyed-totals.upgrade", "manual__1", "begin")
    run = SimpleNamespace(run_after=datetime(2026, 11, 26, 12, 0, 1, tzinfo=UTC), start_date=None)
    first = upgrade_id_for(token, {"dag_run": run})  # type: ignore[arg-type]
    assert first == upgrade_id_for(token, {"dag_run": run})  # type: ignore[arg-type]
    assert first == f"up-20261126t120001-{token[-8:]}"
    assert check_upgrade_id(first) == first
    other = run_token_for("keyed-totals.upgrade", "manual__2", "begin")
    assert upgrade_id_for(other, {"dag_run": run}) != first  # type: ignore[arg-type]
