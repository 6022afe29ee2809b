"""Progress: drawn on a terminal, silent elsewhere; a restore reports every file."""

from __future__ import annotations

import io
import logging
from pathlib import Path

from rich.console import Console

from streamkeeper.observability.progress import ProgressDisplay, RunProgress
from streamkeeper.snapshots.restore import restore_checkpoint
from tests.unit.test_checkpoint_retention import Harness


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=terminal, width=120), out


def _report(batch: int, rows: int, run: str = "r1") -> dict:
    return {"batchId": batch, "runId": run, "numInputRows": rows, "processedRowsPerSecond": 5e3}


def test_nothing_is_drawn_when_not_on_a_terminal() -> None:
    console, out = _console(terminal=False)
    with RunProgress(console) as progress:
        assert not progress.enabled
        progress.restore(3, 10)
        progress.query([_report(0, 100)], committed=1)
        progress.finish(1)
    assert out.getvalue() == ""


def test_a_terminal_shows_checkpoints_rows_and_rate() -> None:
    console, out = _console(terminal=True)
    with RunProgress(console) as progress:
        progress.query([_report(0, 100), _report(1, 250)], committed=1)
        progress.query([_report(1, 250), _report(2, 50)], committed=3)  # reports repeat
        progress.query([_report(0, 7, run="r2")], committed=4)  # a restarted query: new run
        progress.finish(4)
    assert (progress.batches, progress.rows, progress.committed) == (4, 407, 4)
    assert "batches run 4, rows read 407, 5,000 rows/s" in out.getvalue()


def test_log_lines_go_above_the_display_and_the_handler_is_restored() -> None:
    console, out = _console(terminal=True)
    handler = logging.StreamHandler(console.file)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        with ProgressDisplay(console) as display:
            display.task("work", total=2).advance()
            assert handler.stream is not console.file  # through rich, not across the bar
        assert handler.stream is console.file
    finally:
        root.removeHandler(handler)


def test_a_restore_reports_each_file(tmp_path: Path) -> None:
    harness = Harness(tmp_path)
    harness.write_tree({"offsets/0": 0, "state/0/0/1.delta": 1, "state/0/0/2.delta": 2})
    manifest = harness.uploader.upload(5)
    seen: list[tuple[int, int]] = []
    restore_checkpoint(
        harness.store,
        harness.layout,
        tmp_path / "restored",
        progress=lambda d, t: seen.append((d, t)),
    )
    total = len(manifest.files)
    assert seen[0] == (0, total) and sorted(seen) == [(n, total) for n in range(total + 1)]
