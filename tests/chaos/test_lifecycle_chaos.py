"""Lifecycle chaos in CI: one upgrade of the sample job through the real Airflow
components (scheduler with LocalExecutor, triggerer, DAG processor, api-server) that
meets three faults, each of which Airflow alone must ride out:

- the handover task's process is SIGKILLed while green hands over: its retry resumes
  the wait (a second handover is never requested);
- the triggerer is SIGKILLed while probation is deferred, and a new one started: the
  trigger moves to it and ends the probation;
- green fails its probation (its live totals go negative), and the rollback task's
  process is SIGKILLed between two table restores: its retry finishes the rollback.

The upgrade ends rolled back by the DAGs alone; after the input drains every table is
exactly the reference computed from the input, every Delta log audits clean, nothing is
left behind. The same harness runs every point three times in
`benchmarks/lifecycle_chaos.py` (tests/support/lifecycle_chaos).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.integration,
    pytest.mark.chaos,
    pytest.mark.airflow,
    pytest.mark.timeout(1800),
]

REPO = Path(__file__).resolve().parents[2]


def test_an_upgrade_meeting_three_faults_is_rolled_back_exactly_once(tmp_path: Path) -> None:
    log = tmp_path / "lifecycle.out"
    command = [sys.executable, "-m", "tests.support.lifecycle_chaos", "combined"]
    command += ["--workdir", str(tmp_path / "run"), "--keep"]
    paths = [str(REPO / "src"), str(REPO), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(p for p in paths if p))}
    with open(log, "wb") as out:
        done = subprocess.run(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO, timeout=1700
        )
    lines = log.read_text(errors="replace").splitlines()
    report = next((json.loads(x) for x in reversed(lines) if x.startswith("{")), None)
    progress = "\n".join(x for x in lines if x.startswith("[lifecycle"))
    print(progress)
    assert report is not None, f"no report (exit {done.returncode}):\n" + "\n".join(lines[-60:])
    context = f"{progress}\nfull output: {log}"

    assert report["failures"] == [], context
    assert report["outcome"] == "rolled_back" and report["dag_state"] == "failed", context
    # Each fault fired, and Airflow retried what it killed.
    assert set(report["fault"]) == {"kill_handover_task", "kill_triggerer_in_probation", "crash"}
    assert report["fault"]["crash"].startswith("rollback_between_restores"), context
    tasks = report["tasks"]
    assert tasks["handover"] == "success (try 2)" and tasks["rollback"] == "success (try 2)"
    assert tasks["probation"] == "failed (try 1)", context  # the quality gate's verdict
    assert "quality gate" in report["probation"], context
    assert report["drained"] and report["exact"], context
    assert {t["table"] for t in report["tables"]} == {"totals", "changes"}
    assert report["tables_audited"] >= 4 and report["audit_problems"] == [], context
    assert report["orphans"] == {} and report["ok"] and done.returncode == 0, context
