"""The named points of taking, deleting and restoring a savepoint where the crash
harness kills the driver (`tests/support/faults.py`, `STREAMKEEPER_CRASH_AT`).

Each is an `injection` point; PROTOCOL.md ("Savepoints") says what each leaves behind
and why the previous savepoint and the job stay intact.
"""

from __future__ import annotations

from streamkeeper import injection

POINTS = (
    "savepoint_after_register",  # registry: pending entry; nothing captured yet
    "savepoint_after_pin",  # the checkpoint is pinned (or uploaded and pinned); no manifest
    "savepoint_during_copy",  # self-contained: some files copied into the savepoint folder
    "savepoint_before_manifest",  # every file captured; manifest not written
    "savepoint_after_manifest",  # manifest written; registry entry still pending
    "savepoint_after_complete",  # registry entry complete; retention not yet applied
    "stop_after_savepoint",  # stop: savepoint complete, the query not yet stopped
    "savepoint_dispose_after_mark",  # delete/retention: entry `deleting`, data intact
    "savepoint_dispose_after_data",  # manifest and files deleted; pin and entry remain
    "restore_savepoint_during_download",  # some files in the restore's staging folder
    "restore_state_after_pieces",  # canonical: the tasks wrote the state's pieces, unjoined
    "restore_savepoint_after_rename",  # the checkpoint directory in place; no query yet
)


def reached(point: str) -> None:
    """Mark that taking, deleting or restoring a savepoint reached `point`."""
    injection.reached(point)
