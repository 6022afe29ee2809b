"""The named points of a handover and a rollback where the lifecycle chaos tests kill the
process that is at them (green's driver, or the task that rolls back).

Each is an `injection` point (`tests/support/faults.py`, `STREAMKEEPER_CRASH_AT`);
UPGRADE.md says what each leaves behind and how the DAGs finish the upgrade from there.
"""

from __future__ import annotations

from streamkeeper import injection

POINTS = (
    "handover_before_blue_stop",  # green: handing_over, warm; blue not yet asked to stop
    "handover_after_stop_result",  # green: blue stopped with savepoint S1; its folder in place
    "handover_after_move",  # green: blue's checkpoint folder set aside; the record not live
    "handover_after_live",  # green: the record is live; green's live run not started
    "rollback_after_fence",  # rollback: the lineage's epoch taken and every table fenced
    "rollback_between_restores",  # rollback: one table restored, the next not yet
    "rollback_before_restart",  # rollback: every table restored; blue not yet started
)


def reached(point: str) -> None:
    """Mark that a handover or a rollback reached `point`."""
    injection.reached(point)
