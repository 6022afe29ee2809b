"""The batch boundary: a lock each batch function holds from start to end.

Stateful operators run inside our foreachBatch action (the one `mapInArrow` pass), so
while someone else holds this lock no batch computes state or writes output: Spark may
have planned the next batch (`offsets/N+1`), but writes no state file of it. A
savepoint takes the lock to capture checkpoint N at a boundary; a stop-with-savepoint
also sets `draining` before it lets go, and the next batch function then refuses to
run before doing anything, so nothing of that batch is written and its `offsets/N+1`
is replayed by the next start.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from streamkeeper.errors import StreamkeeperError


class BatchRefusedError(StreamkeeperError):
    """The job is draining for a stop: this batch must not run (it is replayed later)."""


class BatchBoundary:
    """Held by the running batch; taken by savepoints and stops between batches."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._draining: str | None = None
        self.running: int | None = None  # the batch holding the lock, if any
        self.last_returned: int | None = None  # the last batch whose function returned

    @contextmanager
    def batch(self, batch_id: int) -> Iterator[None]:
        """Run batch `batch_id` inside the boundary.

        Raises:
            BatchRefusedError: the job is draining; the batch did nothing.
        """
        with self._lock:
            if self._draining is not None:
                raise BatchRefusedError(
                    f"batch {batch_id} refused: {self._draining}; it runs again at the next start"
                )
            self.running = batch_id
            try:
                yield
                self.last_returned = batch_id
            finally:
                self.running = None

    @contextmanager
    def between_batches(self, timeout: float) -> Iterator[int | None]:
        """Hold the boundary: no batch function runs until the block ends.

        Yields:
            The batch that was running when we started to wait (None if none was).

        Raises:
            TimeoutError: the running batch did not end within `timeout` seconds.
        """
        in_flight = self.running
        started = time.monotonic()
        if not self._lock.acquire(timeout=timeout):
            raise TimeoutError(
                f"batch {self.running} still running after {time.monotonic() - started:.0f}s; "
                "no batch boundary reached (raise checkpoint.timeout, or try again)"
            )
        try:
            yield in_flight
        finally:
            self._lock.release()

    def drain(self, reason: str) -> None:
        """Refuse every later batch (call while holding the boundary)."""
        self._draining = reason

    @property
    def draining(self) -> bool:
        return self._draining is not None
