"""Commit markers: `markers/{seq}.json`, one per committed checkpoint, written last.

A marker records batch N of a lineage -> each table's Delta version holding it, so a
reader can read every output as of one checkpoint, and the lineage's head (its last
committed checkpoint) is the latest marker. Finding it never lists every marker of a
long-lived lineage: the caller gives a hint (a seq near the head: the highest seq a
table holds, or the heartbeat's last seq) and only the keys after a point below it are
listed, the point moving down geometrically until a marker is found.

Markers are retired (`retire_markers`, on the table maintenance cadence), or a lineage's
object count would grow by one per checkpoint forever. A marker is kept while any holds:
- it is among the newest `maintenance.markers_kept` (the upgrade comparison reads the newest
  `MARKER_WINDOW`, a sensor the ones after a recent checkpoint);
- a retained externalized checkpoint, a pinned checkpoint or a savepoint has its seq (its
  versions are the tables' protected floor, and a rollback restores them);
- it was committed less than `maintenance.history_retention` ago (a reader outside the
  lineage reads the output as of a checkpoint while the tables keep its versions).
Seqs therefore have gaps below the newest markers: nothing may probe them by contiguity.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterable
from typing import Any

from streamkeeper.lineage.layout import LineageLayout, seq_of
from streamkeeper.storage import ObjectStore


def latest_marker(
    store: ObjectStore, layout: LineageLayout, near: int | None = None
) -> dict[str, Any] | None:
    """The marker with the highest seq, or None if the lineage never committed.

    Args:
        near: a seq at or just above the head (e.g. the highest seq a table holds: a
            crash between the tables and the marker leaves the head just below it).
            None lists every marker.
    """
    step = 1
    while True:
        start = None if near is None else near - step
        if start is None or start < 0:
            keys = store.list(layout.markers)
        else:
            keys = store.list(layout.markers, start_after=layout.marker(start))
        for key in reversed(keys):
            marker = store.read_json(key) if key.endswith(".json") else None
            if marker is not None:
                return marker
        if start is None or start < 0:
            return None
        step *= 16


def marker_at_or_below(
    store: ObjectStore,
    layout: LineageLayout,
    seq: int,
    accept: Callable[[dict[str, Any]], bool] | None = None,
) -> dict[str, Any] | None:
    """The marker with the highest seq at or below `seq` that `accept` takes, or None.

    One read if marker `seq` exists and is taken (a savepoint's is kept); otherwise only
    the keys after a point below `seq` are listed, the point moving down geometrically.
    """
    exact = store.read_json(layout.marker(seq))
    if exact is not None and (accept is None or accept(exact)):
        return exact
    step, checked = 16, seq  # markers at or above `checked` were looked at
    while True:
        start = seq - step
        after = None if start < 0 else layout.marker(start)
        for key in reversed(store.list(layout.markers, start_after=after)):
            if not key.endswith(".json") or seq_of(key) >= checked:
                continue
            marker = store.read_json(key)
            if marker is not None and (accept is None or accept(marker)):
                return marker
        if start < 0:
            return None
        checked, step = start + 1, step * 16


def marker_seqs_after(store: ObjectStore, layout: LineageLayout, seq: int) -> list[int]:
    """Seqs of the markers above `seq`."""
    return [seq_of(k) for k in store.list(layout.markers, start_after=layout.marker(seq))]


KEEP_LAST = 1000  # newest markers always kept; above the upgrade comparison's window


def retire_markers(
    store: ObjectStore,
    layout: LineageLayout,
    *,
    head_seq: int,
    protected: Iterable[int],
    history_retention: float,
    keep_last: int = KEEP_LAST,
    now: float | None = None,
    guard: Callable[[], None] | None = None,
) -> list[int]:
    """Delete the markers nothing needs any more (module doc); returns their seqs.

    Markers are committed in seq order, so the age boundary is found by bisection, reading
    a few markers; a clock skew between two runners' hosts moves it by the skew.

    Args:
        guard: raises FencedError if this runner no longer owns the lineage; called
            before anything is deleted.
    """
    keys = [k for k in store.list(layout.markers) if k.endswith(".json")]
    older = [k for k in keys if seq_of(k) <= head_seq - keep_last]
    oldest_kept = (time.time() if now is None else now) - history_retention
    old_enough = bisect.bisect_right(
        older, False, key=lambda k: _committed_at(store, k) > oldest_kept
    )
    keep = set(protected)
    doomed = [k for k in older[:old_enough] if seq_of(k) not in keep]
    if doomed:
        if guard is not None:
            guard()
        store.delete(doomed)
    return [seq_of(k) for k in doomed]


def _committed_at(store: ObjectStore, key: str) -> float:
    marker = store.read_json(key)
    return 0.0 if marker is None else float(marker.get("committed_at") or 0.0)
