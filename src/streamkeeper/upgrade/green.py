"""Green's driver: a shadow run from blue's savepoint, then, when told, the handover.

One process, one Spark session, two runs of the new spec:

1. **Shadow**: the spec renamed and pointed at shadow tables (`shadow.shadow_spec`),
   restored from blue's savepoint S0, running beside blue until stopped. The quality
   gate (Airflow) reads its output meanwhile.
2. **Handover**, if the upgrade is `handover_requested` when the shadow run stops:
   blue is stopped with a savepoint S1 at a batch boundary (a stop command), blue's
   checkpoint directory is set aside, and the live run restores S1 and continues the
   lineage: next epoch, next seq, the live tables. The JVM, the session and the code are
   warm from the shadow run, so the gap in live output is S1's stop, its restore and one
   trigger interval.

Anything else (the upgrade rejected, the shadow run stopped or cancelled) ends the process after
step 1; blue was never touched.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

from streamkeeper.client import StreamkeeperClient
from streamkeeper.errors import StreamkeeperError
from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.runtime.job import resolve_paths
from streamkeeper.runtime.runner import JobRunner, RunOptions, RunResult, run_job
from streamkeeper.snapshots.savepoint_manifest import SavepointPlace
from streamkeeper.snapshots.savepoints import SavepointRegistry
from streamkeeper.spec import JobSpec
from streamkeeper.upgrade import points
from streamkeeper.upgrade.record import UpgradeError, UpgradeRecord, UpgradeRecords
from streamkeeper.upgrade.shadow import shadow_spec

log = logging.getLogger(__name__)

STOP_POLL = 0.05  # how often green looks for blue's stop result during the handover


@dataclass(frozen=True)
class GreenOptions:
    upgrade_id: str
    spec_dir: Path
    run_token: str | None = None
    master: str | None = None
    blue_stop_timeout: float = 600.0


def run_green(spec: JobSpec, options: GreenOptions) -> RunResult | None:
    """Run green: shadow, then live if the upgrade asks for the handover.

    Returns:
        The live run's result, or None if the upgrade ended at the shadow run.

    Raises:
        UpgradeError: the upgrade is not in the shadow phase, blue would not stop, or the
            live checkpoint directory is taken (the record says why, too).
    """
    paths = resolve_paths(spec)
    store = paths.root.store()
    records = UpgradeRecords(store, spec.name)
    record = records.read(options.upgrade_id)
    if record.phase != "shadow":
        raise UpgradeError(
            f"upgrade {record.id!r} is {record.phase}, not shadow: green starts only once "
            "(start a new upgrade)"
        )
    live_dir = paths.checkpoint_dir
    blue_dir = Path(record.blue["checkpoint_dir"])
    if live_dir != blue_dir and _holds_files(live_dir):
        raise UpgradeError(
            f"green's checkpoint directory {str(live_dir)!r} is not empty; point "
            "checkpoint.dir at a new folder, or at blue's"
        )
    shadow = shadow_spec(spec, record.id, live_dir)
    s0 = paths.root.child(f"lineages/{record.lineage}/savepoints/{record.blue['savepoint']}")
    shadow_options = RunOptions(
        master=options.master,
        spec_dir=options.spec_dir,
        run_token=options.run_token,  # the shadow job's heartbeats: its starter finds it
        from_savepoint=s0.uri,
        shadow_of=(spec.name, record.lineage),
        command_poll_interval=0.2,
    )
    log.info("upgrade %s: shadow run %s from savepoint %s", record.id, shadow.name, s0.uri)
    run_job(shadow, shadow_options)
    record = records.read(options.upgrade_id)
    if record.phase != "handover_requested":
        log.info("upgrade %s is %s: green ends after its shadow run", record.id, record.phase)
        return None
    return _hand_over(spec, options, records, record, blue_dir, live_dir)


def _hand_over(
    spec: JobSpec,
    options: GreenOptions,
    records: UpgradeRecords,
    record: UpgradeRecord,
    blue_dir: Path,
    live_dir: Path,
) -> RunResult:
    started = time.time()
    records.advance(record.id, ("handover_requested",), "handing_over")
    # Everything read-only of the live run (Spark, the output, the tables' checks) while
    # blue still runs: the gap is then blue's stop, the restore and one batch.
    runner = JobRunner(
        spec,
        RunOptions(master=options.master, spec_dir=options.spec_dir, run_token=options.run_token),
    )
    runner.warm_up()
    client = StreamkeeperClient(resolve_paths(spec).root.uri)
    fmt = record.green.get("format", "canonical")
    points.reached("handover_before_blue_stop")
    try:
        command = client.send_command(
            spec.name, "stop", format=fmt, savepoint=True, command_id=f"stop-{record.id}"
        )
        result = client.wait_for_result(
            spec.name, command.id, timeout=options.blue_stop_timeout, poll=STOP_POLL
        )
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
    layout = LineageLayout(client.location, record.lineage, spec.name)
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
    runner.options = replace(runner.options, from_savepoint=manifest.id)
    return runner.run()


def _fail(records: UpgradeRecords, record: UpgradeRecord, reason: str) -> None:
    log.error("upgrade %s failed: %s", record.id, reason)
    try:
        records.advance(record.id, ("handing_over",), "failed", reason=reason)
    except UpgradeError:
        log.warning("could not record the failure of upgrade %s", record.id, exc_info=True)


def _holds_files(directory: Path) -> bool:
    return directory.is_dir() and any(directory.iterdir())
