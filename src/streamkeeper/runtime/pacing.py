"""Flink's min pause between checkpoints, on Spark's micro-batches.

Spark starts the next batch as soon as the trigger fires, even right after a slow
batch; `checkpoint.min_pause` guarantees at least that much time between the end of one
batch and the start of the next, so a slow sink cannot starve processing.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class MinPause:
    """Waits, at a batch's start, until `seconds` have passed since the last batch ended."""

    def __init__(
        self,
        seconds: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.seconds = seconds
        self.clock = clock
        self.sleep = sleep
        self._last_end: float | None = None

    def before_batch(self) -> float:
        """Sleep out the rest of the pause; returns how long it slept."""
        if self._last_end is None or self.seconds <= 0:
            return 0.0
        remaining = self.seconds - (self.clock() - self._last_end)
        if remaining > 0:
            self.sleep(remaining)
            return remaining
        return 0.0

    def after_batch(self) -> None:
        self._last_end = self.clock()
