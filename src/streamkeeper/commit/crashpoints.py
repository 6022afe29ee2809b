"""The named points of the commit protocol where the crash harness kills the driver.

Each is an `injection` point; `tests/support/faults.py` SIGKILLs the driver at one of
them when `STREAMKEEPER_CRASH_AT=point[:n]` is set. PROTOCOL.md says why each is safe.
"""

from __future__ import annotations

from streamkeeper import injection

POINTS = (
    "batch_before_manifest",  # executors wrote pre-commit files, manifest not yet written
    "batch_after_manifest",  # manifest written, batch not yet returned to Spark (no commits/N)
    "batch_after_commit",  # in-batch sinks (idempotent, at_least_once) committed, no commits/N
    "before_delta_commit",  # commits/N exists, no table committed yet
    "between_table_commits",  # first table committed, the next not yet
    "before_commit_marker",  # every table committed, commit marker not yet written
    "recovery_after_commit",  # recovery committed one pending manifest, more may follow
    "recovery_before_cleanup",  # recovery resolved manifests, orphans not yet removed
    "before_log_expiry",  # maintenance wrote a Delta checkpoint, old log not yet deleted
)


def reached(point: str) -> None:
    """Mark that the protocol reached `point` (a crash point)."""
    injection.reached(point)
