"""The upgrade's comparison of green's shadow output with blue's (upgrade/compare.py) on
local Delta tables written by hand, as the two lineages would have written them.

Found by the fault run (benchmarks/fault_run.py): the sample job's `changes` sink is the
changelog of an update-mode aggregation, one row per key and batch, so its rows depend
on how the input was cut into batches. Green's shadow run catches up from the savepoint
through a backlog and cuts it otherwise than blue did (with `maxFilesPerTrigger` above 1,
or a blue that replayed a batch of several files after a restart); the multiset
comparison of append sinks then rejects a correct green. The comparison's own doc says
"even with batches cut differently". Kept here as a strict xfail until the comparison
knows which append sinks are batch-invariant (output mode append) and how to compare a
changelog across different cuts.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.storage import Location
from streamkeeper.upgrade.compare import SinkSide, compare_outputs

# Four input files, as (key, value) events.
FILES = [
    [("a", 1), ("b", 2)],
    [("a", 3)],
    [("b", 4), ("c", 5)],
    [("a", 6), ("c", 7)],
]


def _lineage(root: Location, name: str, batches: list[list[int]]) -> dict[str, SinkSide]:
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
        write_deltalake(
            changes.uri,
            pa.table(
                {
                    "key": rows,
                    "events": [counts[k] for k in rows],
                    "total": [sums[k] for k in rows],
                }
            ),
            mode="append",
        )
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
                "versions": {"changes": seq, "totals": seq},
            },
        )
    return {"changes": SinkSide(changes.uri, None), "totals": SinkSide(totals.uri, ["key"])}


def _compare(tmp_path: Path, blue_cut: list[list[int]], green_cut: list[list[int]]):  # noqa: ANN202
    root = Location(str(tmp_path))
    blue = _lineage(root, "blue", blue_cut)
    green = _lineage(root, "green", green_cut)
    return compare_outputs(
        root,
        LineageLayout(root, "blue", "blue"),
        LineageLayout(root, "green", "green"),
        since={"changes": None, "totals": None},
        blue_sinks=blue,
        green_sinks=green,
        since_seq=-1,
    )


def test_the_same_cut_compares_equal(tmp_path: Path) -> None:
    comparison = _compare(tmp_path, [[0], [1], [2], [3]], [[0], [1], [2], [3]])
    assert comparison.success, comparison.reason


@pytest.mark.xfail(
    strict=True,
    reason="an update-mode changelog compared as a multiset rejects a correct green whose "
    "batches are cut differently (found by the fault run; see the module doc)",
)
def test_a_correct_green_that_cut_the_input_otherwise_is_not_rejected(tmp_path: Path) -> None:
    comparison = _compare(tmp_path, [[0], [1], [2], [3]], [[0, 1], [2, 3]])
    assert [s.differences for s in comparison.sinks if s.sink == "totals"] == [0]
    assert comparison.success, comparison.reason
