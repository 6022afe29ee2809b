"""Triggers: serialize/deserialize round trips (as the triggerer stores and rebuilds them),
and their runs against a control plane written by hand (no Spark)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from airflow.sdk.serde import deserialize, serialize
from airflow.triggers.base import BaseTrigger, TriggerEvent

from streamkeeper.lineage.driver_beat import BEAT_STALE_AFTER, beat_key
from streamkeeper.storage import LocalStore
from streamkeeper_airflow.triggers.base import Check, ControlPlaneTrigger
from streamkeeper_airflow.triggers.checkpoints import CheckpointProgressTrigger, JobHealthyTrigger
from streamkeeper_airflow.triggers.commands import CommandResultTrigger
from tests.airflow.conftest import CANARY_KEY, CANARY_SECRET
from tests.unit.test_client import JOB, write_control_plane

if TYPE_CHECKING:
    from streamkeeper_airflow.hooks.streamkeeper import StreamkeeperHook

COMMON: dict[str, Any] = {
    "conn_id": "sk_trig",
    "job": JOB,
    "root": None,
    "poll_interval": 0.05,
    "deadline": None,
    "settle": 0.0,
    "tolerated_failures": 2,
}
TRIGGERS: list[tuple[type[ControlPlaneTrigger], dict[str, Any]]] = [
    (
        CheckpointProgressTrigger,
        {
            "baseline_seq": 4,
            "new_checkpoints": 2,
            "run_token": "af-abc",
            "after_epoch": 3,
            "driver": {"pid": 1, "host": "h", "process_started_at": 1.5, "log": "/l"},
        },
    ),
    (
        JobHealthyTrigger,
        {"started_at": 1.0, "probation": 30.0, "epoch": 4, "tolerate_degraded": True},
    ),
    (CommandResultTrigger, {"command_id": "savepoint-af-1", "kind": "savepoint"}),
]


def _import(classpath: str) -> type[BaseTrigger]:
    from airflow._shared.module_loading import import_string

    return import_string(classpath)


@pytest.mark.parametrize(("cls", "own"), TRIGGERS, ids=lambda v: getattr(v, "__name__", ""))
def test_a_trigger_survives_the_triggerers_round_trip(
    cls: type[ControlPlaneTrigger], own: dict[str, Any]
) -> None:
    trigger = cls(**COMMON, **own)
    classpath, kwargs = trigger.serialize()
    assert kwargs == {**COMMON, **own}  # serialize() and __init__ match
    stored = deserialize(serialize(kwargs))  # what Trigger.encrypt/decrypt_kwargs do
    rebuilt = _import(classpath)(**stored)
    assert rebuilt.serialize() == (classpath, kwargs)
    assert CANARY_SECRET not in repr(rebuilt)


def test_trigger_modules_import_without_pyspark_or_boto3() -> None:
    code = (
        "import sys, streamkeeper_airflow.triggers.checkpoints, "
        "streamkeeper_airflow.triggers.commands, streamkeeper_airflow.triggers.commits;"
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'pyspark', 'boto3', 'botocore', 'great_expectations', 'deltalake', 'pyarrow'}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=os.environ, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def _run(trigger: BaseTrigger) -> dict[str, Any]:
    async def first() -> TriggerEvent:
        return await anext(trigger.run())

    return asyncio.run(first()).payload


@pytest.fixture
def plane(conn_env: object, local_root: Path) -> Path:
    conn_env("sk_trig", str(local_root))  # type: ignore[operator]
    return local_root


def _beat(root: Path, **fields: Any) -> None:
    write_control_plane(
        root,
        seqs=range(6),
        history_files=1,
        heartbeat={"time": time.time(), "state": "RUNNING", "epoch": 4, **fields},
    )


def test_progress_counts_committed_checkpoints_of_the_followed_runner(plane: Path) -> None:
    _beat(plane, run_token="af-abc")
    args = {**COMMON, "baseline_seq": 3, "run_token": "af-abc", "after_epoch": 3}
    done = _run(CheckpointProgressTrigger(**args, new_checkpoints=2))
    assert done["status"] == "success", done
    assert done["new_checkpoints"] == [4, 5] and done["run_token"] == "af-abc"
    assert done["status_report"]["runner"]["epoch"] == 4
    assert CANARY_SECRET not in repr(done) and CANARY_KEY not in repr(done)

    waiting = _run(
        CheckpointProgressTrigger(**{**args, "deadline": time.time() + 0.3}, new_checkpoints=3)
    )
    assert waiting["status"] == "error" and "gave up waiting at the deadline" in waiting["message"]
    assert "2/3 new checkpoint(s) after 3" in waiting["message"]


def test_progress_ignores_the_heartbeat_of_an_earlier_run(plane: Path) -> None:
    _beat(plane, state="FAILED", reason="QueryFailedError: boom", run_token="af-old")
    pending = _run(
        CheckpointProgressTrigger(
            **{**COMMON, "deadline": time.time() + 0.3},
            run_token="af-new",
            after_epoch=4,
            new_checkpoints=0,
        )
    )
    assert "waiting for the first heartbeat" in pending["message"]  # not the old FAILED


def _driver_beat(root: Path, token: str, **fields: Any) -> None:
    """The beat a driver on another host wrote (its pid and host mean nothing here)."""
    record = {"token": token, "job": JOB, "host": "gateway-7", "pid": 999_999_999, **fields}
    LocalStore(root).write_json(beat_key(token), record)


def test_progress_fails_fast_when_its_driver_ended_before_beating(plane: Path) -> None:
    _beat(plane, run_token="af-old")
    driver = {"host": "gateway-7", "log": "/x/driver.log", "launched_at": time.time()}
    _driver_beat(plane, "af-new", state="exited", time=time.time(), exit_code=2, error="bad spec")
    failed = _run(
        CheckpointProgressTrigger(
            **COMMON, run_token="af-new", after_epoch=4, new_checkpoints=0, driver=driver
        )
    )
    assert failed["status"] == "error"
    assert "exited on gateway-7 (exit 2): bad spec" in failed["message"]
    assert "see its log /x/driver.log" in failed["message"]
    # Killed while booting, on a host this process cannot see: its beat goes stale.
    _driver_beat(plane, "af-new", state="booting", time=time.time() - BEAT_STALE_AFTER - 5)
    stale = _run(
        CheckpointProgressTrigger(
            **COMMON, run_token="af-new", after_epoch=4, new_checkpoints=0, driver=driver
        )
    )
    assert stale["status"] == "error" and "stopped beating" in stale["message"]


def test_progress_waits_for_a_booting_driver_on_another_host(plane: Path) -> None:
    """A fresh beat keeps the wait going, whatever host and pid it names."""
    _beat(plane, run_token="af-old")
    _driver_beat(plane, "af-new", state="booting", time=time.time())
    pending = _run(
        CheckpointProgressTrigger(
            **{**COMMON, "deadline": time.time() + 0.3},
            run_token="af-new",
            after_epoch=4,
            new_checkpoints=0,
            driver={"host": "gateway-7", "log": "/x/driver.log", "launched_at": time.time()},
        )
    )
    assert "waiting for the first heartbeat" in pending["message"]


def test_progress_fails_when_a_launched_driver_never_beats(plane: Path) -> None:
    _beat(plane, run_token="af-old")
    launched_at = time.time() - 3600  # far past the first-beat grace, no beat ever
    failed = _run(
        CheckpointProgressTrigger(
            **COMMON,
            run_token="af-new",
            after_epoch=4,
            new_checkpoints=0,
            driver={"host": "gateway-7", "log": "/x/driver.log", "launched_at": launched_at},
        )  # fmt: skip
    )
    assert failed["status"] == "error" and "never beat in the 3600s" in failed["message"]


def test_progress_fails_when_the_followed_runner_fails(plane: Path) -> None:
    _beat(plane, state="FAILED", reason="SourceError: gone", run_token="af-abc")
    failed = _run(CheckpointProgressTrigger(**COMMON, run_token="af-abc", after_epoch=3))
    assert failed["status"] == "error" and "FAILED" in failed["message"]
    assert "SourceError: gone" in failed["message"]


def test_progress_waits_for_a_runner_lost_lately_and_fails_one_lost_past_the_grace(
    plane: Path,
) -> None:
    """A heartbeat 35 s old is lost (30 s), but its runner may be cut off from storage
    and beat again: the wait goes on. One 61 s old is past the 30 s grace: it failed."""
    args = {**COMMON, "run_token": "af-abc", "after_epoch": 3, "new_checkpoints": 0}
    _beat(plane, run_token="af-abc", time=time.time() - 35)
    pending = _run(CheckpointProgressTrigger(**{**args, "deadline": time.time() + 0.3}))
    assert pending["status"] == "error" and "gave up waiting at the deadline" in pending["message"]
    assert "heartbeat lost" in pending["message"]  # what it waited on, named
    _beat(plane, run_token="af-abc", time=time.time() - 61)
    failed = _run(CheckpointProgressTrigger(**{**args, "deadline": time.time() + 30}))
    assert failed["status"] == "error" and "is FAILED before" in failed["message"]


def test_healthy_passes_a_probation_and_fails_on_a_new_runner(plane: Path) -> None:
    _beat(plane)
    now = time.time()
    passed = _run(JobHealthyTrigger(**COMMON, started_at=now - 60, probation=30, epoch=4))
    assert passed["status"] == "success" and "stayed healthy" in passed["message"]
    changed = _run(JobHealthyTrigger(**COMMON, started_at=now, probation=30, epoch=3))
    assert changed["status"] == "error" and "changed runner during probation" in changed["message"]
    _beat(plane, consecutive_failures=1, last_failure="commit failed")
    failing = _run(JobHealthyTrigger(**COMMON, started_at=now, probation=30, epoch=4))
    assert failing["status"] == "error" and "FAILING during probation" in failing["message"]


def _answer(hook: StreamkeeperHook, command_id: str, **result: Any) -> None:
    """Answer a command as the runner does: claim it, then record and publish the result."""
    from streamkeeper.lineage.commands import CommandBox, CommandResult

    record = hook.client.job_record(JOB)
    box = CommandBox(hook.client.store, hook.client._layout(record))
    command = box.read(command_id)
    assert command is not None
    claimed, mine = box.claim(command.to_json(), command_id, epoch=4)
    assert mine
    box.answer(claimed, CommandResult(id=command_id, kind=command.kind, epoch=4, **result))


def test_a_command_result_ends_the_wait(plane: Path) -> None:
    from streamkeeper_airflow.hooks.streamkeeper import StreamkeeperHook

    _beat(plane)
    hook = StreamkeeperHook("sk_trig")
    ok_id = hook.send_command(JOB, "savepoint", command_id="savepoint-ok")
    bad_id = hook.send_command(JOB, "savepoint", command_id="savepoint-bad", format="canonical")
    assert hook.command_result(JOB, ok_id) is None  # sent, not answered
    _answer(hook, ok_id, state="ok", savepoint_id="sp-1")
    _answer(hook, bad_id, state="failed", error="SavepointError", reason="disk full")
    ok = _run(CommandResultTrigger(**COMMON, command_id=ok_id, kind="savepoint"))
    assert ok["status"] == "success" and ok["savepoint_id"] == "sp-1"
    bad = _run(CommandResultTrigger(**COMMON, command_id=bad_id, kind="savepoint"))
    assert bad["status"] == "error" and "SavepointError: disk full" in bad["message"]


def test_an_unanswered_command_is_an_error_at_the_deadline(plane: Path) -> None:
    from streamkeeper_airflow.hooks.streamkeeper import StreamkeeperHook

    _beat(plane)
    sent = StreamkeeperHook("sk_trig").send_command(JOB, "stop", command_id="stop-af-1")
    event = _run(
        CommandResultTrigger(**COMMON | {"deadline": time.time() + 1}, command_id=sent, kind="stop")
    )
    assert event["status"] == "error" and "stop-af-1" in event["message"], event


def test_an_unreachable_connection_is_an_error_event_without_the_secret(
    conn_env: object,
) -> None:
    conn_env("sk_trig", "s3://no-such-bucket/x", host="http://127.0.0.1:9")  # type: ignore[operator]
    event = _run(CheckpointProgressTrigger(**COMMON))
    assert event["status"] == "error"
    assert "Could not connect to the endpoint URL" in event["message"]
    assert CANARY_SECRET not in repr(event) and CANARY_KEY not in repr(event)


class _Scripted(ControlPlaneTrigger):
    """Polls that raise or answer as its script says (one entry a poll, then success)."""

    script: list[str] = []

    def check(self, hook: StreamkeeperHook, now: float) -> Check:
        step = self.script.pop(0) if self.script else "done"
        if step == "fail":
            raise TimeoutError(f"read timeout on s3 (secret {CANARY_SECRET})")
        return Check.waiting("not yet") if step == "wait" else Check.success("done")


def _scripted(script: list[str], **overrides: Any) -> dict[str, Any]:
    _Scripted.script = list(script)
    return _run(_Scripted(**COMMON | overrides))


def test_the_default_tolerates_fifteen_seconds_of_failed_polls() -> None:
    assert ControlPlaneTrigger(conn_id="c", job="j").tolerated_failures == 3
    # A faster poll tolerates as long an outage: more polls, the same 15 s.
    assert ControlPlaneTrigger(conn_id="c", job="j", poll_interval=1).tolerated_failures == 15
    assert ControlPlaneTrigger(conn_id="c", job="j", poll_interval=0.4).tolerated_failures == 38
    assert ControlPlaneTrigger(conn_id="c", job="j", poll_interval=60).tolerated_failures == 1
    with pytest.raises(ValueError, match="poll_interval 0 is not positive"):
        ControlPlaneTrigger(conn_id="c", job="j", poll_interval=0)
    with pytest.raises(ValueError, match="tolerated_failures -1 is negative"):
        ControlPlaneTrigger(conn_id="c", job="j", tolerated_failures=-1)


def test_failed_polls_up_to_the_tolerance_do_not_end_the_wait(
    plane: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    event = _scripted(["fail", "fail", "wait", "done"])
    assert event["status"] == "success", event
    logged = capfd.readouterr()
    warned = [line for line in (logged.out + logged.err).splitlines() if "poll failed" in line]
    assert len(warned) == 2 and "1 of 2 tolerated" in warned[0], warned
    assert "TimeoutError: read timeout on s3" in warned[0]
    assert all(CANARY_SECRET not in text for text in warned), "a secret reached the log"


def test_a_successful_poll_resets_the_count(plane: Path) -> None:
    event = _scripted(["fail", "fail", "wait", "fail", "fail", "done"])
    assert event["status"] == "success", event


def test_one_failed_poll_past_the_tolerance_is_reported_redacted(plane: Path) -> None:
    event = _scripted(["fail", "fail", "fail", "done"])
    assert event["status"] == "error", event
    assert "TimeoutError: read timeout on s3" in event["message"]
    assert "3 polls failed in a row" in event["message"]
    assert CANARY_SECRET not in repr(event)
    assert _scripted(["fail", "done"], tolerated_failures=0)["status"] == "error"


def test_failing_polls_still_end_at_the_deadline(plane: Path) -> None:
    event = _scripted(["fail"] * 50, tolerated_failures=100, deadline=time.time() + 0.3)
    assert event["status"] == "error" and "gave up waiting at the deadline" in event["message"]
    assert "the last poll failed: TimeoutError" in event["message"]


def test_a_trigger_that_fires_on_its_first_poll_logs_its_verdict_under_its_own_name(
    plane: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The triggerer's log for the task must say which trigger decided and what it saw,
    also when the job was ready at the first poll (no waiting line was logged before)."""
    _beat(plane, run_token="af-abc")
    args = {**COMMON, "baseline_seq": 3, "run_token": "af-abc", "after_epoch": 3}
    done = _run(CheckpointProgressTrigger(**args, new_checkpoints=2))
    assert done["status"] == "success", done
    logged = capfd.readouterr()
    lines = [
        line
        for line in (logged.out + logged.err).splitlines()
        if "CheckpointProgressTrigger" in line and done["message"] in line
    ]
    assert len(lines) == 1, logged
