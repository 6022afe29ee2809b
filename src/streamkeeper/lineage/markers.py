"""Commit markers: `markers/{seq}.json`, one per committed checkpoint, written last.

A marker records batch N of a lineage -> each table's Delta version holding it, so a
reader can read every output as of one checkpoint, and the lineage's head (its last
committed checkpoint) is the latest marker. Finding it never lists every marker of a
long-lived lineage: the caller gives a hint (a seq near the head: the highest seq a
table holds, or the heartbeat's last seq) and only the keys after a point below it are
listed, the point moving down geometrically until a marker is found.
"""

from __future__ import annotations

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


def marker_seqs_after(store: ObjectStore, layout: LineageLayout, seq: int) -> list[int]:
    """Seqs of the markers above `seq`."""
    return [seq_of(k) for k in store.list(layout.markers, start_after=layout.marker(seq))]
