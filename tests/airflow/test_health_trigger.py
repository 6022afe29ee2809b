"""The monitor's health watcher: an event per health change, nothing while it stays put.

The trigger runs against a control plane written by hand (no Spark), as the commit
watcher's tests do (test_commit_assets.py); the change rules are also checked on the
pure `HealthWatch`, one reading at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.serde import deserialize, serialize
from airflow.triggers.base import TriggerEvent

from streamkeeper.client import StreamkeeperClient
from streamkeeper_airflow.assets import job_health_asset
from streamkeeper_airflow.triggers.health import HealthReading, HealthWatch, JobHealthTrigger
from tests.unit.test_client import JOB, write_control_plane


@pytest.fixture
def plane(conn_env: Any, local_root: Path) -> Path:
    conn_env("sk_health", str(local_root))
    return local_root


def _job(plane: Path, state: str, *, seqs: range = range(3), epoch: int = 3, **beat: Any) -> str:
    """Write the job as a runner in `state` left it; the health its status reads."""
    now = time.time()
    heartbeat = {"state": state, "time": now, "epoch": epoch, "last_checkpoint_at": now, **beat}
    if state == "FAILED":
        heartbeat["reason"] = "OutOfMemoryError in batch 7"
    write_control_plane(plane, seqs=seqs, heartbeat=heartbeat)
    return StreamkeeperClient(str(plane)).status(JOB).state


class _Observed(JobHealthTrigger):
    """The trigger, telling the test how many polls it made and which failed."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.first_poll = threading.Event()
        self.polls = 0
        self.errors: list[Exception] = []

    def _poll(self, hook: Any) -> Any:
        try:
            return super()._poll(hook)
        except Exception as error:
            self.errors.append(error)
            raise
        finally:
            self.polls += 1
            self.first_poll.set()


def _trigger(**kwargs: Any) -> _Observed:
    return _Observed(conn_id="sk_health", job=JOB, poll_interval=0.05, **kwargs)


async def _polls(trigger: _Observed, count: int) -> None:
    polls = trigger.polls
    while trigger.polls < polls + count:
        await asyncio.sleep(0.02)


async def _events(trigger: _Observed, *moves: Any, settle: int = 3) -> list[TriggerEvent]:
    """The events while each of `moves` changes storage in turn, `settle` polls apart."""
    events = trigger.run()
    fired: list[TriggerEvent] = []

    async def collect() -> None:
        async for event in events:
            fired.append(event)

    collecting = asyncio.ensure_future(collect())
    try:
        assert await asyncio.to_thread(trigger.first_poll.wait, 30), "the trigger never polled"
        await _polls(trigger, settle)
        for move in moves:
            move()
            await _polls(trigger, settle)
    finally:
        collecting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await collecting
        await events.aclose()
    return fired


def test_the_watcher_survives_the_triggerers_round_trip() -> None:
    trigger = JobHealthTrigger(conn_id="c", job=JOB, root="/r", poll_interval=3, failed_repeat=60)
    classpath, kwargs = trigger.serialize()
    assert classpath == "streamkeeper_airflow.triggers.health.JobHealthTrigger"
    rebuilt = JobHealthTrigger(**deserialize(serialize(kwargs)))
    assert rebuilt.serialize() == (classpath, kwargs)


@pytest.mark.parametrize("name", ["poll_interval", "failed_repeat"])
def test_intervals_that_are_not_positive_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match=f"{name} 0 is not positive"):
        JobHealthTrigger(conn_id="c", job=JOB, **{name: 0})


def test_a_job_going_failed_is_one_event_and_no_change_is_none(plane: Path) -> None:
    assert _job(plane, "RUNNING") == "RUNNING"
    trigger = _trigger()
    fired = asyncio.run(
        asyncio.wait_for(
            _events(trigger, lambda: _job(plane, "FAILED"), lambda: _job(plane, "FAILED")),
            timeout=60,
        )
    )
    assert len(fired) == 1, [e.payload for e in fired]  # the baseline and the repeat: none
    payload = fired[0].payload
    assert (payload["job"], payload["event"], payload["state"]) == (JOB, "unhealthy", "FAILED")
    assert (payload["previous"], payload["previous_healthy"]) == ("RUNNING", True)
    assert "OutOfMemoryError" in payload["reason"] and payload["healthy"] is False
    assert payload["epoch"] == 3 and payload["head_seq"] == 2
    assert abs(payload["observed_at"] - time.time()) < 60


def test_a_healthy_job_fires_nothing(plane: Path) -> None:
    _job(plane, "RUNNING")
    moves = [lambda n=n: _job(plane, "RUNNING", seqs=range(n)) for n in (4, 5)]
    moves.append(lambda: _job(plane, "STOPPED", seqs=range(5)))  # healthy too
    fired = asyncio.run(asyncio.wait_for(_events(_trigger(), *moves), timeout=60))
    assert fired == []


