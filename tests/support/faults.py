"""Faults injected into the runtime's `injection` points, configured by environment.

A driver process started by a test loads this module with
`STREAMKEEPER_INJECT=tests.support.faults` (and the repository on PYTHONPATH); an
in-process test calls `install()` itself. Each variable is read when its point is
reached, so a test may change it between runs:

- `STREAMKEEPER_CRASH_AT=point[:n][@live]` — SIGKILL this process the n-th time (default
  1st) it reaches a crash point of the commit protocol (`streamkeeper.commit.crashpoints`),
  of taking, deleting and restoring savepoints (`streamkeeper.snapshots.savepoint_points`),
  or of a handover or a rollback (`streamkeeper.upgrade.points`). With `@live`, only
  reaches after this process reached `handover_after_live` count: green's driver commits
  in its shadow run first, and blue never goes live, so `before_delta_commit:1@live` is
  green's first live commit and no other process's.
- `STREAMKEEPER_CRASH_ONCE=path` — the crash fires only if this process can create `path`
  (exclusively; it records the point and the pid): once per test, across processes. A
  retried Airflow task, or a driver restarted with the same environment, reaches the
  point again and must then get past it.
- `STREAMKEEPER_SLOW_BATCHES=1,2:2.5` — batches 1 and 2 take 2.5 s longer.
- `STREAMKEEPER_FAIL_BATCHES=3` — the first attempt of batch 3 raises (its replay succeeds).
- `STREAMKEEPER_FAIL_UPLOADS=2` — the first 2 checkpoint uploads raise.
- `STREAMKEEPER_SLOW_COMMITS=0.5` — every table commit takes 0.5 s longer.
- `STREAMKEEPER_STATE_ON_EXECUTORS=1` — a canonical restore's tasks write the state
  however small it is (`restore.DRIVER_STATE_BYTES` 0), as a large state's do.
"""

from __future__ import annotations

import os
import signal
import time

from streamkeeper import injection
from streamkeeper.commit.crashpoints import POINTS as COMMIT_POINTS
from streamkeeper.snapshots.savepoint_points import POINTS as SAVEPOINT_POINTS
from streamkeeper.upgrade.points import POINTS as LIFECYCLE_POINTS

POINTS = COMMIT_POINTS + SAVEPOINT_POINTS + LIFECYCLE_POINTS

_failed_batches: set[int] = set()
_failed_uploads = 0
_crash_counts: dict[str, int] = {}
_live = False  # this process reached `handover_after_live` (`@live` counts from there)
LIVE_QUALIFIER = "@live"


class InjectedFault(RuntimeError):
    """A failure a test asked for."""


def reset() -> None:
    """Forget which faults already fired (between in-process tests)."""
    global _failed_uploads, _live
    _failed_batches.clear()
    _failed_uploads = 0
    _crash_counts.clear()
    _live = False


def parse_crash_target(raw: str) -> tuple[str, int, bool]:
    """`point[:n][@live]` -> (point, n, only after going live).

    Raises:
        ValueError: naming the bad value and the expected form.
    """
    spec, live = raw, raw.endswith(LIVE_QUALIFIER)
    if live:
        spec = raw.removesuffix(LIVE_QUALIFIER)
    point, _, nth = spec.partition(":")
    if point not in POINTS:
        raise ValueError(f"STREAMKEEPER_CRASH_AT={raw!r} names no crash point; one of {POINTS}")
    if nth and not (nth.isdigit() and int(nth) >= 1):
        raise ValueError(
            f"STREAMKEEPER_CRASH_AT={raw!r}: {nth!r} is no count; expected point[:n][@live], n >= 1"
        )
    return point, int(nth or 1), live


def _crash_target() -> tuple[str, int, bool] | None:
    raw = os.environ.get("STREAMKEEPER_CRASH_AT")
    return parse_crash_target(raw) if raw else None


def _claim_once() -> bool:
    """Whether this crash may fire: always, unless STREAMKEEPER_CRASH_ONCE names a file
    that already exists (a crash fired before, in this or another process)."""
    marker = os.environ.get("STREAMKEEPER_CRASH_ONCE")
    if not marker:
        return True
    try:
        descriptor = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(descriptor, "w") as out:
        out.write(f"{os.environ.get('STREAMKEEPER_CRASH_AT')} pid={os.getpid()}\n")
        out.flush()
        os.fsync(out.fileno())  # the test reads it to know the fault fired
    return True


def crash_if_asked(point: str) -> None:
    global _live
    target = _crash_target()
    if point == "handover_after_live":
        _live = True  # before the check: `handover_after_live@live` is that very reach
    if target is None or target[0] != point or (target[2] and not _live):
        return
    _crash_counts[point] = _crash_counts.get(point, 0) + 1
    if _crash_counts[point] == target[1] and _claim_once():
        os.kill(os.getpid(), signal.SIGKILL)


def _batch_ids(variable: str) -> tuple[set[int], str]:
    raw = os.environ.get(variable, "")
    ids, _, argument = raw.partition(":")
    return {int(i) for i in ids.split(",") if i.strip()}, argument


def before_batch(batch_id: int, **_context: object) -> None:
    slow, seconds = _batch_ids("STREAMKEEPER_SLOW_BATCHES")
    if batch_id in slow:
        time.sleep(float(seconds or 2.0))
    failing, _ = _batch_ids("STREAMKEEPER_FAIL_BATCHES")
    if batch_id in failing and batch_id not in _failed_batches:
        _failed_batches.add(batch_id)
        raise InjectedFault(f"injected failure of batch {batch_id}")


def before_upload(**_context: object) -> None:
    global _failed_uploads
    limit = int(os.environ.get("STREAMKEEPER_FAIL_UPLOADS", "0") or 0)
    if _failed_uploads < limit:
        _failed_uploads += 1
        raise InjectedFault(f"injected failure of checkpoint upload {_failed_uploads}")


def before_table_commit(**_context: object) -> None:
    delay = float(os.environ.get("STREAMKEEPER_SLOW_COMMITS", "0") or 0)
    if delay > 0:
        time.sleep(delay)


def install() -> None:
    """Register every fault handler (idempotent)."""
    injection.clear()
    for point in POINTS:
        injection.register(point, lambda point=point, **_c: crash_if_asked(point))
    injection.register("batch_start", before_batch)
    injection.register("before_upload", before_upload)
    injection.register("before_table_commit", before_table_commit)
    if os.environ.get("STREAMKEEPER_STATE_ON_EXECUTORS"):
        from streamkeeper.state import restore

        restore.DRIVER_STATE_BYTES = 0
