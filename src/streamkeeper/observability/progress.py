"""Progress of long work on a terminal, and nothing at all when not on one.

`ProgressDisplay` is the reusable part (a checkpoint restore, a run, later savepoints):
tasks with a count and, when known, a total, drawn by rich on stderr. Log records that
the root logger writes to stderr while it is shown are printed above it instead of
through it. `RunProgress` is what `streamkeeper run` hands the runner.
"""

from __future__ import annotations

import logging
import sys
from types import TracebackType
from typing import Any, Protocol

from rich.console import Console
from rich.file_proxy import FileProxy
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)


class ProgressListener(Protocol):
    """What the runner reports while it works (RunOptions.progress)."""

    def restore(self, done: int, total: int) -> None:
        """`done` of `total` files of a checkpoint restored."""

    def query(self, progresses: list[dict[str, Any]], committed: int) -> None:
        """Spark's recent reports of batches that ran (JSON) when a new one came, else [];
        and the checkpoints committed. A report comes again until it leaves the window."""


class ProgressTask:
    """One line of a display; does nothing if the display is off."""

    def __init__(self, progress: Progress | None, task: TaskID | None) -> None:
        self._progress = progress
        self._task = task

    def update(
        self,
        *,
        completed: float | None = None,
        total: float | None = None,
        description: str | None = None,
    ) -> None:
        if self._progress is None or self._task is None:
            return
        self._progress.update(self._task, completed=completed, total=total, description=description)

    def advance(self, amount: float = 1) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, amount)


class ProgressDisplay:
    """A context manager: rich progress lines on a terminal, silence elsewhere."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.enabled = self.console.is_terminal
        self._progress: Progress | None = None
        self._rerouted: list[tuple[logging.StreamHandler, Any]] = []

    def __enter__(self) -> ProgressDisplay:
        if self.enabled:
            self._progress = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=self.console,
                transient=False,
            )
            self._progress.start()
            self._reroute_logging()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._progress is not None:
            self._progress.stop()
            for handler, stream in self._rerouted:
                handler.setStream(stream)
            self._rerouted.clear()
            self._progress = None

    def task(self, description: str, total: float | None = None) -> ProgressTask:
        """A new line; `total=None` shows a spinner and the count without a bar's end."""
        if self._progress is None:
            return ProgressTask(None, None)
        return ProgressTask(self._progress, self._progress.add_task(description, total=total))

    def _reroute_logging(self) -> None:
        """Log lines to stderr go through rich's proxy (sys.stderr while the display runs)."""
        if not isinstance(sys.stderr, FileProxy):
            return
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream in (
                sys.__stderr__,
                self.console.file,
            ):
                self._rerouted.append((handler, handler.setStream(sys.stderr)))


class RunProgress(ProgressDisplay):
    """`streamkeeper run`: files restored, then checkpoints committed, rows read, rate."""

    def __init__(self, console: Console | None = None) -> None:
        super().__init__(console)
        self._restore: ProgressTask | None = None
        self._batches: ProgressTask | None = None
        self._seen: set[tuple[str, int]] = set()
        self.rows = 0
        self.batches = 0
        self.committed = 0
        self.rate = 0.0

    def restore(self, done: int, total: int) -> None:
        if self._restore is None:
            self._restore = self.task("restoring checkpoint files", total=total)
        self._restore.update(completed=done, total=total)

    def query(self, progresses: list[dict[str, Any]], committed: int) -> None:
        """Count the reports not seen before; `progresses` is Spark's whole recent window
        when a new report came, else empty."""
        keys = [(str(p.get("runId")), int(p["batchId"])) for p in progresses]
        for key, progress in zip(keys, progresses, strict=True):
            if key in self._seen:
                continue
            self._seen.add(key)
            self.batches += 1
            self.rows += int(progress.get("numInputRows") or 0)
            self.rate = float(progress.get("processedRowsPerSecond") or 0.0)
        if progresses:  # a report out of the window never comes back: forget it
            self._seen.intersection_update(keys)
        self.committed = committed
        if self._batches is None:
            self._batches = self.task("checkpoints committed")
        self._batches.update(completed=committed, description=self.describe())

    def finish(self, committed: int) -> None:
        """The run ended with every batch it ran committed."""
        if self._batches is not None:
            self.committed = committed
            self._batches.update(completed=committed, total=committed, description=self.describe())

    def describe(self) -> str:
        return (
            f"checkpoints committed (batches run {self.batches}, rows read {self.rows:,}, "
            f"{self.rate:,.0f} rows/s)"
        )
