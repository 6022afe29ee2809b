"""Injected faults for health tests: slow and failing batches, failing uploads.

Set by tests only, through the environment:
- `STREAMKEEPER_SLOW_BATCHES=1,2:2.5` — batches 1 and 2 take 2.5 s longer.
- `STREAMKEEPER_FAIL_BATCHES=3` — the first attempt of batch 3 raises (its replay succeeds).
- `STREAMKEEPER_FAIL_UPLOADS=2` — the first 2 checkpoint uploads raise.
"""

from __future__ import annotations

import os
import time

_failed_batches: set[int] = set()
_failed_uploads = 0


class InjectedFault(RuntimeError):
    """A failure a test asked for."""


def _batch_ids(variable: str) -> tuple[set[int], str]:
    raw = os.environ.get(variable, "")
    ids, _, argument = raw.partition(":")
    return {int(i) for i in ids.split(",") if i.strip()}, argument


def before_batch(batch_id: int) -> None:
    """Called at the start of every batch; a no-op unless a test set a fault."""
    slow, seconds = _batch_ids("STREAMKEEPER_SLOW_BATCHES")
    if batch_id in slow:
        time.sleep(float(seconds or 2.0))
    failing, _ = _batch_ids("STREAMKEEPER_FAIL_BATCHES")
    if batch_id in failing and batch_id not in _failed_batches:
        _failed_batches.add(batch_id)
        raise InjectedFault(f"injected failure of batch {batch_id}")


def before_upload() -> None:
    """Called before each checkpoint upload."""
    global _failed_uploads
    limit = int(os.environ.get("STREAMKEEPER_FAIL_UPLOADS", "0") or 0)
    if _failed_uploads < limit:
        _failed_uploads += 1
        raise InjectedFault(f"injected failure of checkpoint upload {_failed_uploads}")
