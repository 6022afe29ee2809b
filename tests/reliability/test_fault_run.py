"""The fault run's short form, in CI: `benchmarks/fault_run.py --short` for a few minutes.

The same code as the 30-minute run (tests/support/fault_run.py), run as its own process
(Airflow reads its home and settings at import, and dag.test() wants the main thread):
the sample job and the dedup job on SeaweedFS behind the S3 fault proxy, SIGKILLs,
restarts through the start and monitor DAGs, a savepoint, a blue-green upgrade and, once
it is promoted, a rollback through the DAGs. At the end the output is exact, every Delta
table audits clean and nothing is left behind.
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
    pytest.mark.s3,
    pytest.mark.airflow,
    pytest.mark.timeout(1500),
]

REPO = Path(__file__).resolve().parents[2]
MINUTES = os.environ.get("STREAMKEEPER_FAULT_RUN_MINUTES", "2")


def test_the_short_fault_run_ends_exact_audited_and_clean(tmp_path: Path) -> None:
    log = tmp_path / "fault-run.out"
    command = [sys.executable, str(REPO / "benchmarks" / "fault_run.py"), "--short"]
    command += ["--minutes", MINUTES, "--workdir", str(tmp_path / "run"), "--seed", "3"]
    paths = [str(REPO / "src"), str(REPO), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(p for p in paths if p))}
    with open(log, "wb") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=1400)
    lines = log.read_text(errors="replace").splitlines()
    figures = next((json.loads(x) for x in reversed(lines) if x.startswith("{")), None)
    progress = "\n".join(x for x in lines if x.startswith(("[fault-run", "fault run:")))
    print(progress)
    assert figures is not None, f"no figures (exit {done.returncode}); tail:\n" + "\n".join(
        lines[-60:]
    )
    context = f"{json.dumps(figures, indent=1)}\n{progress}\nfull output: {log}"

    assert figures["rows_checked"] > 0 and figures["lost"] == 0, context
    assert figures["duplicated"] == 0, context
    assert figures["audit_problems"] == [] and figures["tables_audited"] >= 4, context
    left = {kind: found for kind, found in figures["orphans"].items() if found}
    # A failed history append's file younger than the runner's sweep age is not an orphan
    # yet (observability/history.py); every other kind must be empty.
    left.pop("history_awaiting_sweep", None)
    assert left == {} and figures["orphan_count"] == 0, context
    assert figures["problems"] == [], context
    assert figures["kills"] >= 2 and sum(figures["restarts"].values()) >= 2, context
    assert all(figures["faults"][k] > 0 for k in figures["faults"]), context
    assert figures["savepoints"] >= 1, context
    # The upgrade began and went live; then either the rollback DAG returned it to v1, or
    # its probation failed (a failed checkpoint from an injected fault) and the upgrade
    # DAG rolled it back itself.
    assert figures["upgrades"] + figures["auto_rollbacks"] >= 1, context
    assert figures["rollbacks"] + figures["auto_rollbacks"] >= 1, context
    assert done.returncode == 0, context
