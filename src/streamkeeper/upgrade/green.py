"""Green's driver: a shadow run from blue's savepoint, then, when told, the handover.

One process, one Spark session, two runs of the new spec:

1. **Shadow**: the spec renamed and pointed at shadow tables (`shadow.shadow_spec`),
   restored from blue's savepoint S0, running beside blue until stopped. The quality
   gate (Airflow) reads its output meanwhile.
2. **Handover**, if the upgrade is `handover_requested` when the shadow run stops:
   blue is stopped with a savepoint S1 at a batch boundary (a stop command), blue's
   checkpoint directory is set aside, and the live run restores S1 and continues the
   lineage: next epoch, next seq, the live tables. The JVM, the session and the code are
   warm from the shadow run, and a canonical restore's bootstrap batch (a native
   restore's planned operators, which its topology check reads) is done before blue is
   asked to stop, so the gap in live output is S1's stop, the restore's state writing
   and one trigger interval.

Anything else (the upgrade rejected, the shadow run stopped or cancelled) ends the process after
step 1; blue was never touched.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path

from streamkeeper.client import StreamkeeperClient
from streamkeeper.runtime.job import resolve_paths
from streamkeeper.runtime.runner import JobRunner, RunOptions, RunResult, run_job
from streamkeeper.spec import JobSpec
from streamkeeper.upgrade.handover import stop_blue
from streamkeeper.upgrade.record import UpgradeError, UpgradeRecord, UpgradeRecords
from streamkeeper.upgrade.shadow import shadow_spec

log = logging.getLogger(__name__)


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
    try:
        if record.green.get("format", "canonical") == "canonical":
            # S1's restore starts at its state: the bootstrap batch (the new code over
            # an empty input) runs now, not in the gap. Beside the live directory, named
            # for the upgrade like the shadow's; removed when taken or not.
            runner.prepare_canonical_restore(Path(f"{live_dir}.{record.id}.bootstrap"))
        else:
            runner.planned_operators()  # what the native restore's topology check reads
        client = StreamkeeperClient(resolve_paths(spec).root.uri)
        manifest = stop_blue(
            client,
            records,
            record,
            blue_dir=blue_dir,
            live_dir=live_dir,
            started=started,
            timeout=options.blue_stop_timeout,
        )
        # The handover holds the lineage for green (an epoch above blue's): green takes over.
        runner.options = replace(runner.options, from_savepoint=manifest.id, takeover=True)
        return runner.run()
    finally:
        runner.discard_prepared()


def _holds_files(directory: Path) -> bool:
    return directory.is_dir() and any(directory.iterdir())
