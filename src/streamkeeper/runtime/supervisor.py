"""Watches one running query: checkpoint timeouts, commit failures, and the history table.

The driver's main thread runs `QuerySupervisor.watch` while Spark runs batches and the
commit coordinator commits them. It is the checkpoint watchdog Spark lacks.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from streamkeeper.commit.coordinator import CommitCoordinator
from streamkeeper.errors import FencedError, QueryFailedError
from streamkeeper.observability.health import BatchTimeoutWatch, CheckpointHealth
from streamkeeper.observability.history import (
    CheckpointHistory,
    CheckpointRecord,
    record_from_progress,
)
from streamkeeper.observability.progress import ProgressListener

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger(__name__)

POLL_SECONDS = 0.25
HISTORY_FLUSH_SECONDS = 2.0
HISTORY_SWEEP_SECONDS = 60.0  # between sweeps while unreferenced history files wait


class QuerySupervisor:
    """Runs until the query ends; raises on a failure the health model does not tolerate."""

    def __init__(
        self,
        *,
        query: StreamingQuery,
        coordinator: CommitCoordinator,
        health: CheckpointHealth,
        history: CheckpointHistory,
        timeout: float,
        stop_requested: threading.Event,
        progress: ProgressListener | None = None,
        on_poll: Callable[[], None] | None = None,
        history_kept: int | None = None,
        history_every: int = 100,
    ) -> None:
        self.query = query
        self.on_poll = on_poll  # between batches: commands to the job (runtime/commands.py)
        self.coordinator = coordinator
        self.health = health
        self.history = history
        self.watch = BatchTimeoutWatch(timeout)
        self.timeout = timeout
        self.stop_requested = stop_requested
        self.data_available = False
        self._recorded: set[int] = set()
        # Upkeep of the history table at the first append after a start and every
        # `history_every` appends after it (history_upkeep.py): a job killed sooner than
        # that many appends after each start still has its history kept.
        self.history_kept, self.history_every = history_kept, history_every
        self._appends = 0
        # A start sweeps what a predecessor's failed append left (observability/history.py).
        self._sweep_at: float | None = time.monotonic()
        self.progress = progress
        self._last_report: tuple[int, str] | None = None
        self._last_flush = time.monotonic()

    def watch_until_done(self) -> None:
        try:
            while self.query.isActive:
                if self._await_termination():
                    break
                self._check()
            failure = self.query.exception()
            if failure is not None and not self.stop_requested.is_set():
                raise QueryFailedError(f"streaming query failed: {_root_cause(str(failure))}")
            self.coordinator.drain()
            if self.progress is not None:  # the last batch reported after the last poll
                self._report_progress(self.progress)
        except BaseException:
            self._stop_query()
            raise
        finally:
            self.coordinator.stop()
            self._flush_history()

    def _await_termination(self) -> bool:
        """True once the query ended; its error, if any, is read from `exception()`."""
        from pyspark.errors import StreamingQueryException

        try:
            return bool(self.query.awaitTermination(POLL_SECONDS))
        except StreamingQueryException:
            return True

    def _check(self) -> None:
        if self.coordinator.failure is not None:
            raise self.coordinator.failure
        status = self.query.status
        self.data_available = bool(status.get("isDataAvailable"))
        batch = self._current_batch()
        if self.watch.observe(batch, bool(status.get("isTriggerActive")), time.monotonic()):
            self.coordinator.mark_timed_out(batch)
            self.health.failed(f"checkpoint {batch} exceeded checkpoint.timeout {self.timeout:g}s")
        if time.monotonic() - self._last_flush >= HISTORY_FLUSH_SECONDS:
            self._flush_history()
        if self.progress is not None:
            self._report_progress(self.progress)
        if self.on_poll is not None and not self.stop_requested.is_set():
            self._poll()

    def _poll(self) -> None:
        assert self.on_poll is not None
        try:
            self.on_poll()
        except FencedError:
            raise
        except Exception:  # noqa: BLE001 - an unreadable command folder must not fail the job
            log.warning("could not poll the job's commands; trying again", exc_info=True)

    def _report_progress(self, listener: ProgressListener) -> None:
        """Feed the terminal display: reports of batches that ran (read when a new one came)."""
        fresh: list[dict] = []
        try:
            last = self.query.lastProgress
            key = None if last is None else (last["batchId"], last["timestamp"])
            if key != self._last_report:
                self._last_report = key
                fresh = [json.loads(p.json) for p in self.query.recentProgress]
                fresh = [p for p in fresh if "addBatch" in p.get("durationMs", {})]
            listener.query(fresh, self.coordinator.stats.committed)
        except Exception:  # noqa: BLE001 - a display must never fail the job
            log.debug("progress display failed", exc_info=True)

    def _current_batch(self) -> int:
        last = self.query.lastProgress
        return int(last["batchId"]) + 1 if last else 0

    def _stop_query(self) -> None:
        try:
            if self.query.isActive:
                self.query.stop()
        except Exception:  # noqa: BLE001 - already failing; the first error is the one to report
            log.exception("could not stop the query")

    def _flush_history(self) -> None:
        """Append a history row for each batch the coordinator committed, once.

        A trigger that planned no batch (an available-now start that found nothing new)
        or a batch that was never committed is no checkpoint and gets no row.
        """
        self._last_flush = time.monotonic()
        records: list[CheckpointRecord] = []
        try:
            progresses = [json.loads(p.json) for p in self.query.recentProgress]
        except Exception:  # noqa: BLE001 - the JVM may be gone after a failure
            return
        # Idle triggers report the next batch id before that batch runs (no addBatch): only
        # the report of the batch's run counts.
        ran = {int(p["batchId"]): p for p in progresses if "addBatch" in p.get("durationMs", {})}
        for batch, progress in ran.items():
            facts = self.coordinator.checkpoint_facts(batch)
            if batch in self._recorded or facts is None:
                continue  # recorded already, or not committed yet (a later flush sees it)
            records.append(record_from_progress(progress, **facts))
            self._recorded.add(batch)
        # A batch out of `recentProgress` is never reported again: forgetting it keeps the
        # set at Spark's window (100 reports) in a driver that runs for months.
        self._recorded.intersection_update(ran)
        try:
            self.history.append(records)
        except Exception:  # noqa: BLE001 - history is observability, never a reason to fail
            log.exception("could not append %d checkpoint history rows", len(records))
            self._recorded -= {r.batch_id for r in records}  # the next flush tries again
            if self._sweep_at is None:  # its data file may be left, unreferenced
                self._sweep_at = time.monotonic() + HISTORY_SWEEP_SECONDS
        else:
            self._appends += 1 if records else 0
            if records and self.history_kept and (self._appends - 1) % self.history_every == 0:
                self._upkeep_history(self.history_kept)
        self._sweep_history()

    def _upkeep_history(self, kept: int) -> None:
        from streamkeeper.observability.history_upkeep import upkeep

        try:
            upkeep(self.history, kept)
        except Exception:  # noqa: BLE001 - made again at the next pass
            log.warning("checkpoint history upkeep failed; trying at the next pass", exc_info=True)

    def _sweep_history(self) -> None:
        if self._sweep_at is None or time.monotonic() < self._sweep_at:
            return
        try:
            waiting = self.history.sweep_unreferenced()
        except Exception:  # noqa: BLE001 - tried again at the next sweep
            log.warning(
                "could not sweep the checkpoint history's unreferenced files", exc_info=True
            )
            waiting = 1
        self._sweep_at = time.monotonic() + HISTORY_SWEEP_SECONDS if waiting else None


_PYTHON_ERROR = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Fault|Exit)): (.+)$")


def _root_cause(text: str) -> str:
    """The Python error behind Spark's wrapped foreachBatch failure, else the first line."""
    causes = [
        line.strip()
        for line in text.splitlines()
        if _PYTHON_ERROR.match(line.strip())
        and not line.strip().startswith(("py4j.", "org.apache.", "java.", "pyspark.errors"))
    ]
    if causes:
        return causes[-1]
    return text.strip().splitlines()[0] if text.strip() else text
