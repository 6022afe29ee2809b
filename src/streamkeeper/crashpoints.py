"""Named points in the commit protocol where the crash harness can SIGKILL the driver.

`STREAMKEEPER_CRASH_AT=point[:n]` kills this process (SIGKILL, no clean-up) the n-th
time (default 1st) it reaches `point`. Production runs never set it; the cost of an
unset point is one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

POINTS = (
    "batch_before_manifest",  # executors wrote pre-commit files, manifest not yet written
    "batch_after_manifest",  # manifest written, batch not yet returned to Spark (no commits/N)
    "batch_after_commit",  # in-batch sinks (idempotent, at_least_once) committed, no commits/N
    "before_delta_commit",  # commits/N exists, no table committed yet
    "between_table_commits",  # first table committed, the next not yet
    "before_commit_marker",  # every table committed, commit marker not yet written
    "recovery_after_commit",  # recovery committed one pending manifest, more may follow
    "recovery_before_cleanup",  # recovery resolved manifests, orphans not yet removed
)

_counts: dict[str, int] = {}


def _target() -> tuple[str, int] | None:
    raw = os.environ.get("STREAMKEEPER_CRASH_AT")
    if not raw:
        return None
    point, _, nth = raw.partition(":")
    if point not in POINTS:
        raise ValueError(f"STREAMKEEPER_CRASH_AT={raw!r} names no crash point; one of {POINTS}")
    return point, int(nth or 1)


def reached(point: str) -> None:
    """Mark that the protocol reached `point`; die here if the harness asked for it."""
    target = _target()
    if target is None or target[0] != point:
        return
    _counts[point] = _counts.get(point, 0) + 1
    if _counts[point] == target[1]:
        os.kill(os.getpid(), signal.SIGKILL)
