"""The lifecycle chaos matrix: every handover point, green's first live commit, every
rollback point and each orchestrator fault, several times each, through the real Airflow
components (tests/support/lifecycle_chaos). Prints a row per point (runs, outcomes, exact,
seconds) and a summary; each run's report goes to a JSON-lines file as it ends, so an
interrupted matrix resumes where it stopped (`--results` again).

Run:  source infra/driver_jvm.sh   # faster driver starts (optional)
      /work/main/.venv/bin/python benchmarks/lifecycle_chaos.py [--runs 3]
          [--points handover_after_move,rollback_after_fence] [--workdir DIR]
          [--results FILE] [--keep]

A run takes 5-8 minutes on 2 cores (Airflow's components, blue, green, the rollback's
restart); the whole matrix (13 points x 3) about 4 hours. A point passes when every run
ended as the scenario expects (promoted, or rolled back) by the DAGs alone, with exact
tables, a clean Delta log audit and nothing left behind; the failures are listed under
the table with the task, the table and by how much. Exit 1 if any run failed.

The CI runs one combined scenario: tests/chaos/test_lifecycle_chaos.py.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO)]

from tests.support.lifecycle_chaos.scenarios import MATRIX, SCENARIOS  # noqa: E402

RUN_TIMEOUT = 40 * 60  # one run, start to checks; the harness's own deadlines come first


def run_one(point: str, workdir: Path, keep: bool) -> dict[str, Any]:
    """One run in its own process (Airflow reads its home at import); its report."""
    log = workdir.with_suffix(".log")
    paths = [str(REPO / "src"), str(REPO), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(p for p in paths if p))}
    command = [
        sys.executable,
        "-m",
        "tests.support.lifecycle_chaos",
        point,
        "--workdir",
        str(workdir),
    ]
    started = time.monotonic()
    with open(log, "wb") as out:
        try:
            subprocess.run(
                [*command, *(["--keep"] if keep else [])],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=REPO,
                timeout=RUN_TIMEOUT,
            )
        except subprocess.TimeoutExpired:
            pass
    lines = log.read_text(errors="replace").splitlines()
    report = next((json.loads(x) for x in reversed(lines) if x.startswith("{")), None)
    if report is None:
        tail = " | ".join(lines[-5:])
        report = {
            "scenario": point,
            "ok": False,
            "outcome": None,
            "exact": False,
            "seconds": round(time.monotonic() - started, 1),
            "failures": [f"no report (see {log}): {tail}"],
        }
    report["log"] = str(log)
    return report


def _outcomes(reports: list[dict[str, Any]]) -> str:
    counts: dict[str, int] = {}
    for report in reports:
        name = {"promoted": "promoted", "rolled_back": "rolled back"}.get(
            str(report.get("outcome")), str(report.get("outcome"))
        )
        counts[name] = counts.get(name, 0) + 1
    return ", ".join(f"{n} {name}" for name, n in sorted(counts.items()))


def table(results: dict[str, list[dict[str, Any]]]) -> str:
    rows = [
        f"| {'point':32} | runs | {'outcome':34} | exact | ok  | seconds (mean) |",
        f"|{'-' * 34}|------|{'-' * 36}|-------|-----|----------------|",
    ]
    for point, reports in results.items():
        if not reports:
            continue
        expected = SCENARIOS[point].outcome.replace("_", " ")
        exact = sum(1 for r in reports if r.get("exact"))
        ok = sum(1 for r in reports if r.get("ok"))
        mean = sum(float(r.get("seconds") or 0) for r in reports) / len(reports)
        outcome = f"{_outcomes(reports)} (want {expected})"
        rows.append(
            f"| {point:32} | {len(reports):4} | {outcome:34} | {exact}/{len(reports):<3} "
            f"| {ok}/{len(reports)} | {mean:14.0f} |"
        )
    return "\n".join(rows)


def failures(results: dict[str, list[dict[str, Any]]]) -> list[str]:
    found = []
    for point, reports in results.items():
        for index, report in enumerate(reports, 1):
            for failure in report.get("failures") or []:
                found.append(f"{point} run {index}: {failure}")
    return found


def _load(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per point (default 3)")
    parser.add_argument("--points", default=",".join(MATRIX), help="comma-separated")
    parser.add_argument("--workdir", type=Path, default=Path.cwd() / ".lifecycle-chaos")
    parser.add_argument("--results", type=Path, default=None, help="JSON lines (resumable)")
    parser.add_argument("--keep", action="store_true", help="keep passing runs' folders")
    args = parser.parse_args(argv)
    points = [p for p in args.points.split(",") if p]
    unknown = [p for p in points if p not in SCENARIOS]
    if unknown:
        parser.error(f"unknown points {unknown}; known: {', '.join(SCENARIOS)}")
    args.workdir.mkdir(parents=True, exist_ok=True)
    results_file = args.results or args.workdir / "results.jsonl"
    results: dict[str, list[dict[str, Any]]] = {p: [] for p in points}
    for report in _load(results_file):
        if report.get("scenario") in results:
            results[report["scenario"]].append(report)
    started = time.monotonic()
    for point in points:
        while len(results[point]) < args.runs:
            index = len(results[point]) + 1
            workdir = args.workdir / f"{point.replace(':', '-').replace('@', '-')}-{index}"
            report = run_one(point, workdir, args.keep)
            results[point].append(report)
            with open(results_file, "a") as out:
                out.write(json.dumps(report) + "\n")
            verdict = "ok" if report.get("ok") else "FAILED: " + "; ".join(report["failures"][:2])
            print(
                f"[{(time.monotonic() - started) / 60:5.1f} min] {point} run {index}: "
                f"{report.get('outcome')}, exact {report.get('exact')}, "
                f"{report.get('seconds')} s; {verdict}",
                flush=True,
            )
    print(table(results))
    found = failures(results)
    runs = sum(len(r) for r in results.values())
    passed = sum(1 for reports in results.values() for r in reports if r.get("ok"))
    bad_points = [p for p, reports in results.items() if not all(r.get("ok") for r in reports)]
    print(
        f"\nlifecycle chaos: {passed}/{runs} runs passed; {len(points) - len(bad_points)}/"
        f"{len(points)} points passed every run"
        + (f"; failing: {', '.join(bad_points)}" if bad_points else "")
    )
    for line in found:
        print(f"  - {line}")
    return 0 if not found else 1


if __name__ == "__main__":
    sys.exit(main())
