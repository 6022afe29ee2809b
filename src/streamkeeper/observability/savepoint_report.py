"""Readable tables for `streamkeeper savepoint|stop` results, `savepoints` and `state`."""

from __future__ import annotations

import json
from typing import Any

from rich.table import Table

from streamkeeper.lineage.commands import CommandResult
from streamkeeper.observability.report import _text, _when
from streamkeeper.snapshots.savepoints import SavepointEntry

_STATE_STYLES = {"ok": "green", "failed": "bold red", "complete": "green", "pending": "yellow"}


def _styled(value: str) -> str:
    return f"[{_STATE_STYLES.get(value, 'default')}]{value}[/]"


def _size(size: int | None) -> str:
    if size is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024  # type: ignore[assignment]
    return str(size)


def command_result_table(job: str, result: CommandResult) -> Table:
    table = Table(title=f"{result.kind} command {result.id} of {job}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    rows = [
        ("state", _styled(result.state)),
        ("savepoint", _text(result.savepoint_id)),
        ("error", _text(result.error)),
        ("reason", _text(result.reason)),
        ("runner epoch", _text(result.epoch)),
        ("finished", _when(result.finished_at)),
    ]
    rows += [(name, str(value)) for name, value in sorted(result.details.items())]
    rows += [(f"{name} ms", f"{value:.0f}") for name, value in result.timings.items()]
    for label, value in rows:
        table.add_row(label, value)
    return table


def savepoints_table(job: str, entries: list[SavepointEntry]) -> Table:
    table = Table(title=f"savepoints of {job} (oldest first)")
    for column in ("id", "state", "format", "storage", "seq", "batch", "size", "taken", "kept"):
        table.add_column(column, justify="right" if column in ("seq", "batch", "size") else "left")
    for e in entries:
        kept = [f"protected: {e.protected_reason}"] if e.protected else []
        kept += [f"held by {holder}" for holder in e.holds]
        table.add_row(
            e.id,
            _styled(e.state),
            e.format,
            e.storage,
            _text(e.seq),
            _text(e.batch_id),
            _size(e.size),
            _when(e.created_at),
            "; ".join(kept) or "-",
        )
    return table


def savepoint_table(description: dict[str, Any]) -> Table:
    """`savepoints describe`: the entry, the manifest's main facts, and its health."""
    table = Table(title=f"savepoint {description['id']}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    manifest = description.get("manifest") or {}
    broken = description["broken"]
    rows = [
        ("health", "[bold red]BROKEN[/]" if broken else "[green]whole[/]"),
        *[("problem", p) for p in description["problems"]],
        ("job / lineage", f"{description['job']} / {description['lineage']}"),
        ("state", _styled(description["state"])),
        ("format / storage", f"{description['format']} / {description['storage']}"),
        ("seq / batch", f"{_text(description['seq'])} / {_text(description['batch_id'])}"),
        ("size", _size(description["size"])),
        ("taken", _when(description["created_at"])),
        ("protected", _text(description["protected_reason"]) if description["protected"] else "no"),
        ("holds", json.dumps(description["holds"]) if description["holds"] else "-"),
    ]
    if manifest:
        rows += [
            ("pinned checkpoint", _text(manifest.get("checkpoint_id"))),
            ("files", str(len(manifest.get("files", [])))),
            ("spark", manifest.get("spark_version", "-")),
            (
                "state backend / partitions",
                f"{manifest['state_backend']} / {manifest['partitions']}",
            ),
            ("code version", manifest.get("code_version", "-")[:16]),
            ("source offsets", json.dumps(manifest.get("source_offsets"))),
        ]
        rows += [
            (
                f"operator {o['uid']}",
                f"id {o['operator_id']}, {o['operator_name']}, {o['partitions']} partitions"
                + (f", {o['rows']} rows in {o['table']}" if o.get("table") else ""),
            )
            for o in manifest.get("operators", [])
        ]
        rows += [
            (f"table {name}", f"seq {t['seq']}, version {t['version']}: {t['table']}")
            for name, t in sorted(manifest.get("tables", {}).items())
        ]
    for label, value in rows:
        table.add_row(label, value)
    return table


def state_table(title: str, rows: list[dict[str, Any]]) -> Table:
    table = Table(title=title)
    columns = list(rows[0]) if rows else ["(no rows)"]
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(_cell(row[c]) for c in columns))
    return table


def _cell(value: Any) -> str:
    if isinstance(value, dict | list):
        return json.dumps(value, default=str)
    return _text(value)
