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
from typing import Any

from streamkeeper.client import StreamkeeperClient
from streamkeeper.errors import StreamkeeperError
from streamkeeper.lineage.commands import CommandBox
from streamkeeper.lineage.control import ControlPlane
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
            job,
            "stop",
            format=fmt,
            savepoint=True,
            command_id=stop_command_id(record.id),
            hold=f"upgrade:{record.id}",  # S1 is born held: retention cannot take it
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
    _hold_the_lineage(client, records, record, result.epoch, result.savepoint_id)
    archive = None
    if live_dir == blue_dir and blue_dir.exists():
        archive = Path(f"{blue_dir}.{record.id}.blue")
        os.replace(blue_dir, archive)  # blue's own folder, kept as it stopped
    points.reached("handover_after_move")
    manifest, handover = _hold_s1(client, record, result.savepoint_id)
    handover.update(
        blue_checkpoint_archive=None if archive is None else str(archive),
        requested_at=started,
        blue_stopped_at=stopped,
        blue_stop_ms={k: round(v, 1) for k, v in result.timings.items()},
    )
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


def _hold_the_lineage(
    client: StreamkeeperClient,
    records: UpgradeRecords,
    record: UpgradeRecord,
    blue_epoch: int | None,
    s1: str,
) -> None:
    """Take the lineage from the stopped blue before its folder is moved aside.

    A start of the job (a person, the monitor) could take the lineage between blue's stop
    and green's start, then run its query in the folder the handover moves away: a new
    query over the input from its beginning. A start that came first is respected (the
    upgrade fails, blue's folder stays in place for it, S1 is released); one that comes
    later is fenced by this epoch and commits nothing (green's start takes over from it).
    """
    layout = LineageLayout(client.location, record.lineage, record.job)
    control = ControlPlane(client.store, layout)
    latest = control.latest_epoch()
    if blue_epoch is not None and latest > blue_epoch:
        reason = (
            f"the job was started again (epoch {latest}) after blue (epoch {blue_epoch}) "
            "stopped for the handover; that run keeps blue's checkpoint folder, and the "
            "upgrade ends here. Upgrade again once it runs"
        )
        SavepointRegistry(client.store, layout).release(s1, f"upgrade:{record.id}")
        _fail(records, record, reason)
        raise UpgradeError(f"upgrade {record.id!r}: {reason}")
    lease = control.acquire(takeover=True)
    log.info("upgrade %s: holds lineage %s at epoch %d", record.id, record.lineage, lease.epoch)


def _hold_s1(
    client: StreamkeeperClient, record: UpgradeRecord, savepoint_id: str
) -> tuple[SavepointManifest, dict[str, Any]]:
    """S1, held as the rollback target, and what the upgrade record says of it."""
    manifest = SavepointPlace(
        client.store, f"lineages/{record.lineage}/savepoints/{savepoint_id}"
    ).read()
    if manifest is None:
        raise UpgradeError(f"blue's stop savepoint {savepoint_id!r} has no manifest")
    layout = LineageLayout(client.location, record.lineage, record.job)
    SavepointRegistry(client.store, layout).hold(
        manifest.id, f"upgrade:{record.id}", "rollback target while green is on probation"
    )
    return manifest, handover_facts(manifest)


def handover_facts(s1: SavepointManifest) -> dict[str, Any]:
    """What the upgrade record says of blue's stop savepoint S1: the rollback target."""
    return {
        "blue_savepoint": s1.id,
        "seq": s1.seq,
        "batch_id": s1.batch_id,
        "tables": {
            name: {"table": t.table, "seq": t.seq, "version": t.version}
            for name, t in s1.tables.items()
        },
    }


def settle_dead_handover(
    client: StreamkeeperClient, job: str, upgrade_id: str, why: str
) -> UpgradeRecord | None:
    """Green died before it went live: end the handover so that the DAG can finish it.

    - blue was not asked to stop, or the stop is withdrawn before blue claimed it: blue
      keeps running untouched; the upgrade is `failed`;
    - blue stopped with savepoint S1: the job is down at S1, with nothing of green's in
      its tables. The upgrade goes `live` with a failed probation, so the rollback task
      starts blue from S1 (its RESTORE finds the tables at S1 already);
    - blue's stop failed: blue keeps running; `failed`.

    Returns:
        The record, or None while blue is still answering the stop it claimed (the
        caller waits and asks again).
    """
    records = UpgradeRecords(client.store, job)
    record = records.read(upgrade_id)
    if record.phase not in ("handover_requested", "handing_over"):
        return record  # live (the probation's path), or finished
    box = CommandBox(client.store, LineageLayout(client.location, record.lineage, job))
    command_id = stop_command_id(upgrade_id)
    result = box.result(command_id)
    if result is None and not box.withdraw(command_id, f"green died: {why}"):
        return None  # blue claimed it: its answer decides
    expected = ("handover_requested", "handing_over")
    if result is None or not result.ok or result.savepoint_id is None:
        stop = "was withdrawn" if result is None else f"failed ({result.reason})"
        reason = f"green died during the handover ({why}); blue's stop {stop}: blue runs on"
        return records.advance(upgrade_id, expected, "failed", reason=reason)
    _manifest, handover = _hold_s1(client, record, result.savepoint_id)
    reason = f"green died during the handover, after blue stopped with {result.savepoint_id}: {why}"
    verdict = {
        "passed": False,
        "reason": reason,
        "started_at": time.time(),
        "ended_at": time.time(),
    }
    return records.advance(
        upgrade_id, expected, "live", reason=reason, handover=handover, probation=verdict
    )


def _fail(records: UpgradeRecords, record: UpgradeRecord, reason: str) -> None:
    log.error("upgrade %s failed: %s", record.id, reason)
    try:
        records.advance(record.id, ("handing_over",), "failed", reason=reason)
    except UpgradeError:
        log.warning("could not record the failure of upgrade %s", record.id, exc_info=True)
