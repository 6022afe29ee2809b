"""The start-phase stopwatch: laps, the summary line, logged once."""

from __future__ import annotations

import itertools
import logging

import pytest

from streamkeeper.runtime.start_phases import StartPhases


def test_laps_add_up_to_the_time_until_the_query_started(caplog: pytest.LogCaptureFixture) -> None:
    ticks = itertools.chain([10.0, 10.5, 14.0, 14.25], itertools.repeat(99.0))
    phases = StartPhases(clock=lambda: next(ticks))
    phases.lap("storage probe")
    phases.lap("Spark session and plan")
    phases.lap("query start")
    assert phases.summary() == (
        "start phases: storage probe 0.50 s, Spark session and plan 3.50 s, "
        "query start 0.25 s; 4.25 s until the query started"
    )
    caplog.set_level(logging.INFO, logger="streamkeeper.runtime.start_phases")
    phases.log_once()
    phases.log_once()  # a restarted attempt: nothing new to say
    assert [r.getMessage() for r in caplog.records] == [phases.summary()]
