from __future__ import annotations

from datetime import UTC, datetime

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
        (  # a young job filling its keys is not degraded
            _beat(),
            _history(6, arriving=10, processing=10, state=[1, 2, 3, 4, 5, 9]),
            "RUNNING",
            "running, no checkpoint committed yet",
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


def _batches(
    durations: list[float], *, gap: float = 0.01, run: str = "r1", interval_rows: int = 1000
) -> list[dict]:
    """History rows as Spark reports back-to-back batches: each input rate is rows / the
    previous batch's span, each processing rate rows / its own duration."""
    rows, start, previous = [], 1000.0 - sum(durations) - gap * len(durations), None
    for i, seconds in enumerate(durations):
        stamp = datetime.fromtimestamp(start, tz=UTC).isoformat(timespec="milliseconds")
        since = seconds if previous is None else start - previous
        rows.append(
            {
                "checkpoint_id": i,
                "run_id": run,
                "trigger_time": stamp.replace("+00:00", "Z"),
                "duration_ms": int(seconds * 1000),
                "input_rows": interval_rows,
                "input_rows_per_second": interval_rows / since,
                "processed_rows_per_second": interval_rows / seconds,
                "state_bytes": 100,
            }
        )
        previous = start
        start += seconds + gap
    return rows


def test_back_to_back_overrunning_batches_are_falling_behind_though_the_rates_agree() -> None:
    """Spark's two rates stay equal when input outruns processing; the trigger does not."""
    history = _batches([2.0, 2.1, 2.0, 2.2, 2.1])
    recent = history[-3:]
    assert all(
        r["processed_rows_per_second"] >= 0.9 * r["input_rows_per_second"] for r in recent
    )  # what the rate rule sees: nothing
    status = assess(_beat(data_available=True), history, interval=1.0, timeout=60.0, now=1000.0)
    assert status.state == "DEGRADED"
    assert "falling behind: the last 3 batches each took longer than the 1 s trigger" in (
        status.reason
    )
    assert "median 2.1 s" in status.reason and "processing 476 rows/s" in status.reason


@pytest.mark.parametrize(
    ("beat", "history", "why"),
    [
        ({"data_available": False}, _batches([2.0, 2.0, 2.1, 2.0]), "input caught up"),
        ({"data_available": True}, _batches([2.0] * 4, gap=0.8), "idle gaps between"),
        ({"data_available": True}, _batches([0.6, 0.6, 0.7, 0.6]), "within the interval"),
        ({"data_available": True}, _batches([2.0, 2.0, 0.9, 2.0]), "one batch within"),
        ({"data_available": True}, _batches([9.0, 2.0, 2.0]), "the first pays start-up"),
        (
            {"data_available": True},
            [{**r, "run_id": "r2" if i >= 2 else "r1"} for i, r in enumerate(_batches([2.0] * 5))],
            "a restart between",
        ),
        ({"data_available": True}, _batches([2.0] * 4, interval_rows=0), "no input"),
    ],
)
def test_overrunning_batches_are_not_falling_behind_unless_back_to_back_with_input(
    beat: dict, history: list, why: str
) -> None:
    status = assess(_beat(**beat), history, interval=1.0, timeout=60.0, now=1000.0)
    assert status.state == "RUNNING", why


def test_longer_intervals_allow_a_proportional_gap() -> None:
    """The slack for "back to back" is a quarter of the interval, at most 0.5 s."""
    beat = _beat(data_available=True)
    tight = assess(beat, _batches([12.0] * 4, gap=0.4), interval=10.0, timeout=60.0, now=1000.0)
    loose = assess(beat, _batches([12.0] * 4, gap=0.6), interval=10.0, timeout=60.0, now=1000.0)
    assert (tight.state, loose.state) == ("DEGRADED", "RUNNING")


def test_slow_batches_between_idle_triggers_are_not_falling_behind() -> None:
    """Seen live: a small file every 4 s, each batch 2-3 s on a loaded machine. Spark's input
    rate is rows / time since the previous trigger, an idle one a second earlier, so it
    reads twice the processing rate although nothing waits."""
    history = _batches([2.8, 2.3, 2.7, 2.8, 2.0], gap=1.2, interval_rows=50)
    for row in history:
        row["input_rows_per_second"] = 50.0  # 50 rows / 1 s since the last (idle) trigger
    status = assess(_beat(data_available=True), history, interval=1.0, timeout=60.0, now=1000.0)
    assert status.state == "RUNNING"
    # The same rates over batches that ran back to back: falling behind.
    history = _batches([2.8, 2.3, 2.7, 2.8, 2.9], interval_rows=50)
    for row in history:
        row["input_rows_per_second"] = 50.0
    status = assess(_beat(data_available=False), history, interval=1.0, timeout=60.0, now=1000.0)
    assert status.state == "DEGRADED" and "processing 19 rows/s < input 50 rows/s" in status.reason
