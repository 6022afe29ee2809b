"""Steady traffic for a running sample job, a runner in a background thread, and the
checks of its output that hold at any instant."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from jobs.keyed_totals.sample_events import read_events, write_event_files
from streamkeeper.runtime.runner import RunOptions, RunResult, run_job
from streamkeeper.spec import JobSpec


class Feeder(threading.Thread):
    """Writes a new event file every `period` seconds until halted."""

    def __init__(self, directory: Path, period: float = 0.7, initial: int = 3) -> None:
        super().__init__(daemon=True)
        self.directory = directory
        self.period = period
        self.files = write_event_files(directory, files=initial, events_per_file=100)
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(self.period):
            self.files += write_event_files(
                self.directory, files=1, events_per_file=100, first_file=len(self.files)
            )

    def stop(self) -> list[Path]:
        self.halt.set()
        if self.is_alive():
            self.join()
        return list(self.files)


class BackgroundRun(threading.Thread):
    """`run_job` in a thread of this process (the SparkSession is shared)."""

    def __init__(self, spec: JobSpec, options: RunOptions) -> None:
        super().__init__(daemon=True)
        self.spec = spec
        self.options = options
        self.result: RunResult | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = run_job(self.spec, self.options)
        except BaseException as error:  # noqa: BLE001 - re-raised by finish()
            self.error = error

    def finish(self, timeout: float = 300.0) -> RunResult:
        self.join(timeout)
        if self.is_alive():
            raise AssertionError(f"the runner did not end within {timeout}s")
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.25)


def boundaries(files: list[Path]) -> dict[str, set[tuple[int, int]]]:
    """Each key's (events, total) after every prefix of the input files."""
    found: dict[str, set[tuple[int, int]]] = defaultdict(set)
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for path in files:
        for event in read_events(path):
            state = counts[event["key"]]
            state[0] += 1
            state[1] += event["value"]
        for key, (events, total) in counts.items():
            found[key].add((events, total))
    return found


def totals_prefix(totals: dict[str, tuple[int, int]], files: list[Path]) -> int:
    """How many of the first files the totals are exactly the result of.

    Raises:
        AssertionError: no prefix explains them (a batch lost, repeated or partial).
    """
    counts: dict[str, tuple[int, int]] = {}
    for count in range(len(files) + 1):  # one pass: each file read once
        if count:
            for event in read_events(files[count - 1]):
                events, total = counts.get(event["key"], (0, 0))
                counts[event["key"]] = (events + 1, total + event["value"])
        if counts == totals:
            return count
    raise AssertionError(f"the totals are the result of no prefix of the {len(files)} files")


def check_changes(changes: list[tuple[str, int, int]], files: list[Path]) -> None:
    """No change row twice, and each one key's running state at some file boundary."""
    assert len(changes) == len(set(changes)), "a change row was committed twice"
    explained = boundaries(files)
    strays = [row for row in changes if (row[1], row[2]) not in explained[row[0]]]
    assert not strays, f"change rows no prefix of the input explains: {strays[:5]}"
