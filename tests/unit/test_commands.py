"""Commands over the control plane, on local storage: sent twice, run once; answered
once; claimed by a runner that died, answered by the next; never executed by a fenced
runner; and the CLI's refusals."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from streamkeeper.cli import app
from streamkeeper.client import StreamkeeperClient
from streamkeeper.errors import CommandError, FencedError
from streamkeeper.lineage.commands import Command, CommandBox
from streamkeeper.lineage.control import ControlPlane, Fence
from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.runtime.commands import CommandExecutor, Outcome
from streamkeeper.storage import LocalStore, Location

JOB = "keyed-totals"


class Runner:
    """A runner's command side: its own epoch, and handlers that count executions."""

    def __init__(self, root: Path) -> None:
        self.store = LocalStore(root)
        self.layout = LineageLayout(Location(str(root)), JOB, JOB)
        self.control = ControlPlane(self.store, self.layout)
        self.fence = Fence(self.control, self.control.acquire(takeover=True))
        self.executed: list[str] = []
        self.executor = CommandExecutor(
            CommandBox(self.store, self.layout),
            self.fence,
            handlers={
                "savepoint": self._savepoint,
                "stop": lambda c: self._record(c, Outcome(deferred=True)),
                "cancel": lambda c: self._record(c, Outcome(deferred=True)),
            },
            interval=0.0,
        )

    def _savepoint(self, command: Command) -> Outcome:
        return self._record(command, Outcome(savepoint_id=f"sp-for-{command.id}"))

    def _record(self, command: Command, outcome: Outcome) -> Outcome:
        self.executed.append(command.id)
        return outcome


@pytest.fixture
def root(tmp_path: Path) -> Path:
    record = {"job": JOB, "lineage": JOB, "tables": {}}
    (tmp_path / "jobs" / JOB).mkdir(parents=True)
    (tmp_path / "jobs" / JOB / "job.json").write_text(json.dumps(record))
    return tmp_path


def test_the_same_command_sent_twice_runs_once(root: Path) -> None:
    client = StreamkeeperClient(str(root))
    first = client.send_command(JOB, "savepoint", command_id="nightly-1")
    again = client.send_command(JOB, "savepoint", command_id="nightly-1")  # a retried sender
    assert again == first
    runner = Runner(root)
    runner.executor.poll()
    runner.executor.poll()
    assert runner.executed == ["nightly-1"]
    result = client.wait_for_result(JOB, "nightly-1", timeout=5)
    assert result.ok and result.savepoint_id == "sp-for-nightly-1" and result.epoch == 1
    # Acknowledged: gone from the folder the runner lists, still readable from the log.
    assert CommandBox(runner.store, runner.layout).pending() == []
    assert not (root / "jobs" / JOB / "commands" / "nightly-1.json").exists()
    assert client.command_result(JOB, "nightly-1") == result
    # Sent once more after all that: still the one command, never executed again.
    assert client.send_command(JOB, "savepoint", command_id="nightly-1").id == "nightly-1"
    Runner(root).executor.poll()
    assert client.command_result(JOB, "nightly-1") == result


def test_an_id_reused_for_another_command_is_refused(root: Path) -> None:
    client = StreamkeeperClient(str(root))
    client.send_command(JOB, "savepoint", command_id="x1")
    with pytest.raises(CommandError, match="'x1' of job 'keyed-totals' was already used"):
        client.send_command(JOB, "stop", command_id="x1")
    with pytest.raises(CommandError, match="is not valid"):
        client.send_command(JOB, "savepoint", command_id="../escape")
    with pytest.raises(CommandError, match="format 'binary' is unknown"):
        client.send_command(JOB, "savepoint", format="binary")


def test_a_later_runner_never_executes_what_an_earlier_one_did(root: Path) -> None:
    client = StreamkeeperClient(str(root))
    sent = client.send_command(JOB, "savepoint")
    first = Runner(root)
    first.executor.poll()
    # The result's publication was lost: the log has it, the commands folder does not.
    (root / "jobs" / JOB / "commands" / f"{sent.id}.result.json").unlink()
    second = Runner(root)
    second.executor.poll()
    assert second.executed == []
    assert client.command_result(JOB, sent.id).savepoint_id == f"sp-for-{sent.id}"  # type: ignore[union-attr]


def test_a_command_claimed_by_a_runner_that_died_is_answered_failed(root: Path) -> None:
    client = StreamkeeperClient(str(root))
    sent = client.send_command(JOB, "savepoint")
    dead = Runner(root)
    box = CommandBox(dead.store, dead.layout)
    box.claim(sent.to_json(), sent.id, dead.fence.epoch)  # then SIGKILL
    second = Runner(root)
    second.executor.poll()
    assert second.executed == []
    result = client.wait_for_result(JOB, sent.id, timeout=5)
    assert result.state == "failed" and result.error == "Interrupted"
    assert f"runner epoch {dead.fence.epoch} claimed it" in (result.reason or "")


def test_a_fenced_runner_neither_executes_nor_answers(root: Path) -> None:
    client = StreamkeeperClient(str(root))
    old = Runner(root)
    Runner(root)  # takes the next epoch
    sent = client.send_command(JOB, "savepoint")
    with pytest.raises(FencedError):
        old.executor.poll()
    assert old.executed == [] and client.command_result(JOB, sent.id) is None


def test_expired_and_malformed_commands_are_answered_failed(root: Path) -> None:
    client = StreamkeeperClient(str(root))
    old = client.send_command(JOB, "savepoint", command_id="late", ttl=0.001)
    time.sleep(0.01)
    folder = root / "jobs" / JOB / "commands"
    (folder / "bad.json").write_text(json.dumps({"id": "bad", "kind": "reboot", "job": JOB}))
    runner = Runner(root)
    runner.executor.poll()
    assert runner.executed == []
    late = client.command_result(JOB, old.id)
    assert late is not None and late.error == "Expired" and "send it again" in (late.reason or "")
    bad = client.command_result(JOB, "bad")
    assert bad is not None and bad.state == "failed"
    assert "command kind 'reboot' is unknown" in (bad.reason or "")


def test_a_stop_is_answered_once_the_query_stopped(root: Path) -> None:
    client = StreamkeeperClient(str(root))
    stop = client.send_command(JOB, "stop")
    later = client.send_command(JOB, "savepoint")
    runner = Runner(root)
    runner.executor.poll()
    assert runner.executed == [stop.id]  # nothing after a stop runs in this run
    assert client.command_result(JOB, stop.id) is None
    runner.executor.finish_deferred(True, "stopped with savepoint sp-1")
    result = client.command_result(JOB, stop.id)
    assert result is not None and result.ok and result.reason == "stopped with savepoint sp-1"
    assert "until_stopped" in result.timings
    assert CommandBox(runner.store, runner.layout).pending() == [later.id]


def test_cli_refuses_commands_for_unknown_or_stopped_jobs_and_bad_options(root: Path) -> None:
    runner = CliRunner(env={"COLUMNS": "300"})
    base = ["--root", str(root)]
    result = runner.invoke(app, ["savepoint", "no-such-job", *base])
    assert result.exit_code == 2 and "no job 'no-such-job'" in result.output
    result = runner.invoke(app, ["savepoint", JOB, *base, "--format", "binary"])
    assert result.exit_code == 2 and "expected native or canonical" in result.output
    result = runner.invoke(app, ["stop", JOB, *base])  # never started: no runner
    assert result.exit_code == 2 and "is not running" in result.output
    assert not (root / "jobs" / JOB / "commands").exists()  # nothing queued for nobody
