"""DAG parse time at 1, 10 and 100 job specs: what the dag-processor and a worker pay.

For each count, a jobs folder of copies of the sample spec (jobs/keyed_totals) is made
and every file in dags/ is parsed by Airflow's DagBag in a fresh interpreter, as Airflow
3 does: the dag-processor parses each DAG file in a process of its own (no parsing
context), and a worker parses the task's DAG file again before it runs the task (its
DAG id as the parsing context). Printed per count, now and before (PyYAML's pure-Python
loader, every job's DAG built whatever the context), alternated file by file: the sum
over files (one dag-processor loop), the slowest file (a worker's parse for one task),
and the ratios.

    .venv/bin/python benchmarks/dag_parse.py                 # 1, 10, 100 specs, ~1 minute
    .venv/bin/python benchmarks/dag_parse.py --specs 1 100 --repeat 5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "jobs" / "keyed_totals"

PARSE_ONE_FILE = """
import json, sys, time
started = time.perf_counter()
from airflow.dag_processing.dagbag import DagBag
import yaml, streamkeeper.spec, streamkeeper_airflow.dag_factory as factory  # both variants
if sys.argv[2] == "before":  # the baseline: PyYAML's pure-Python loader, every DAG built
    streamkeeper.spec.SAFE_LOADER = yaml.SafeLoader
    factory.get_parsing_context = lambda: type("NoContext", (), {"dag_id": None})()
imported = time.perf_counter()
bag = DagBag(dag_folder=sys.argv[1])
done = time.perf_counter()
print(json.dumps({"import": imported - started, "parse": done - imported,
                  "dags": len(bag.dag_ids), "errors": len(bag.import_errors)}))
"""


def make_jobs(folder: Path, count: int) -> None:
    spec = (SAMPLE / "job.yaml").read_text()
    for i in range(count):
        job = folder / f"job_{i:03d}"
        job.mkdir(parents=True)
        (job / "job.yaml").write_text(spec.replace("name: keyed-totals", f"name: job-{i:03d}"))
        for extra in ("transform.py", "expectations.yaml"):
            shutil.copy(SAMPLE / extra, job / extra)


def parse_file(
    dag_file: Path, jobs: Path, home: Path, variant: str, dag_id: str | None
) -> dict[str, float]:
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__STREAMKEEPER__JOBS_FOLDER": str(jobs),
    }
    if dag_id is not None:  # what the task runner sets while it parses for a task
        env["_AIRFLOW_PARSING_CONTEXT_DAG_ID"] = dag_id
    done = subprocess.run(
        [sys.executable, "-c", PARSE_ONE_FILE, str(dag_file), variant],
        env=env,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
        check=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["errors"] == 0, f"{dag_file.name}: import errors"
    return result


def median_parse(repeat: int, *args: object) -> tuple[float, int]:
    runs = [parse_file(*args) for _ in range(repeat)]  # type: ignore[arg-type]
    return statistics.median(r["parse"] for r in runs), int(runs[0]["dags"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--specs", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument("--repeat", type=int, default=3, help="parses per figure (median)")
    args = parser.parse_args()
    files = sorted(f for f in (REPO / "dags").glob("*.py") if f.stem != "job_specs")
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print(f"DAG files: {', '.join(f.name for f in files)}; median of {args.repeat} parses")
    base = Path(tempfile.mkdtemp(prefix="sk-dag-parse-"))
    try:
        for count in args.specs:
            jobs = base / f"jobs-{count}"
            make_jobs(jobs, count)
            loop = {"before": 0.0, "now": 0.0}
            task = {"before": 0.0, "now": 0.0}
            dags = {"before": 0, "now": 0}
            for dag_file in files:
                dag_id = f"job-000.{dag_file.stem}"
                for variant in ("before", "now"):  # alternated, file by file
                    seconds, built = median_parse(args.repeat, dag_file, jobs, base, variant, None)
                    loop[variant] += seconds
                    dags[variant] += built
                    seconds, built = median_parse(
                        args.repeat, dag_file, jobs, base, variant, dag_id
                    )
                    task[variant] = max(task[variant], seconds)
                    assert variant == "before" or built == 1, f"{dag_id}: {built} DAGs built"
            assert dags["before"] == dags["now"] == count * len(files)
            print(f"{count:4d} specs ({dags['now']} DAGs):")
            for variant in ("before", "now"):
                print(
                    f"  {variant:6} dag-processor loop (all files) {loop[variant]:6.3f} s; "
                    f"a worker's parse for one task (slowest file) {task[variant]:6.3f} s"
                )
            print(
                f"  before / now: loop {loop['before'] / loop['now']:.2f}x, "
                f"task {task['before'] / task['now']:.2f}x"
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
