"""The soak's verdicts (benchmarks/soak.py): a count kept by retention saws up and down
and is flat; a count that gains files life after life is not, wherever the passes fall."""

from __future__ import annotations

from typing import Any

from benchmarks.soak import _verdicts

LIVES, MINUTES_PER_LIFE = 6, 10


def _samples(count: Any) -> list[dict[str, Any]]:
    samples = []
    for minute in range(1, LIVES * MINUTES_PER_LIFE + 1):
        life = (minute - 1) // MINUTES_PER_LIFE  # numbered from 0, as soak.py does
        samples.append(
            {
                "minute": float(minute),
                "life": life,
                "life_minute": float((minute - 1) % MINUTES_PER_LIFE) + 0.5,
                "python_rss_mib": 300.0,
                "jvm_rss_mib": 700.0,
                "lineage": count(minute),
                "table_logs": 500.0,
                "table_data": 30.0 * minute,
                "spark_checkpoint": 1500.0,
                "batch_ms": 500.0,
                "wal_commit_ms": 50.0,
                "commit_offsets_ms": 60.0,
                "delta_commit_ms": 100.0,
            }
        )
    return samples


def _verdicts_of(count: Any, first_checkpoint_s: Any = lambda life: 12.0) -> dict[str, Any]:
    restarts = [
        {"minute": 10.0 * life, "first_checkpoint_s": first_checkpoint_s(life)}
        for life in range(LIVES)
    ]
    return _verdicts(_samples(count), restarts, warmup=3.0, flat=0.10)


def _lineage(count: Any) -> dict[str, Any]:
    return _verdicts_of(count)["lineage"]


def test_a_sawtooth_kept_by_retention_is_flat() -> None:
    # Grows 30 a minute, cut back every 7 minutes: the passes fall anywhere in a life.
    verdict = _lineage(lambda minute: 200.0 + 30.0 * (minute % 7))
    assert verdict["flat"] is True, verdict


def test_a_count_gaining_a_file_a_checkpoint_is_not_flat() -> None:
    # The same sawtooth plus one file per 2 s checkpoint that nothing removes.
    verdict = _lineage(lambda minute: 200.0 + 30.0 * (minute % 7) + 30.0 * minute)
    assert verdict["flat"] is False and verdict["slope_per_hour"] > 1000, verdict


def test_the_first_life_filling_its_retention_windows_is_not_judged() -> None:
    # Growing for the first 10 minutes (retention), level after.
    verdict = _lineage(lambda minute: 50.0 * min(minute, 10) + 30.0 * (minute % 5))
    assert verdict["flat"] is True, verdict


def test_a_cost_that_falls_is_not_one_that_creeps_up() -> None:
    verdicts = _verdicts_of(lambda minute: 300.0, first_checkpoint_s=lambda life: 30.0 - life)
    recovery = verdicts["recovery_first_checkpoint_s"]
    assert recovery["trend"] == "falling" and recovery["flat"] is True, recovery
    rising = _verdicts_of(lambda minute: 300.0, first_checkpoint_s=lambda life: 20.0 + life)
    assert rising["recovery_first_checkpoint_s"]["trend"] == "rising"