def test_recovery_is_recorded_once_a_checkpoint_commits(plane: Path) -> None:
    """Back to RUNNING is a recovery only with a checkpoint committed since it failed: a
    driver that merely started may fail before its first one."""
    _job(plane, "FAILED")
    fired = asyncio.run(
        asyncio.wait_for(
            _events(
                _trigger(),
                lambda: _job(plane, "RUNNING", epoch=4),  # restarted, nothing committed yet
                lambda: _job(plane, "RUNNING", epoch=4, seqs=range(4)),
            ),
            timeout=60,
        )
    )
    # An unhealthy baseline fires at once: a watcher before it may not have said so.
    assert [(e.payload["event"], e.payload["previous"]) for e in fired] == [
        ("unhealthy", None),
        ("recovered", "FAILED"),
    ]
    assert fired[1].payload["state"] == "RUNNING" and fired[1].payload["head_seq"] == 3


def test_a_new_failed_runner_and_a_worse_state_are_changes(plane: Path) -> None:
    _job(plane, "RUNNING")
    fired = asyncio.run(
        asyncio.wait_for(
            _events(
                _trigger(),
                lambda: _job(plane, "RUNNING", consecutive_failures=1, tolerable_failures=3),
                lambda: _job(plane, "FAILED"),
                lambda: _job(plane, "RUNNING", epoch=4),  # restarted: not yet recovered
                lambda: _job(plane, "FAILED", epoch=4),  # the restart failed too
            ),
            timeout=60,
        )
    )
    seen = [(e.payload["state"], e.payload["previous"], e.payload["epoch"]) for e in fired]
    assert seen == [("FAILING", "RUNNING", 3), ("FAILED", "FAILING", 3), ("FAILED", "FAILED", 4)]


def test_a_job_that_stays_failed_fires_again_after_failed_repeat(plane: Path) -> None:
    _job(plane, "RUNNING")

    async def failed_for_a_while() -> list[TriggerEvent]:
        trigger = _trigger(failed_repeat=0.3)
        return await _events(trigger, lambda: _job(plane, "FAILED"), settle=20)

    fired = asyncio.run(asyncio.wait_for(failed_for_a_while(), timeout=60))
    kinds = [e.payload["event"] for e in fired]
    assert kinds[0] == "unhealthy" and len(kinds) >= 2, kinds
    assert set(kinds[1:]) == {"still_failed"}


def test_failed_polls_do_not_end_the_watch(plane: Path) -> None:
    """A watcher never gives up: a poll that raises is logged and retried, and the change
    after storage came back is an event."""
    _job(plane, "RUNNING")
    record = plane / "jobs" / JOB / "job.json"
    good = record.read_text()

    async def fails_then_fires() -> list[TriggerEvent]:
        trigger = _trigger()
        record.write_text("{not json")  # the job's record unreadable: every poll fails

        def come_back() -> None:
            assert len(trigger.errors) >= 3, trigger.errors
            record.write_text(good)

        return await _events(trigger, come_back, lambda: _job(plane, "FAILED"), settle=5)

    fired = asyncio.run(asyncio.wait_for(fails_then_fires(), timeout=60))
    assert [e.payload["state"] for e in fired] == ["FAILED"]


def test_a_job_that_never_ran_is_a_healthy_baseline(plane: Path) -> None:
    fired = asyncio.run(
        asyncio.wait_for(_events(_trigger(), lambda: _job(plane, "FAILED")), timeout=60)
    )
    assert [(e.payload["state"], e.payload["previous"]) for e in fired] == [("FAILED", None)]


def _reading(state: str | None, *, healthy: bool | None = None, epoch: int = 1, head: int = 0):
    healthy = state in ("RUNNING", "STOPPED", None) if healthy is None else healthy
    return HealthReading(state, healthy, "why", epoch, head, False)


def test_the_change_rules_one_reading_at_a_time() -> None:
    watch = HealthWatch(failed_repeat=100)
    steps = [
        (_reading("RUNNING", head=5), 0, None),  # the baseline
        (_reading("RUNNING", head=6), 1, None),
        (_reading("DEGRADED", head=6), 2, "unhealthy"),
        (_reading("DEGRADED", head=7), 3, None),  # the same condition
        (_reading("FAILED", head=7), 4, "unhealthy"),
        (_reading("FAILED", head=7), 50, None),  # before failed_repeat
        (_reading("FAILED", head=7), 104, "still_failed"),
        (_reading("RUNNING", epoch=2, head=7), 105, None),  # started, nothing committed
        (_reading("RUNNING", epoch=2, head=8), 106, "recovered"),
        (_reading("STOPPED", epoch=2, head=8), 107, None),  # healthy to healthy
        # a rollback left halfway: RUNNING but not healthy
        (_reading("RUNNING", healthy=False, epoch=2, head=8), 108, "unhealthy"),
        (_reading("STOPPED", epoch=2, head=8), 109, "recovered"),  # no checkpoint needed
    ]
    for reading, now, expected in steps:
        assert watch.observe(reading, now) == expected, (reading, now)


def test_the_health_asset_is_watched_by_the_health_trigger() -> None:
    asset = job_health_asset("keyed-totals", conn_id="sk_x", poll_interval=7)
    assert (asset.name, asset.uri) == ("keyed-totals.health", "streamkeeper://keyed-totals/health")
    (watcher,) = asset.watchers
    assert isinstance(watcher.trigger, JobHealthTrigger)
    assert watcher.trigger.serialize()[1]["poll_interval"] == 7.0
