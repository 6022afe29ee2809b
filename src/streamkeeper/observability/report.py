"""Readable tables for `streamkeeper status` and `streamkeeper checkpoints`."""

from __future__ import annotations

import datetime as dt
from typing import Any

from rich.console import Console
from rich.table import Table

from streamkeeper.observability.health import JobStatus


def _when(timestamp: float | None) -> str:
    if not timestamp:
        return "-"
    return dt.datetime.fromtimestamp(float(timestamp), dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def status_table(job: str, status: JobStatus, heartbeat: dict[str, Any] | None) -> Table:
    table = Table(title=f"job {job}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    table.add_row("status", status.state)
    table.add_row("reason", status.reason)
    beat = heartbeat or {}
    for label, key in (
        ("lineage", "lineage"),
        ("epoch", "epoch"),
        ("pid", "pid"),
        ("host", "host"),
        ("last committed checkpoint", "last_committed_batch"),
        ("last commit seq", "last_committed_seq"),
        ("pending commits", "pending_commits"),
        ("consecutive failures", "consecutive_failures"),
        ("tolerable failures", "tolerable_failures"),
        ("last failure", "last_failure"),
    ):
        table.add_row(label, "-" if beat.get(key) is None else str(beat[key]))
    table.add_row("heartbeat", _when(beat.get("time")))
    table.add_row("last checkpoint", _when(beat.get("last_checkpoint_at")))
    return table


def checkpoints_table(job: str, rows: list[dict[str, Any]]) -> Table:
    table = Table(title=f"checkpoints of {job} (latest last)")
    for column in (
        "id", "trigger time", "duration ms", "write ms", "input rows", "rows/s",
        "state rows", "state bytes", "uploaded", "visible after ms", "seq",
    ):  # fmt: skip
        table.add_column(column, justify="right")
    for r in rows:
        delay = r.get("visibility_delay_ms")
        table.add_row(
            str(r["checkpoint_id"]),
            str(r["trigger_time"]).replace("T", " ")[:19],
            str(r["duration_ms"]),
            str(r["write_ms"]),
            str(r["input_rows"]),
            f"{r['processed_rows_per_second']:.0f}",
            str(r["state_rows"]),
            str(r["state_bytes"]),
            "-" if r.get("bytes_uploaded") is None else str(r["bytes_uploaded"]),
            "-" if delay is None else f"{delay:.0f}",
            "-" if r.get("commit_seq") is None else str(r["commit_seq"]),
        )
    return table


def print_table(table: Table) -> None:
    Console(width=160).print(table)
