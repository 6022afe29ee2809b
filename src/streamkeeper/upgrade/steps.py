"""The steps of an upgrade that run outside green's driver, pyspark-free.

The Airflow operators call these, so do the tests and `benchmarks/upgrade.py`:

    begin_upgrade      blue RUNNING -> savepoint S0 (self-contained) -> record `shadow`
    (launch green)     `streamkeeper upgrade-green SPEC --upgrade-id ID`
    validate_upgrade   quality gate on green's shadow tables + comparison with blue
    reject_upgrade     `shadow` -> `rejected`; green's shadow run stopped; blue untouched
    request_handover   `shadow` -> `handover_requested`; green's shadow run stopped
    handover_gap       blue's last live commit -> green's first (once green committed)
    promote_upgrade    `live` -> `promoted` after probation
    (roll back)        upgrade/rollback.py: the tables back to a savepoint (the restart
                       from the savepoint is the launcher's: the caller starts blue)
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamkeeper.client import StreamkeeperClient
from streamkeeper.errors import StreamkeeperError
from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.lineage.markers import marker_seqs_after
from streamkeeper.snapshots.savepoint_manifest import SavepointManifest, SavepointPlace
from streamkeeper.snapshots.savepoints import SavepointRegistry, check_savepoint_id
from streamkeeper.upgrade.compare import Comparison, SinkSide, compare_outputs
from streamkeeper.upgrade.record import UpgradeError, UpgradeRecord, UpgradeRecords
from streamkeeper.upgrade.shadow import shadow_job_name, shadow_table

log = logging.getLogger(__name__)


def _layout(client: StreamkeeperClient, job: str) -> LineageLayout:
    record = client.job_record(job)
    return LineageLayout(client.location, record.lineage, job)


def _holder(upgrade_id: str) -> str:
    return f"upgrade:{upgrade_id}"


def begin_upgrade(
    client: StreamkeeperClient,
    job: str,
    upgrade_id: str,
    *,
    green_spec_path: str,
    blue_spec_path: str | None,
    fmt: str = "canonical",
    run_token: str | None = None,
    timeout: float = 600.0,
    blue_launch: dict[str, Any] | None = None,
) -> UpgradeRecord:
    """Savepoint blue without stopping it; record the upgrade in its `shadow` phase.

    A retry with the same id returns the record made the first time (the savepoint
    command's id is derived from the upgrade's, so it is not taken twice).

    Raises:
        UpgradeError: blue is not RUNNING, or its savepoint failed (the reason).
    """
    records = UpgradeRecords(client.store, job)
    try:
        return records.read(upgrade_id)
    except UpgradeError:
        pass
    status = client.settled_status(job)  # a storage outage's lost beats are no verdict
    if status.state not in ("RUNNING", "DEGRADED"):
        raise UpgradeError(
            f"job {job!r} is {status.state}, not RUNNING: an upgrade starts from a running "
            "job (start it first, or restore the new version from a savepoint)"
        )
    command = client.send_command(
        job, "savepoint", format=fmt, self_contained=True, command_id=f"savepoint-{upgrade_id}"
    )
    result = client.wait_for_result(job, command.id, timeout=timeout, poll=0.2)
    if not result.ok or result.savepoint_id is None:
        raise UpgradeError(
            f"blue's savepoint failed ({result.reason or result.error}); nothing was changed"
        )
    job_record = client.job_record(job)
    layout = LineageLayout(client.location, job_record.lineage, job)
    SavepointRegistry(client.store, layout).hold(
        result.savepoint_id, _holder(upgrade_id), "green's shadow run starts from it"
    )
    record = UpgradeRecord(
        id=upgrade_id,
        job=job,
        lineage=job_record.lineage,
        phase="shadow",
        blue={
            "spec_path": blue_spec_path,
            "savepoint": result.savepoint_id,
            "seq": result.details.get("seq"),
            "checkpoint_dir": job_record.checkpoint_dir,
            "run_token": None if status.runner is None else status.runner.run_token,
            "launch": blue_launch,  # how blue was launched: a rollback launches it so again
        },
        green={
            "spec_path": green_spec_path,
            "shadow_job": shadow_job_name(job, upgrade_id),
            "format": fmt,
            "begin_token": run_token,  # who began it (a retried begin finds its record)
            "run_token": None,  # green's driver's, set when it is launched
        },
    )
    return records.create(record)


def savepoint_manifest(
    client: StreamkeeperClient, lineage: str, savepoint_id: str
) -> SavepointManifest:
    """A savepoint's manifest (of a lineage below the client's root).

    Raises:
        UpgradeError: it has none.
    """
    check_savepoint_id(savepoint_id)  # never a path
    manifest = SavepointPlace(client.store, f"lineages/{lineage}/savepoints/{savepoint_id}").read()
    if manifest is None:
        raise UpgradeError(f"savepoint {savepoint_id!r} of lineage {lineage!r} has no manifest")
    return manifest


def compare_with_blue(
    client: StreamkeeperClient,
    record: UpgradeRecord,
    green_keys: dict[str, list[str] | None],
    changelog_keys: dict[str, list[str]] | None = None,
) -> Comparison:
    """Green's shadow output against blue's live output over the same input (compare.py).

    Args:
        green_keys: green's sinks and their merge keys (None: append).
        changelog_keys: green's append sinks that declare a key (changelogs), by name.
    """
    changelog_keys = changelog_keys or {}
    blue_record = client.job_record(record.job)
    manifest = savepoint_manifest(client, record.lineage, record.blue["savepoint"])
    shadow = record.green["shadow_job"]
    green_sinks = {
        name: SinkSide(
            client.location.child(shadow_table(record.job, record.id, name)).uri,
            key,
            changelog_keys.get(name),
        )
        for name, key in green_keys.items()
    }
    # Blue's record names each table's output, not its key: a merge is compared by green's.
    blue_sinks = {
        name: SinkSide(
            t.table,
            green_keys.get(name) if t.output == "merge" else None,
            changelog_keys.get(name) if t.output == "append" else None,
        )
        for name, t in blue_record.tables.items()
    }
    return compare_outputs(
        client.location,
        LineageLayout(client.location, record.lineage, record.job),
        LineageLayout(client.location, shadow, shadow),
        since={name: t.version for name, t in manifest.tables.items()},
        blue_sinks=blue_sinks,
        green_sinks=green_sinks,
        since_seq=manifest.seq,
    )


def shadow_tables(
    client: StreamkeeperClient, record: UpgradeRecord, sinks: list[str]
) -> dict[str, str]:
    """Green's shadow table URIs, by sink."""
    return {s: client.location.child(shadow_table(record.job, record.id, s)).uri for s in sinks}


