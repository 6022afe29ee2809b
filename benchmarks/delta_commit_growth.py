"""What a bare delta-rs commit costs as a table ages: the baseline under commit_path.py.

Run:  python benchmarks/delta_commit_growth.py [--versions 1000,5000] [--samples 30]
          [--table-copy DIR]

commit_path.py's cost per batch includes two Delta commits (a merge into `totals`, an
append to `changes`). Delta's own state grows with every commit: each append adds a
file, each merge leaves a remove tombstone that checkpoints keep for
`delta.deletedFileRetentionDuration` (7 days), so the snapshot a commit works on grows
until compaction and vacuum. This script times the same two commits with delta-rs alone
(no WAL, no markers, no fencing), on tables grown to each `--versions` count by the
same commits, and prints the mean per pair at each size and the ratio of the last to the
first. Subtract it from commit_path.py's figure at the same count to get what the
protocol itself costs. `--table-copy` times a copy of tables commit_path.py left
(`DIR/totals`, `DIR/changes`, `--keep`) instead of growing new ones. The last line is
one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sink_throughput import machine_info  # noqa: E402


def _rows(n: int) -> Any:
    import pyarrow as pa

    keys = [f"k{(n * 7 + i) % 50:02d}" for i in range(5)]
    return pa.table({"key": keys, "n": [n] * 5})


class Tables:
    """A merge table and an append table, committed to the way the coordinator does."""

    def __init__(self, folder: Path) -> None:
        from deltalake import DeltaTable, write_deltalake

        for name in ("totals", "changes"):
            if not (folder / name / "_delta_log").is_dir():
                write_deltalake(str(folder / name), _rows(0), mode="append")
        self.totals = DeltaTable(str(folder / "totals"))
        self.changes = DeltaTable(str(folder / "changes"))
        self.folder = folder

    @property
    def version(self) -> int:
        return int(self.changes.version())

    def commit_pair(self, n: int) -> float:
        from deltalake import write_deltalake

        began = time.perf_counter()
        self.totals.update_incremental()
        (
            self.totals.merge(_rows(n), "t.key = s.key", source_alias="s", target_alias="t")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )
        self.changes.update_incremental()
        write_deltalake(self.changes, _rows(n), mode="append")
        return (time.perf_counter() - began) * 1000


def _measure(tables: Tables, samples: int) -> dict[str, float]:
    costs = sorted(tables.commit_pair(tables.version + i) for i in range(samples))
    return {
        "version": tables.version,
        "mean_ms": round(statistics.fmean(costs), 2),
        "p95_ms": round(costs[int(0.95 * (len(costs) - 1))], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", default="1000,5000")
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--table-copy", type=Path, default=None)
    args = parser.parse_args()
    print(json.dumps(machine_info()), flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="delta-growth-") as work:
        if args.table_copy is not None:
            tables = Tables(args.table_copy)
            results.append(_measure(tables, args.samples))
            print(f"copy at version {tables.version}: {results[-1]}", flush=True)
        else:
            tables = Tables(Path(work))
            for target in (int(v) for v in args.versions.split(",")):
                began = time.monotonic()
                while tables.version < target - args.samples:
                    tables.commit_pair(tables.version)
                results.append(_measure(tables, args.samples))
                took = time.monotonic() - began
                print(f"at version {tables.version}: {results[-1]} [{took:.0f}s]", flush=True)
    if len(results) > 1:
        ratio = results[-1]["mean_ms"] / results[0]["mean_ms"]
        print(f"bare Delta commit pair, last / first: {ratio:.2f}")
    print(json.dumps({"benchmark": "delta_commit_growth", "results": results}))


if __name__ == "__main__":
    main()
