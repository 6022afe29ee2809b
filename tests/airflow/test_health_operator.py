"""The monitor's check task: what makes it fail, and what its failure says to do."""

from __future__ import annotations

from pathlib import Path

import pytest
from airflow.exceptions import AirflowFailException

from streamkeeper.storage import LocalStore
from streamkeeper_airflow.operators.health import JobHealthOperator
from tests.unit.test_client import JOB, NOW, write_control_plane


def test_a_rollback_left_halfway_fails_the_check_saying_what_to_start(
    tmp_path: Path, conn_env: object
) -> None:
    root = write_control_plane(tmp_path / "data")
    conn_id = conn_env("sk_health", str(root))  # type: ignore[operator]
    check = JobHealthOperator(task_id="check", job=JOB, conn_id=conn_id)
    payload = check.execute({})  # type: ignore[arg-type]
    assert (payload["state"], payload["healthy"], payload["rewind_pending"]) == (
        "STOPPED",
        True,
        None,
    )

    pending = {"savepoint": "sp-0042", "seq": 30, "epoch": 7, "at": NOW, "marker_seq": 41}
    LocalStore(root).write_json(f"jobs/{JOB}/rewind-pending.json", pending)
    with pytest.raises(AirflowFailException) as failed:
        check.execute({})  # type: ignore[arg-type]
    message = str(failed.value)
    assert message.startswith(f"job {JOB!r} is STOPPED: a rollback restored the tables")
    assert "--from-savepoint sp-0042 --takeover" in message