def reject_upgrade(
    client: StreamkeeperClient, job: str, upgrade_id: str, reason: str
) -> UpgradeRecord:
    """The gate said no: green's shadow run stops, blue keeps running untouched.

    At a batch boundary, not cancelled: a cancel interrupts the batch in flight and
    leaves its WAL manifest, staging and pre-committed files for the next start's
    recovery, and a shadow lineage never starts again.
    """
    records = UpgradeRecords(client.store, job)
    record = records.advance(upgrade_id, ("shadow",), "rejected", reason=reason)
    _stop_shadow(client, record, cancel=False, command_id=f"reject-{upgrade_id}")
    _release(client, record, record.blue["savepoint"])
    return record


def request_handover(client: StreamkeeperClient, job: str, upgrade_id: str) -> UpgradeRecord:
    """Ask green to hand over: its shadow run stops, then it stops blue and goes live."""
    records = UpgradeRecords(client.store, job)
    record = records.read(upgrade_id)
    if record.phase == "shadow":
        record = records.advance(upgrade_id, ("shadow",), "handover_requested")
    elif record.phase not in ("handover_requested", "handing_over", "live"):
        raise UpgradeError(
            f"upgrade {upgrade_id!r} is {record.phase} ({record.reason}); it cannot hand over"
        )
    if record.phase == "handover_requested":
        _stop_shadow(client, record, cancel=False, command_id=f"handover-{upgrade_id}")
    return record


