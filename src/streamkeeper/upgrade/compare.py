"""Green's shadow output against blue's live output over the same input range.

Both started from savepoint S0. Each commit marker records where the input stood after
its batch (`input`: per source, an offset or the last file read), so the latest point
both lineages reached, even with batches cut differently, is the latest green marker
whose input equals a blue marker's. Over [S0, that point]:

- a merge sink (by key): every key green wrote holds the same row in blue's table (on
  the columns both versions write), and every key blue changed since S0 green wrote;
- an append sink: the rows blue appended since S0 and the rows green appended are the
  same multiset (on the common columns).

Reads whole tables at two versions: meant for validation, not for a hot path.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.lineage.markers import latest_marker
from streamkeeper.reader import read_table_rows
from streamkeeper.storage import Location

MARKER_WINDOW = 200  # markers read back from each head to find a common input position
EXAMPLES = 5  # differing rows shown per sink


@dataclass(frozen=True)
class SinkSide:
    """One sink of one side: its table, and (merge) its key."""

    table: str
    key: Sequence[str] | None  # None: append


@dataclass
class SinkComparison:
    sink: str
    kind: str  # merge | append
    columns: list[str]
    blue_rows: int
    green_rows: int
    differences: int
    examples: list[str] = field(default_factory=list)


@dataclass
class Comparison:
    """The outcome: `success` if a common position was found and nothing differs."""

    success: bool
    reason: str
    position: list[str | None] | None = None
    blue_seq: int | None = None
    green_seq: int | None = None
    sinks: list[SinkComparison] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def compare_outputs(
    root: Location,
    blue: LineageLayout,
    green: LineageLayout,
    *,
    since: dict[str, int | None],
    blue_sinks: dict[str, SinkSide],
    green_sinks: dict[str, SinkSide],
    since_seq: int,
) -> Comparison:
    """Compare green's output with blue's over the input both processed since S0.

    Args:
        since: blue's table versions at S0, per sink (the savepoint's `tables`).
        since_seq: S0's seq in blue's lineage (blue's markers after it are searched).
    """
    store = root.store()
    green_markers = _recent_markers(store, green, floor=-1)
    blue_markers = _recent_markers(store, blue, floor=since_seq)
    by_input = {_input_key(m): m for m in blue_markers if _input_key(m) is not None}
    common = next(
        (
            (by_input[_input_key(g)], g)
            for g in reversed(green_markers)
            if _input_key(g) is not None and _input_key(g) in by_input
        ),
        None,
    )
    if common is None:
        return Comparison(
            False,
            f"no common input position yet: green committed {len(green_markers)} batches, "
            f"blue {len(blue_markers)} since the savepoint; wait for both to process the "
            "same input",
        )
    blue_marker, green_marker = common
    shared = sorted(set(blue_sinks) & set(green_sinks))
    sinks = [
        _compare_sink(
            root,
            name,
            blue_sinks[name],
            green_sinks[name],
            blue_version=int(blue_marker["versions"][name]),
            since_version=since.get(name),
            green_version=int(green_marker["versions"][name]),
        )
        for name in shared
    ]
    differing = [s.sink for s in sinks if s.differences]
    reason = (
        f"green's output differs from blue's in {', '.join(differing)}"
        if differing
        else f"green's output equals blue's in {', '.join(shared) or 'no common sink'}"
    )
    return Comparison(
        not differing and bool(shared),
        reason,
        position=green_marker.get("input"),
        blue_seq=int(blue_marker["seq"]),
        green_seq=int(green_marker["seq"]),
        sinks=sinks,
    )


def _recent_markers(store: Any, layout: LineageLayout, *, floor: int) -> list[dict[str, Any]]:
    head = latest_marker(store, layout)
    if head is None or int(head["seq"]) <= floor:
        return []
    start = max(floor, int(head["seq"]) - MARKER_WINDOW)
    keys = store.list(layout.markers, start_after=layout.marker(start) if start >= 0 else None)
    markers = [store.read_json(k) for k in keys if k.endswith(".json")]
    return [m for m in markers if m is not None]


def _input_key(marker: dict[str, Any]) -> tuple[str | None, ...] | None:
    position = marker.get("input")
    if not position or all(p is None for p in position):
        return None
    return tuple(position)


def _compare_sink(
    root: Location,
    name: str,
    blue: SinkSide,
    green: SinkSide,
    *,
    blue_version: int,
    since_version: int | None,
    green_version: int,
) -> SinkComparison:
    blue_rows = _rows(root, blue.table, blue_version)
    green_rows = _rows(root, green.table, green_version)
    before = [] if since_version is None else _rows(root, blue.table, since_version)
    columns = _common_columns(blue_rows or before, green_rows)
    if blue.key and green.key and list(blue.key) == list(green.key):
        return _compare_merge(name, list(blue.key), columns, before, blue_rows, green_rows)
    return _compare_append(name, columns, before, blue_rows, green_rows)


def _rows(root: Location, table: str, version: int) -> list[dict[str, Any]]:
    return read_table_rows(table, version=version, location=Location(table, root.s3))


def _common_columns(blue: list[dict[str, Any]], green: list[dict[str, Any]]) -> list[str]:
    if not blue or not green:
        return sorted(set(blue[0] if blue else {}) | set(green[0] if green else {}))
    return sorted(set(blue[0]) & set(green[0]))


def _compare_merge(
    name: str,
    key: list[str],
    columns: list[str],
    before: list[dict[str, Any]],
    blue: list[dict[str, Any]],
    green: list[dict[str, Any]],
) -> SinkComparison:
    def index(rows: list[dict[str, Any]]) -> dict[tuple, tuple]:
        return {tuple(r.get(k) for k in key): tuple(r.get(c) for c in columns) for r in rows}

    blue_now, blue_then, green_now = index(blue), index(before), index(green)
    examples: list[str] = []
    differences = 0
    for k, row in green_now.items():
        if blue_now.get(k) != row:
            differences += 1
            if len(examples) < EXAMPLES:
                examples.append(f"key {k}: blue {blue_now.get(k)}, green {row}")
    for k, row in blue_now.items():
        if blue_then.get(k) != row and k not in green_now:
            differences += 1
            if len(examples) < EXAMPLES:
                examples.append(f"key {k}: blue changed it to {row}, green never wrote it")
    return SinkComparison(
        name, "merge", columns, len(blue_now), len(green_now), differences, examples
    )


def _compare_append(
    name: str,
    columns: list[str],
    before: list[dict[str, Any]],
    blue: list[dict[str, Any]],
    green: list[dict[str, Any]],
) -> SinkComparison:
    def bag(rows: list[dict[str, Any]]) -> Counter[tuple]:
        return Counter(tuple(r.get(c) for c in columns) for r in rows)

    added = bag(blue) - bag(before)
    produced = bag(green)
    only_blue, only_green = added - produced, produced - added
    examples = [f"only blue wrote {row} x{n}" for row, n in list(only_blue.items())[:EXAMPLES]]
    examples += [f"only green wrote {row} x{n}" for row, n in list(only_green.items())[:EXAMPLES]]
    differences = sum(only_blue.values()) + sum(only_green.values())
    return SinkComparison(
        name, "append", columns, sum(added.values()), sum(produced.values()), differences, examples
    )
