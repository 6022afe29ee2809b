"""What Great Expectations costs the upgrade DAG, and that nothing else pays it.

Each figure is taken in a fresh interpreter (a worker's task process is one), runs
alternated, medians printed:

- `upgrade tasks`: importing the DAG factory and every operator the upgrade DAG runs
  (what each of its tasks imports before it works); it must not load great_expectations.
- `import gx`: `import great_expectations`, cold.
- `gate, first`: the validate task's quality gate (load the sample job's suite, read a
  Delta table of 1 000 keys, validate) in a fresh process: the import included.
- `gate, warm`: the same gate again in that process: the work alone.

    .venv/bin/python benchmarks/gx_cost.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SUITE = REPO / "jobs" / "keyed_totals" / "expectations.yaml"

UPGRADE_TASKS = """
import json, sys, time
t = time.perf_counter()
import streamkeeper_airflow.dag_factory
import streamkeeper_airflow.operators.upgrade
import streamkeeper_airflow.operators.start
import streamkeeper_airflow.operators.commands
seconds = time.perf_counter() - t
print(json.dumps({"seconds": seconds, "gx": "great_expectations" in sys.modules}))
"""

IMPORT_GX = """
import json, time
t = time.perf_counter()
import great_expectations
print(json.dumps({"seconds": time.perf_counter() - t}))
"""

GATE = """
import json, sys, time
from streamkeeper.upgrade.quality import load_expectations, validate_tables
table = sys.argv[1]

def gate():
    t = time.perf_counter()
    report = validate_tables({"totals": (table, None)}, load_expectations(sys.argv[2]))
    assert report.success, report.summary()
    return time.perf_counter() - t

first = gate()
print(json.dumps({"first": first, "warm": gate()}))
"""


def _run(code: str, *args: str) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _table(folder: Path) -> str:
    import pyarrow as pa
    from deltalake import write_deltalake

    keys = [f"k{i:04d}" for i in range(1000)]
    rows = pa.table({"key": keys, "events": [3] * 1000, "total": [float(i) for i in range(1000)]})
    write_deltalake(str(folder / "totals"), rows)
    return str(folder / "totals")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    table = _table(Path(tempfile.mkdtemp(prefix="sk-gx-")))
    tasks, imports, first, warm = [], [], [], []
    for _ in range(args.runs):  # alternated: a slow minute hits every figure alike
        seen = _run(UPGRADE_TASKS)
        if seen["gx"]:
            print("FAIL: importing the upgrade DAG's operators loaded great_expectations")
            return 1
        tasks.append(seen["seconds"])
        imports.append(_run(IMPORT_GX)["seconds"])
        gate = _run(GATE, table, str(SUITE))
        first.append(gate["first"])
        warm.append(gate["warm"])
    print(f"{platform.processor() or platform.machine()}, {args.runs} runs, medians:")
    print(f"  upgrade tasks' imports   {statistics.median(tasks):6.2f} s  (no great_expectations)")
    print(f"  import gx, cold          {statistics.median(imports):6.2f} s")
    print(f"  gate, first in a process {statistics.median(first):6.2f} s")
    print(f"  gate, warm               {statistics.median(warm):6.2f} s")
    share = statistics.median(first) - statistics.median(warm)
    print(f"  the validate task pays   {share:6.2f} s for loading Great Expectations, once")
    return 0


if __name__ == "__main__":
    sys.exit(main())
