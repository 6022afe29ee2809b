"""The lineage's commit sequence (seq): monotonic, the Delta app-transaction version.

It never goes back, not even when a restore starts a fresh checkpoint whose batch ids
restart at 0: a runner starts above everything any table, pending manifest or commit
marker has seen. Gaps are allowed (a seq another runner claimed is skipped); order is
what matters.
"""

from __future__ import annotations

import threading

from streamkeeper.commit.tables import TableTarget
from streamkeeper.lineage.layout import LineageLayout, seq_of
from streamkeeper.lineage.markers import latest_marker
from streamkeeper.storage import ObjectStore


class CommitSequence:
    """Hands out seqs to batches; a batch kept across a crash gets its old seq back."""

    def __init__(self, start: int) -> None:
        self._next = start
        self._reserved: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()

    def reserve_existing(self, query_id: str, batch_id: int, seq: int) -> None:
        """A manifest kept across a crash: its batch must be replayed under the same seq."""
        self._reserved[(query_id, batch_id)] = seq

    def reserved(self, query_id: str, batch_id: int) -> int | None:
        return self._reserved.get((query_id, batch_id))

    def take_next(self, after: int = -1) -> int:
        """The next seq, above `after` (the lineage's head: a seq at or below it was
        committed, and a claim of it, its manifest long retired, would be skipped as done)."""
        with self._lock:
            seq = max(self._next, after + 1)
            self._next = seq + 1
            return seq

    def skip_past(self, seq: int) -> None:
        """Recovery resolved `seq`: never hand it out again."""
        with self._lock:
            self._next = max(self._next, seq + 1)


def lineage_head(
    store: ObjectStore, layout: LineageLayout, targets: dict[str, TableTarget]
) -> tuple[dict | None, list[int]]:
    """The latest commit marker and each table's committed seq (lists no old marker).

    A marker is written after every table of its batch committed, so the head is at or
    just below the highest seq a table holds.
    """
    committed = [t.committed_seq() for t in targets.values()]
    near = max(committed, default=-1)
    return latest_marker(store, layout, near=near if near >= 0 else None), committed


def initial_sequence(
    store: ObjectStore,
    layout: LineageLayout,
    targets: dict[str, TableTarget],
    head: tuple[dict | None, list[int]] | None = None,
) -> int:
    """One above the highest seq any table, pending manifest or marker has seen.

    Args:
        head: `lineage_head`'s answer if the caller just read it (saves reading every
            table and the markers again).
    """
    head, committed = lineage_head(store, layout, targets) if head is None else head
    seen = committed + [seq_of(k) for k in store.list(layout.manifests)]
    if head is not None:
        seen.append(int(head["seq"]))
    return max(seen, default=-1) + 1


def lineage_position(
    store: ObjectStore, layout: LineageLayout, targets: dict[str, TableTarget]
) -> int | None:
    """The seq whose output the tables hold: the head, or, right after a rollback, the
    seq of the savepoint it restored (its marker says so). None if it never committed.

    Reads only; tables not created yet are skipped.
    """
    committed = [t.committed_seq() for t in targets.values() if t.exists()]
    near = max(committed, default=-1)
    head = latest_marker(store, layout, near=near if near >= 0 else None)
    if head is not None and int(head["seq"]) >= near:
        rewound = head.get("rewound_to")
        return int(rewound["seq"]) if rewound else int(head["seq"])
    return near if near >= 0 else None
