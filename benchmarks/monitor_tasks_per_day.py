"""Monitor task runs per day and parse time at 1, 10 and 100 job specs: polling vs events.

For each count, two jobs folders of copies of the sample spec (jobs/keyed_totals) are
made: "before" with `airflow.monitor: schedule` (the polling monitor: a run of the
monitor DAG on every `monitor_schedule` tick, as before event-driven monitoring), and
"after" with the default `airflow.monitor: events` (a run per health change of the job,
from its health asset's watcher in the triggerer, plus the `monitor_safety_net` cron).
dags/monitor.py is parsed by Airflow's DagBag in a fresh interpreter per folder
(alternated, median of `--repeat`), and the figures are computed from the DAGs it built:
their timetable (cron ticks in one day, counted with croniter; the asset and its
watcher's trigger arguments) and their task count (every task of a run is one task
instance: one worker pod on the KubernetesExecutor).

Asset-triggered runs cannot be read off a DAG: they are one per health event, and the
events per job and day are an assumption, given as arguments. The default is a fleet
that is worse than most: every job has `--incidents` (1) a day, each a change to
unhealthy and a recovery (2 events) and `--failed-minutes` (10) of being FAILED, during
which the watcher fires again every `failed_repeat` seconds (read off the trigger: 300).
Events coalesce when they come faster than a run (max_active_runs=1), so this is an
upper bound. What the triggerer pays instead is printed too: one status read per job
every `poll_interval` seconds (no task slot, no pod).

    .venv/bin/python benchmarks/monitor_tasks_per_day.py              # ~1 minute
    .venv/bin/python benchmarks/monitor_tasks_per_day.py --specs 100 --incidents 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from dag_parse import make_jobs  # benchmarks/: the same copies of the sample spec

REPO = Path(__file__).resolve().parents[1]
MONITOR_FILE = REPO / "dags" / "monitor.py"
DAY = timedelta(days=1)

# Run in a fresh interpreter: what the DagBag built, described by its timetable and tasks.
PARSE_MONITOR_DAGS = """
import json, sys, time
from airflow.dag_processing.dagbag import DagBag
import streamkeeper_airflow.dag_factory  # imports both variants share
started = time.perf_counter()
bag = DagBag(dag_folder=sys.argv[1])
parsed = time.perf_counter() - started

def describe(dag):
    timetable = dag.timetable
    crons, assets = [], []
    for part in (timetable, getattr(timetable, "timetable", None)):
        if part is not None and getattr(part, "expression", None):
            crons.append(part.expression)
    for asset in getattr(getattr(timetable, "asset_condition", None), "objects", []):
        triggers = [w.trigger.serialize()[1] for w in asset.watchers]
        assets.append({"uri": asset.uri, "watchers": triggers})
    return {"tasks": len(dag.tasks), "crons": crons, "assets": assets}

print(json.dumps({"parse": parsed, "errors": len(bag.import_errors),
                  "dags": {dag_id: describe(dag) for dag_id, dag in bag.dags.items()}}))
"""


def make_variant(folder: Path, count: int, mode: str) -> None:
    """`count` copies of the sample spec with `airflow.monitor: mode`."""
    make_jobs(folder, count)
    for spec in folder.glob("*/job.yaml"):
        text = spec.read_text()
        spec.write_text(re.sub(r"(?m)^(\s*)monitor: .*", rf"\1monitor: {mode}", text))


def parse(jobs: Path, home: Path) -> dict[str, Any]:
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__STREAMKEEPER__JOBS_FOLDER": str(jobs),
    }
    done = subprocess.run(
        [sys.executable, "-c", PARSE_MONITOR_DAGS, str(MONITOR_FILE)],
        env=env,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
        check=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["errors"] == 0, f"{jobs}: import errors"
    return result


def cron_runs_per_day(expression: str) -> int:
    """Ticks of `expression` in one day (UTC; a day without a DST change)."""
    from croniter import croniter

    start = datetime(2026, 1, 14, tzinfo=UTC)
    ticks = croniter(expression, start - timedelta(microseconds=1))
    runs = 0
    while ticks.get_next(datetime) < start + DAY:
        runs += 1
    return runs


def event_runs_per_day(watchers: list[dict[str, Any]], args: argparse.Namespace) -> float:
    """Runs one health asset's events start per day, under the stated assumption."""
    if not watchers:
        return 0.0
    repeat = min(float(w["failed_repeat"]) for w in watchers)
    repeats = int(args.failed_minutes * 60 // repeat)
    return args.incidents * (2 + repeats)


def per_day(dags: dict[str, Any], args: argparse.Namespace) -> dict[str, float]:
    """Task instances, runs and triggerer status reads per day, over every monitor DAG."""
    totals = {"tasks": 0.0, "runs": 0.0, "reads": 0.0}
    for dag in dags.values():
        runs = sum(cron_runs_per_day(cron) for cron in dag["crons"])
        for asset in dag["assets"]:
            runs += event_runs_per_day(asset["watchers"], args)
            totals["reads"] += sum(86400 / float(w["poll_interval"]) for w in asset["watchers"])
        totals["runs"] += runs
        totals["tasks"] += runs * dag["tasks"]
    return totals


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--specs", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument("--repeat", type=int, default=3, help="parses per figure (median)")
    parser.add_argument("--incidents", type=float, default=1.0, help="per job and day")
    parser.add_argument("--failed-minutes", type=float, default=10.0, help="FAILED, per incident")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print(
        f"assumption (after): {args.incidents:g} incident(s) per job and day, each a change "
        f"to unhealthy, a recovery and {args.failed_minutes:g} min FAILED; median of "
        f"{args.repeat} parses of dags/monitor.py"
    )
    base = Path(tempfile.mkdtemp(prefix="sk-monitor-tasks-"))
    try:
        for count in args.specs:
            seconds: dict[str, list[float]] = {"before": [], "after": []}
            built: dict[str, dict[str, Any]] = {}
            for variant, mode in (("before", "schedule"), ("after", "events")):
                make_variant(base / f"{variant}-{count}", count, mode)
            for _ in range(args.repeat):
                for variant in ("before", "after"):  # alternated
                    result = parse(base / f"{variant}-{count}", base / "home")
                    seconds[variant].append(result["parse"])
                    built[variant] = result["dags"]
            print(f"{count:4d} specs ({len(built['after'])} monitor DAGs):")
            figures = {variant: per_day(built[variant], args) for variant in built}
            for variant in ("before", "after"):
                dag = next(iter(built[variant].values()))
                schedule = " or ".join(
                    [*(f"cron {c!r}" for c in dag["crons"]), *(a["uri"] for a in dag["assets"])]
                )
                f = figures[variant]
                print(
                    f"  {variant:6} parse {statistics.median(seconds[variant]):6.3f} s; "
                    f"{f['runs']:8.0f} runs/day x {dag['tasks']} tasks = {f['tasks']:8.0f} "
                    f"task instances/day; triggerer status reads/day {f['reads']:8.0f} "
                    f"[{schedule}]"
                )
            ratio = figures["before"]["tasks"] / max(figures["after"]["tasks"], 1)
            slower = statistics.median(seconds["after"]) / statistics.median(seconds["before"])
            print(
                f"  task instances/day before / after: {ratio:.1f}x; parse after / before: "
                f"{slower:.2f}x"
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
