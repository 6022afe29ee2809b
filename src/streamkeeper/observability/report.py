"""Readable tables for `streamkeeper jobs`, `status` and `checkpoints`."""

from __future__ import annotations

import datetime as dt
import time

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from streamkeeper.observability.health import ago
from streamkeeper.observability.history import Checkpoint
from streamkeeper.observability.status import StatusReport

STATE_STYLES = {
    "RUNNING": "green",
    "STOPPED": "cyan",
    "DEGRADED": "yellow",
    "FAILING": "yellow",
    "FAILED": "bold red",
}


def _when(timestamp: float | None, now: float | None = None) -> str:
    if not timestamp:
        return "-"
    at = dt.datetime.fromtimestamp(float(timestamp), dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"{at} ({ago(float(timestamp), time.time() if now is None else now)})"


def _text(value: object) -> str:
    return "-" if value is None else str(value)


def _state(state: str) -> str:
    return f"[{STATE_STYLES.get(state, 'default')}]{state}[/]"


def status_table(report: StatusReport) -> Table:
    table = Table(title=f"job {report.job}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    runner = report.runner
    head = report.head
    now = report.checked_at
    rows = [
        ("status", _state(report.state)),
        ("reason", report.reason),
        ("lineage", report.lineage),
        ("last committed checkpoint (seq)", _text(None if head is None else head.seq)),
        ("last committed batch", _text(None if head is None else head.batch_id)),
        ("last commit", _when(None if head is None else head.committed_at, now)),
        ("runner", "-" if runner is None else runner.state),
        ("runner reason", _text(None if runner is None else runner.reason)),
        ("epoch", _text(None if runner is None else runner.epoch)),
        ("pid", _text(None if runner is None else runner.pid)),
        ("host", _text(None if runner is None else runner.host)),
        ("heartbeat", _when(None if runner is None else runner.heartbeat_at, now)),
        ("pending commits", _text(report.pending_commits)),
        ("consecutive failures", _text(report.consecutive_failures)),
        ("tolerable failures", _text(report.tolerable_failures)),
        ("failed checkpoints", _text(report.failed_checkpoints)),
        ("last failure", _text(report.last_failure)),
    ]
    if report.rewind_advice is not None:
        rows.insert(2, ("rollback left halfway", f"[bold red]{escape(report.rewind_advice)}[/]"))
    rows += [(f"table {name}", uri) for name, uri in sorted(report.tables.items())]
    for label, value in rows:
        table.add_row(label, value)
    return table


def jobs_table(root: str, reports: list[StatusReport]) -> Table:
    table = Table(title=f"jobs under {root}")
    for column in ("job", "status", "reason", "last seq", "last batch", "last commit"):
        table.add_column(column, justify="right" if column.startswith("last ") else "left")
    for r in reports:
        head = r.head
        table.add_row(
            r.job,
            _state(r.state),
            r.reason,
            _text(None if head is None else head.seq),
            _text(None if head is None else head.batch_id),
            "-" if head is None or not head.committed_at else ago(head.committed_at, r.checked_at),
        )
    return table


def checkpoints_table(job: str, rows: list[Checkpoint]) -> Table:
    table = Table(title=f"checkpoints of {job} (id = commit seq, latest last)")
    for column in (
        "id", "batch", "trigger time", "duration ms", "write ms", "input rows", "rows/s",
        "state rows", "state bytes", "uploaded", "visible after ms",
    ):  # fmt: skip
        table.add_column(column, justify="right")
    for r in rows:
        delay = r.visibility_delay_ms
        table.add_row(
            str(r.checkpoint_id),
            _text(r.batch_id),
            str(r.trigger_time).replace("T", " ")[:19],
            str(r.duration_ms),
            str(r.write_ms),
            str(r.input_rows),
            f"{r.processed_rows_per_second:.0f}",
            str(r.state_rows),
            str(r.state_bytes),
            _text(r.bytes_uploaded),
            "-" if delay is None else f"{delay:.0f}",
        )
    return table


def print_table(table: Table) -> None:
    Console(width=160).print(table)