def _stop_shadow(
    client: StreamkeeperClient,
    record: UpgradeRecord,
    *,
    cancel: bool,
    command_id: str | None = None,
) -> None:
    shadow = record.green["shadow_job"]
    try:
        if cancel:
            client.send_command(shadow, "cancel", command_id=command_id)
        else:
            client.send_command(shadow, "stop", savepoint=False, command_id=command_id)
    except StreamkeeperError as error:  # never started, or gone: nothing to stop
        log.warning("could not stop green's shadow run %s: %s", shadow, error)


def _release(client: StreamkeeperClient, record: UpgradeRecord, savepoint_id: str) -> None:
    layout = LineageLayout(client.location, record.lineage, record.job)
    try:
        SavepointRegistry(client.store, layout).release(savepoint_id, _holder(record.id))
    except StreamkeeperError as error:
        log.warning("could not release savepoint %s: %s", savepoint_id, error)


@dataclass(frozen=True)
class HandoverGap:
    """Blue's last live commit and green's first, in seconds since the epoch."""

    blue_last_commit_at: float
    green_first_commit_at: float
    green_first_seq: int

    @property
    def gap_s(self) -> float:
        return self.green_first_commit_at - self.blue_last_commit_at


def handover_gap(client: StreamkeeperClient, record: UpgradeRecord) -> HandoverGap | None:
    """The handover's gap, once green committed its first live batch (None before)."""
    if record.handover is None:
        return None
    layout = LineageLayout(client.location, record.lineage, record.job)
    seq = int(record.handover["seq"])
    blue_last = client.store.read_json(layout.marker(seq))
    after = marker_seqs_after(client.store, layout, seq)
    if blue_last is None or not after:
        return None
    first = client.store.read_json(layout.marker(after[0])) or {}
    if "committed_at" not in first:
        return None
    return HandoverGap(float(blue_last["committed_at"]), float(first["committed_at"]), after[0])


def record_gap(client: StreamkeeperClient, job: str, upgrade_id: str, gap: HandoverGap) -> None:
    def change(record: UpgradeRecord) -> None:
        handover = dict(record.handover or {})
        handover.update(
            blue_last_commit_at=gap.blue_last_commit_at,
            green_first_commit_at=gap.green_first_commit_at,
            green_first_seq=gap.green_first_seq,
            gap_s=round(gap.gap_s, 3),
        )
        record.handover = handover

    UpgradeRecords(client.store, job).update(upgrade_id, change)


def promote_upgrade(
    client: StreamkeeperClient, job: str, upgrade_id: str, probation: dict[str, Any]
) -> UpgradeRecord:
    """Probation passed: green is the job now. Blue's savepoints stay (rollback targets)."""
    records = UpgradeRecords(client.store, job)
    record = records.advance(upgrade_id, ("live",), "promoted", probation=probation)
    _release(client, record, record.blue["savepoint"])
    release_rollback_target(client, record)
    return record


def release_rollback_target(client: StreamkeeperClient, record: UpgradeRecord) -> None:
    """The upgrade ended (promoted, or rolled back and blue running again): S1 is no
    longer held for it (savepoint retention may delete it like any other, unless the job
    was restored from it)."""
    handover = record.handover or {}
    if handover.get("blue_savepoint"):
        _release(client, record, handover["blue_savepoint"])


def set_aside(directory: str | Path, label: str) -> str | None:
    """Move a checkpoint directory away (kept, renamed) so a restore finds it empty."""
    path = Path(directory)
    if not path.is_dir() or not any(path.iterdir()):
        return None
    target = Path(f"{path}.{label}")
    os.replace(path, target)
    return str(target)


def wait_for(predicate: Any, timeout: float, poll: float = 0.5, what: str = "a condition") -> Any:
    """Poll `predicate` until it returns something truthy; raises UpgradeError on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise UpgradeError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(poll)
