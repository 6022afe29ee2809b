from __future__ import annotations

import pytest

from streamkeeper.observability.health import (
    BatchTimeoutWatch,
    CheckpointFailureLimitError,
    CheckpointHealth,
    assess,
    duration,
)


def test_consecutive_failures_beyond_tolerable_fail_with_the_reason() -> None:
    health = CheckpointHealth(tolerable_failures=2)
    health.failed("checkpoint 1 exceeded checkpoint.timeout 1s")
    health.failed("checkpoint 2 exceeded checkpoint.timeout 1s")
    with pytest.raises(CheckpointFailureLimitError, match="tolerable_failures=2.*checkpoint 3"):
        health.failed("checkpoint 3 exceeded checkpoint.timeout 1s")


def test_a_completed_checkpoint_resets_the_count() -> None:
    health = CheckpointHealth(tolerable_failures=1)
    health.failed("upload failed")
    health.completed()
    health.failed("upload failed again")  # one consecutive failure: tolerated
    assert health.facts()["consecutive_failures"] == 1
    assert health.facts()["failed_checkpoints"] == 2


def test_timeout_watch_flags_an_overrunning_batch_once() -> None:
    watch = BatchTimeoutWatch(timeout=5.0)
    assert watch.observe(0, True, now=0.0) is False
    assert watch.observe(0, True, now=4.0) is False
    assert watch.observe(0, True, now=6.0) is True
    assert watch.observe(0, True, now=9.0) is False  # same batch, flagged already
    assert watch.observe(1, True, now=10.0) is False  # back to back: a new batch, a new clock
    assert watch.observe(1, True, now=14.0) is False
    assert watch.observe(1, False, now=14.5) is False  # idle between triggers
    assert watch.observe(2, True, now=16.0) is False
    assert watch.observe(2, True, now=21.5) is True


def _beat(**facts: object) -> dict:
    return {"state": "RUNNING", "time": 1000.0, "pid": 1, **facts}


def _history(n: int, *, arriving: float, processing: float, state: list[int] | None = None):
    sizes = state or [100] * n
    return [
        {
            "input_rows": 10,
            "input_rows_per_second": arriving,
            "processed_rows_per_second": processing,
            "state_bytes": sizes[i],
        }
        for i in range(n)
    ]


@pytest.mark.parametrize(
    ("heartbeat", "history", "state", "reason"),
    [
        (None, [], "STOPPED", "never started"),
        (
            _beat(state="FAILED", reason="FencedError: x", time=1000.0 - 7200),
            [],
            "FAILED",
            "failed 2 h ago: FencedError: x",
        ),
        (_beat(state="FINISHED"), [], "STOPPED", "finished 0 s ago, all input processed"),
        (
            _beat(state="FINISHED", time=1000.0 - 23 * 60, reason="all input processed"),
            [],
            "STOPPED",
            "finished 23 min ago, all input processed",
        ),
        (
            _beat(state="STOPPED", time=990.0, reason="SIGTERM received"),
            [],
            "STOPPED",
            "stopped 10 s ago: SIGTERM received",
        ),
        (_beat(time=900.0), [], "FAILED", "heartbeat lost: last beat 1 min ago"),
        (
            _beat(consecutive_failures=1, tolerable_failures=3, last_failure="slow"),
            [],
            "FAILING",
            "1 consecutive",
        ),
        (_beat(last_checkpoint_at=800.0, data_available=True), [], "DEGRADED", "no checkpoint"),
        (_beat(), _history(5, arriving=1000, processing=500), "DEGRADED", "falling behind"),
        (
            _beat(),
            _history(6, arriving=10, processing=10, state=[1, 2, 3, 4, 5, 9]),
            "DEGRADED",
            "state grew 9.0x",
        ),
        (
            _beat(),
            _history(6, arriving=10, processing=10, state=[5, 2, 3, 4, 5, 9]),
            "RUNNING",
            "running, no checkpoint committed yet",
        ),
        (_beat(last_checkpoint_at=997.0), [], "RUNNING", "running, last checkpoint 3 s ago"),
        (
            _beat(last_checkpoint_at=800.0, data_available=False),
            [],
            "RUNNING",
            "running, idle (no new input), last checkpoint 3 min ago",
        ),
        (_beat(state="STARTING", host="h"), [], "RUNNING", "starting: pid 1 on h"),
    ],
)
def test_status_model(heartbeat: dict | None, history: list, state: str, reason: str) -> None:
    status = assess(heartbeat, history, interval=1.0, timeout=60.0, now=1000.0)
    assert status.state == state
    assert reason in status.reason


def test_running_reason_uses_the_lineages_last_commit_not_only_this_runs() -> None:
    """A runner that committed nothing yet still says when the lineage last committed."""
    status = assess(_beat(), [], interval=1.0, timeout=60.0, now=1000.0, last_commit_at=995.0)
    assert status.reason == "running, last checkpoint 5 s ago"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0 s"), (59.9, "59 s"), (60, "1 min"), (3599, "59 min"), (7300, "2 h"), (200000, "2 d")],
)
def test_durations_read_as_a_person_says_them(seconds: float, text: str) -> None:
    assert duration(seconds) == text
