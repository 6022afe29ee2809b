"""Where a start's time goes: each phase's seconds, logged once at INFO.

A start (or a restart after a crash) runs the storage probe, the lineage checks, the
Spark session and the query's plan, a canonical restore, the fence, the heartbeat, the
records and tables, the WAL's recovery, then the query. Users tuning a restart (and the
lifecycle-speed benchmarks) read this line to see which part is ours and which is Spark's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class StartPhases:
    """A stopwatch with laps: `lap(name)` ends the phase since the previous lap."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._started = self._last = clock()
        self.laps: list[tuple[str, float]] = []
        self.logged = False

    def lap(self, name: str) -> None:
        now = self._clock()
        self.laps.append((name, now - self._last))
        self._last = now

    def summary(self) -> str:
        total = self._last - self._started
        parts = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in self.laps)
        return f"start phases: {parts}; {total:.2f} s until the query started"

    def log_once(self) -> None:
        """Log the breakdown the first time only (a restarted attempt adds nothing new)."""
        if not self.logged:
            self.logged = True
            log.info("%s", self.summary())
