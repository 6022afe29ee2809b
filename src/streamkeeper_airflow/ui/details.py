"""What the page shows of one job when it is opened: charts, savepoints, upgrades.

Only the open job's history is read, bounded by the chosen window (its last N
checkpoints, from the history log's tail), and only its last few upgrade records.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from streamkeeper.client import Checkpoint, StreamkeeperClient

WINDOWS = (50, 200, 1000)  # checkpoints a chart may cover
RECENT_UPGRADES = 5
DURATION_PARTS = ("latest_offset_ms", "planning_ms", "write_ms", "wal_commit_ms")
DURATION_PARTS += ("commit_offsets_ms",)


def chart_series(rows: list[Checkpoint]) -> dict[str, Any]:
    """The history as columns, one value per checkpoint (oldest first), for the charts.

    State size is given per operator (by its name and position: two operators may share
    a name), as Flink's checkpoint UI shows it per subtask.
    """
    operators: dict[str, list[int | None]] = {}
    for index, row in enumerate(rows):
        for position, op in enumerate(row.state_operators):
            name = f"{position}:{op.get('operator', '?')}"
            operators.setdefault(name, [None] * len(rows))[index] = int(op.get("bytes") or 0)
    return {
        "checkpoint_id": [r.checkpoint_id for r in rows],
        "trigger_time": [r.trigger_time for r in rows],
        "duration_ms": [r.duration_ms for r in rows],
        "duration_parts_ms": {p: [getattr(r, p) for r in rows] for p in DURATION_PARTS},
        "input_rows_per_second": [r.input_rows_per_second for r in rows],
        "processed_rows_per_second": [r.processed_rows_per_second for r in rows],
        "state_bytes_by_operator": operators,
        "bytes_uploaded": [r.bytes_uploaded for r in rows],
        "visibility_delay_ms": [r.visibility_delay_ms for r in rows],
    }


def history_window(client: StreamkeeperClient, job: str, window: int) -> dict[str, Any]:
    """The chart series of the job's last `window` checkpoints.

    Raises:
        ValueError: a window the page does not offer (names those it does).
    """
    if window not in WINDOWS:
        raise ValueError(f"Invalid window {window}; expected one of {', '.join(map(str, WINDOWS))}")
    return {"window": window, **chart_series(client.history(job, last=window))}


def savepoint_list(client: StreamkeeperClient, job: str) -> list[dict[str, Any]]:
    """The job's savepoints, newest first, from its registry (no listing of their files)."""
    return [
        {
            "id": e.id,
            "format": e.format,
            "storage": e.storage,
            "state": e.state,
            "size": e.size,
            "protected": e.protected,
            "protected_reason": e.protected_reason,
            "created_at": e.created_at,
            "checkpoint_id": e.seq,
        }
        for e in reversed(client.savepoints(job))
    ]


def recent_upgrades(client: StreamkeeperClient, job: str) -> list[dict[str, Any]]:
    """The job's last upgrades, newest first: phase, validation, handover gap.

    Upgrade ids sort by time, so the last keys are the latest upgrades; only those are read.
    """
    from streamkeeper.upgrade.record import UpgradeRecord

    keys = [k for k in client.store.list(f"jobs/{job}/upgrades") if k.endswith(".json")]
    upgrades = []
    for key in reversed(keys[-RECENT_UPGRADES:]):
        data = client.store.read_json(key)
        if data is None:
            continue
        record = UpgradeRecord.from_json(data)
        validation = record.validation or {}
        upgrades.append(
            {
                "id": record.id,
                "phase": record.phase,
                "reason": record.reason,
                "created_at": record.created_at,
                "green_spec": (record.green or {}).get("spec_path"),
                "validation_passed": validation.get("success") if validation else None,
                "validation_reason": validation.get("reason"),
                "validation": validation or None,
                "handover_gap_s": (record.handover or {}).get("gap_s"),
                "probation_passed": (record.probation or {}).get("passed"),
            }
        )
    return upgrades
