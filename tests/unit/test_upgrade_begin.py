"""The upgrade's begin against a control plane written here (what a runner leaves):
it does not refuse a job whose heartbeat was lost only lately and comes back."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from streamkeeper.client import StreamkeeperClient
from streamkeeper.lineage.commands import CommandBox, CommandResult
from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.storage import LocalStore, Location
from streamkeeper.upgrade.record import UpgradeError
from streamkeeper.upgrade.steps import begin_upgrade
from tests.unit.test_client import JOB, write_control_plane


def _beat(root: Path, state: str, seconds_ago: float) -> None:
    write_control_plane(
        root, seqs=range(3), heartbeat={"state": state, "time": time.time() - seconds_ago}
    )


def _blue_answers_late(root: Path, done: threading.Event) -> None:
    """Blue, cut off from storage, beats again after a second, then answers the savepoint
    command (failed: what it says is the test's, the begin's refusal is not)."""
    time.sleep(1.0)
    _beat(root, "RUNNING", seconds_ago=0)
    box = CommandBox(LocalStore(root), LineageLayout(Location(str(root)), JOB, JOB))
    deadline = time.monotonic() + 20
    while not box.pending() and time.monotonic() < deadline:
        time.sleep(0.05)
    (command_id,) = box.pending()
    record, claimed = box.claim({}, command_id, epoch=3)
    assert claimed
    box.answer(
        record,
        CommandResult(command_id, "savepoint", "failed", error="X", reason="blue's answer"),
    )
    done.set()


def test_begin_waits_out_a_lately_lost_heartbeat_and_asks_blue(tmp_path: Path) -> None:
    _beat(tmp_path, "RUNNING", seconds_ago=35)  # presumed dead: 5 s past the 30 s limit
    client = StreamkeeperClient(str(tmp_path))
    assert client.status(JOB).heartbeat_lost
    answered = threading.Event()
    blue = threading.Thread(target=_blue_answers_late, args=(tmp_path, answered), daemon=True)
    blue.start()
    with pytest.raises(UpgradeError, match="blue's savepoint failed \\(blue's answer\\)"):
        begin_upgrade(
            client, JOB, "up-1", green_spec_path="v2.yaml", blue_spec_path=None, timeout=20
        )
    blue.join(5)
    assert answered.is_set()


def test_begin_refuses_a_stopped_job_at_once(tmp_path: Path) -> None:
    _beat(tmp_path, "STOPPED", seconds_ago=35)
    began = time.monotonic()
    with pytest.raises(UpgradeError, match="is STOPPED, not RUNNING"):
        begin_upgrade(
            StreamkeeperClient(str(tmp_path)),
            JOB,
            "up-1",
            green_spec_path="v2.yaml",
            blue_spec_path=None,
        )
    assert time.monotonic() - began < 5
