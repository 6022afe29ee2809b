"""The upgrade's comparison of green's shadow output with blue's (upgrade/compare.py) on
local Delta tables written by hand, as the two lineages would have written them.

Found by the fault run (benchmarks/fault_run.py): the sample job's `changes` sink is the
changelog of an update-mode aggregation, one row per key and batch, so its rows depend
on how the input was cut into batches. Green's shadow run catches up from the savepoint
through a backlog and cuts it otherwise than blue did (with `maxFilesPerTrigger` above 1,
or a blue that replayed a batch of several files after a restart); a multiset comparison
of its rows then rejects a correct green. A changelog sink declares its key, and is
compared by its latest row per key when the cuts differ.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake
from deltalake.transaction import AddAction

from streamkeeper.lineage.layout import LineageLayout, seq_name
from streamkeeper.storage import Location
from streamkeeper.upgrade.compare import SinkSide, compare_outputs

# Four input files, as (key, value) events.
FILES = [
    [("a", 1), ("b", 2)],
    [("a", 3)],
    [("b", 4), ("c", 5)],
    [("a", 6), ("c", 7)],
]


def _append_precommitted(table: str, lineage: str, seq: int, rows: pa.Table) -> None:
    """Append `rows` as the committer does: a file pre-written in `sk-{lineage}/{seq}/`."""
    relative = f"sk-{lineage}/{seq_name(seq)}/part.parquet"
    path = Path(table) / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(rows, path)
    if not (Path(table) / "_delta_log").exists():
        write_deltalake(table, rows.schema.empty_table(), mode="append")
    delta = DeltaTable(table)
    action = AddAction(relative, path.stat().st_size, {}, 0, True, None)
    delta.create_write_transaction([action], mode="append", schema=delta.schema())


def _lineage(
    root: Location, name: str, batches: list[list[int]], changelog_key: list[str] | None
) -> dict[str, SinkSide]:
    """Write what a lineage cutting FILES into `batches` commits: its `changes`
    (one row per key touched by a batch) and `totals` tables, and a commit marker per
    batch recording the last file it read."""
    changes, totals = root.child(f"{name}/changes"), root.child(f"{name}/totals")
    store, layout = root.store(), LineageLayout(root, name, name)
    counts: Counter = Counter()
    sums: Counter = Counter()
    for seq, files in enumerate(batches):
        touched = set()
        for index in files:
            for key, value in FILES[index]:
                counts[key] += 1
                sums[key] += value
                touched.add(key)
        rows = sorted(touched)
        changelog = {"key": rows, "events": [counts[k] for k in rows]}
        changelog["total"] = [sums[k] for k in rows]
        _append_precommitted(changes.uri, name, seq, pa.table(changelog))
        keys = sorted(counts)
        write_deltalake(
            totals.uri,
            pa.table(
                {
                    "key": keys,
                    "events": [counts[k] for k in keys],
                    "total": [sums[k] for k in keys],
                }
            ),
            mode="overwrite",
        )
        store.write_json(
            layout.marker(seq),
            {
                "seq": seq,
                "input": [f"file:events-{files[-1]:05d}.json"],
                "versions": {"changes": seq + 1, "totals": seq},
            },
        )
    return {
        "changes": SinkSide(changes.uri, None, changelog_key),
        "totals": SinkSide(totals.uri, ["key"]),
    }


def _compare(  # noqa: ANN202
    tmp_path: Path,
    blue_cut: list[list[int]],
    green_cut: list[list[int]],
    changelog_key: list[str] | None = None,
):
    root = Location(str(tmp_path))
    blue = _lineage(root, "blue", blue_cut, changelog_key)
    green = _lineage(root, "green", green_cut, changelog_key)
    return _blue_against_green(root, blue, green)


def _blue_against_green(  # noqa: ANN202
    root: Location,
    blue: dict[str, SinkSide],
    green: dict[str, SinkSide],
    since: dict[str, int | None] | None = None,
    since_seq: int = -1,
):
    return compare_outputs(
        root,
        LineageLayout(root, "blue", "blue"),
        LineageLayout(root, "green", "green"),
        since=since or {"changes": None, "totals": None},
        blue_sinks=blue,
        green_sinks=green,
        since_seq=since_seq,
    )


def test_the_same_cut_compares_equal(tmp_path: Path) -> None:
    comparison = _compare(tmp_path, [[0], [1], [2], [3]], [[0], [1], [2], [3]])
    assert comparison.success, comparison.reason


def test_a_changelog_cut_otherwise_is_compared_by_its_latest_row_per_key(tmp_path: Path) -> None:
    comparison = _compare(tmp_path, [[0], [1], [2], [3]], [[0, 1], [2, 3]], ["key"])
    assert comparison.success, comparison.reason
    changes = next(s for s in comparison.sinks if s.sink == "changes")
    assert changes.kind == "changelog" and changes.differences == 0
    assert (changes.blue_rows, changes.green_rows) == (7, 5)  # a row per key and batch


def test_a_changelog_with_a_wrong_latest_row_is_rejected(tmp_path: Path) -> None:
    root = Location(str(tmp_path))
    blue = _lineage(root, "blue", [[0], [1], [2], [3]], ["key"])
    green = _lineage(root, "green", [[0, 1], [2, 3]], ["key"])
    # Green's last batch wrote a wrong total for "c": its latest row differs from blue's.
    _append_precommitted(
        green["changes"].table, "green", 2, pa.table({"key": ["c"], "events": [2], "total": [99]})
    )
    store = root.store()
    store.write_json(
        LineageLayout(root, "green", "green").marker(2),
        {"seq": 2, "input": ["file:events-00003.json"], "versions": {"changes": 3, "totals": 1}},
    )
    comparison = _blue_against_green(root, blue, green)
    changes = next(s for s in comparison.sinks if s.sink == "changes")
    assert not comparison.success and changes.differences == 1
    assert "key ('c',)" in changes.examples[0] and "99" in changes.examples[0]


def test_an_unkeyed_append_sink_cut_otherwise_is_rejected_with_the_fix(tmp_path: Path) -> None:
    comparison = _compare(tmp_path, [[0], [1], [2], [3]], [[0, 1], [2, 3]])
    changes = next(s for s in comparison.sinks if s.sink == "changes")
    assert not comparison.success and changes.kind == "append" and changes.differences > 0
    assert any("declare its key" in e for e in changes.examples)
    totals = next(s for s in comparison.sinks if s.sink == "totals")
    assert totals.differences == 0  # a merge sink is compared by key whatever the cut


def test_rows_appended_before_the_savepoint_are_not_compared(tmp_path: Path) -> None:
    """Blue's changelog rows up to S0 (seq 0, table version 1) are left out."""
    root = Location(str(tmp_path))
    blue = _lineage(root, "blue", [[0], [1], [2], [3]], ["key"])
    # Green restored from S0 (after file 0): it processed files 1-3 in one batch, seq 1.
    green = _lineage(root, "green", [[0], [1, 2, 3]], ["key"])
    comparison = _blue_against_green(root, blue, green, {"changes": 1, "totals": 0}, 0)
    changes = next(s for s in comparison.sinks if s.sink == "changes")
    assert comparison.success, comparison.reason
    assert changes.kind == "changelog" and changes.blue_rows == 5
