"""The handover's storage side, Spark-free: blue stops with a savepoint, green takes over.

Green's driver (green.py) warms its live run up first, then calls `stop_blue`, then
restores the savepoint it returns. What each step leaves behind if green dies at it,
and how the DAGs finish the upgrade from there: UPGRADE.md.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from streamkeeper.client import StreamkeeperClient
from streamkeeper.errors import StreamkeeperError
from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.snapshots.savepoint_manifest import SavepointManifest, SavepointPlace
from streamkeeper.snapshots.savepoints import SavepointRegistry
from streamkeeper.upgrade import points
from streamkeeper.upgrade.record import UpgradeError, UpgradeRecord, UpgradeRecords

log = logging.getLogger(__name__)

STOP_POLL = 0.05  # how often green looks for blue's stop result during the handover


def stop_command_id(upgrade_id: str) -> str:
    """The id of the stop command green sends blue (a retry is the same command)."""
    return f"stop-{upgrade_id}"


def stop_blue(
    client: StreamkeeperClient,
    records: UpgradeRecords,
    record: UpgradeRecord,
    *,
    blue_dir: Path,
    live_dir: Path,
    started: float,
    timeout: float,
) -> SavepointManifest:
    """Stop blue with a savepoint S1 at a batch boundary; move its checkpoint folder aside
    if green's is the same; hold S1 as the rollback target; record the upgrade `live`.

    Returns:
        S1's manifest: what green restores.

    Raises:
        UpgradeError: blue did not stop with a savepoint (the record says `failed`).
    """
    job = record.job
    fmt = record.green.get("format", "canonical")
    points.reached("handover_before_blue_stop")
    try:
        command = client.send_command(
            job, "stop", format=fmt, savepoint=True, command_id=stop_command_id(record.id)
        )
        result = client.wait_for_result(job, command.id, timeout=timeout, poll=STOP_POLL)
    except StreamkeeperError as error:
        _fail(records, record, f"blue did not stop: {error}")
        raise
    if not result.ok or result.savepoint_id is None:
        reason = f"blue did not stop with a savepoint: {result.reason or result.error}"
        _fail(records, record, reason)
        raise UpgradeError(f"upgrade {record.id!r}: {reason}")
    stopped = time.time()
    points.reached("handover_after_stop_result")
    archive = None
    if live_dir == blue_dir and blue_dir.exists():
        archive = Path(f"{blue_dir}.{record.id}.blue")
        os.replace(blue_dir, archive)  # blue's own folder, kept as it stopped
    points.reached("handover_after_move")
    manifest = SavepointPlace(
        client.store, f"lineages/{record.lineage}/savepoints/{result.savepoint_id}"
    ).read()
    assert manifest is not None  # the stop answered ok with this savepoint
    layout = LineageLayout(client.location, record.lineage, job)
    registry = SavepointRegistry(client.store, layout)
    registry.hold(
        manifest.id, f"upgrade:{record.id}", "rollback target while green is on probation"
    )
    handover = {
        "blue_savepoint": manifest.id,
        "seq": manifest.seq,
        "batch_id": manifest.batch_id,
        "tables": {
            name: {"table": t.table, "seq": t.seq, "version": t.version}
            for name, t in manifest.tables.items()
        },
        "blue_checkpoint_archive": None if archive is None else str(archive),
        "requested_at": started,
        "blue_stopped_at": stopped,
        "blue_stop_ms": {k: round(v, 1) for k, v in result.timings.items()},
    }
    records.advance(record.id, ("handing_over",), "live", handover=handover)
    log.info(
        "upgrade %s: blue stopped with savepoint %s (seq %d) in %.2fs; green goes live",
        record.id,
        manifest.id,
        manifest.seq,
        stopped - started,
    )
    points.reached("handover_after_live")
    return manifest


def _fail(records: UpgradeRecords, record: UpgradeRecord, reason: str) -> None:
    log.error("upgrade %s failed: %s", record.id, reason)
    try:
        records.advance(record.id, ("handing_over",), "failed", reason=reason)
    except UpgradeError:
        log.warning("could not record the failure of upgrade %s", record.id, exc_info=True)
