"""Green's shadow output against blue's live output over the same input range.

Both started from savepoint S0. Each commit marker records where the input stood after
its batch (`input`: per source, an offset or the last file read), so the latest point
both lineages reached, even with batches cut differently, is the latest green marker
whose input equals a blue marker's. Over [S0, that point]:

- a merge sink (by key): every key green wrote holds the same row in blue's table (on
  the columns both versions write), and every key blue changed since S0 green wrote;
- an append sink, when both cut the input into the same batches (their markers record
  the same input positions in the same order): the rows blue appended since S0 and the
  rows green appended are the same multiset (on the common columns);
- an append sink with a key (`key:` on an append sink: a changelog, e.g. of an
  update-mode aggregation, one row per key and batch), when the cuts differ: per key,
  the row of the latest batch on each side is the same, and both sides wrote the same
  keys. A changelog's rows depend on how the input was cut (one row per key per batch),
  its latest row per key does not. The batch of a row is the commit seq of the folder
  its file was pre-committed in (`sk-{lineage}/{seq}/`);
- an append sink without a key whose cuts differ: the multiset, as above; a difference
  is reported with the hint to declare the key if the sink is a changelog.

Reads whole tables at two versions: meant for validation, not for a hot path.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
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
    # An append sink's key (a changelog): compared by its latest row per key across cuts.
    changelog_key: Sequence[str] | None = None


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
    same_cut = _cut(blue_markers, since_seq, blue_marker) == _cut(green_markers, None, green_marker)
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
            same_cut=same_cut,
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


def _cut(
    markers: list[dict[str, Any]], since_seq: int | None, last: dict[str, Any]
) -> list[tuple[str | None, ...] | None] | None:
    """The input positions of the batches up to `last`, in order; None if the window of
    markers read does not reach back to the first batch after `since_seq` (unknown)."""
    taken = [m for m in markers if int(m["seq"]) <= int(last["seq"])]
    if since_seq is not None and (not taken or int(taken[0]["seq"]) != since_seq + 1):
        return None
    return [_input_key(m) for m in taken]


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
    same_cut: bool,
) -> SinkComparison:
    changelog_key = green.changelog_key
    if not same_cut and changelog_key and list(blue.changelog_key or []) == list(changelog_key):
        return _compare_changelog(
            root,
            name,
            list(changelog_key),
            blue,
            green,
            blue_version=blue_version,
            since_version=since_version,
            green_version=green_version,
        )
    blue_rows = _rows(root, blue.table, blue_version)
    green_rows = _rows(root, green.table, green_version)
    before = [] if since_version is None else _rows(root, blue.table, since_version)
    columns = _common_columns(blue_rows or before, green_rows)
    if blue.key and green.key and list(blue.key) == list(green.key):
        return _compare_merge(name, list(blue.key), columns, before, blue_rows, green_rows)
    comparison = _compare_append(name, columns, before, blue_rows, green_rows)
    if comparison.differences and not same_cut:
        comparison.examples.append(
            "blue and green cut the input into different batches: if this sink is a "
            "changelog (one row per key and batch, e.g. of an update-mode aggregation), "
            "declare its key on the sink (key: [...]) so its latest row per key is compared"
        )
    return comparison


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


_SEQ_FOLDER = re.compile(r"(?:^|/)(sk-[^/]+/(\d+)/[^/]+)$")  # a pre-committed file


def _compare_changelog(
    root: Location,
    name: str,
    key: list[str],
    blue: SinkSide,
    green: SinkSide,
    *,
    blue_version: int,
    since_version: int | None,
    green_version: int,
) -> SinkComparison:
    """Per key, the row of each side's latest batch (module doc)."""
    blue_batches = _rows_by_batch(root, blue.table, blue_version, since_version)
    green_batches = _rows_by_batch(root, green.table, green_version, None)
    if blue_batches is None or green_batches is None:
        return SinkComparison(
            name, "changelog", [], 0, 0, 1,
            ["a file of this sink is not in a commit-seq folder (sk-{lineage}/{seq}/): "
             "the order of its rows is unknown"],
        )  # fmt: skip
    blue_rows = [r for _, rows in blue_batches for r in rows]
    green_rows = [r for _, rows in green_batches for r in rows]
    columns = _common_columns(blue_rows, green_rows)
    blue_latest, blue_twice = _latest_per_key(blue_batches, key, columns)
    green_latest, green_twice = _latest_per_key(green_batches, key, columns)
    examples = [f"key {k} has two rows in one batch of blue" for k in blue_twice[:EXAMPLES]]
    examples += [f"key {k} has two rows in one batch of green" for k in green_twice[:EXAMPLES]]
    differences = len(blue_twice) + len(green_twice)
    for k in sorted(set(blue_latest) | set(green_latest), key=repr):
        if blue_latest.get(k) != green_latest.get(k):
            differences += 1
            if len(examples) < 2 * EXAMPLES:
                examples.append(
                    f"key {k}: blue's latest {blue_latest.get(k)}, green's {green_latest.get(k)}"
                )
    return SinkComparison(
        name, "changelog", columns, len(blue_rows), len(green_rows), differences, examples
    )


def _rows_by_batch(
    root: Location, table: str, version: int, since_version: int | None
) -> list[tuple[int, list[dict[str, Any]]]] | None:
    """The rows of the files added after `since_version` up to `version`, per batch (the
    commit seq of their folder), in commit order; None if a file is in no seq folder."""
    import pyarrow as pa
    from deltalake import DeltaTable

    options = Location(table, root.s3).storage_options()
    before: set[str] = set()
    if since_version is not None:
        then = DeltaTable(table, version=since_version, storage_options=options)
        before = set(pa.table(then.get_add_actions()).column("path").to_pylist())
    dataset = DeltaTable(table, version=version, storage_options=options).to_pyarrow_dataset()
    batches: dict[int, list[dict[str, Any]]] = {}
    for fragment in dataset.get_fragments():
        found = _SEQ_FOLDER.search(fragment.path)
        if found is not None and found.group(1) in before:
            continue
        if found is None:
            if any(fragment.path.endswith("/" + old) for old in before):
                continue  # older than S0: not compared
            return None
        rows = fragment.to_table(use_threads=False).to_pylist()
        batches.setdefault(int(found.group(2)), []).extend(rows)
    return sorted(batches.items())


def _latest_per_key(
    batches: Iterable[tuple[int, list[dict[str, Any]]]], key: list[str], columns: list[str]
) -> tuple[dict[tuple, tuple], list[tuple]]:
    """Each key's row from its latest batch, and the keys a batch holds twice."""
    latest: dict[tuple, tuple] = {}
    twice: list[tuple] = []
    for _, rows in batches:
        seen: set[tuple] = set()
        for row in rows:
            k = tuple(row.get(c) for c in key)
            if k in seen:
                twice.append(k)
            seen.add(k)
            latest[k] = tuple(row.get(c) for c in columns)
    return latest, twice
