"""The fault injection's own rules (tests/support/faults.py): which reach of a crash point
kills, `@live` counting from green's live run only, and a crash fired once per test
across processes (STREAMKEEPER_CRASH_ONCE)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import faults


@pytest.fixture
def kills(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The pids faults.py would have SIGKILLed (nothing is killed)."""
    killed: list[int] = []
    monkeypatch.setattr(faults.os, "kill", lambda pid, _signal: killed.append(pid))
    faults.reset()
    yield killed
    faults.reset()


def test_the_nth_reach_of_a_point_kills(kills: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMKEEPER_CRASH_AT", "before_delta_commit:2")
    faults.crash_if_asked("before_delta_commit")
    faults.crash_if_asked("between_table_commits")
    assert kills == []
    faults.crash_if_asked("before_delta_commit")
    assert kills == [os.getpid()]


def test_live_counts_only_reaches_after_the_handover_went_live(
    kills: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STREAMKEEPER_CRASH_AT", "before_delta_commit:1@live")
    for _ in range(3):  # green's shadow run commits first (and blue never goes live)
        faults.crash_if_asked("before_delta_commit")
    assert kills == []
    faults.crash_if_asked("handover_after_live")
    assert kills == []
    faults.crash_if_asked("before_delta_commit")
    assert kills == [os.getpid()]


def test_a_handover_point_may_be_qualified_live_itself(
    kills: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STREAMKEEPER_CRASH_AT", "handover_after_live@live")
    faults.crash_if_asked("handover_after_live")
    assert kills == [os.getpid()]


def test_a_crash_fires_once_across_processes(
    kills: list[int], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    marker = tmp_path / "fired"
    monkeypatch.setenv("STREAMKEEPER_CRASH_AT", "rollback_after_fence")
    monkeypatch.setenv("STREAMKEEPER_CRASH_ONCE", str(marker))
    faults.crash_if_asked("rollback_after_fence")
    assert kills == [os.getpid()]
    assert marker.read_text() == f"rollback_after_fence pid={os.getpid()}\n"
    faults.reset()  # as a retried task's fresh process would start
    faults.crash_if_asked("rollback_after_fence")
    assert kills == [os.getpid()], "the retry was killed again"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("no_such_point", "names no crash point"),
        ("before_delta_commit:0", "is no count"),
        ("before_delta_commit:x@live", "is no count"),
    ],
)
def test_a_bad_crash_target_names_the_value_and_the_form(raw: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        faults.parse_crash_target(raw)
    assert faults.parse_crash_target("before_delta_commit:3@live") == (
        "before_delta_commit",
        3,
        True,
    )
