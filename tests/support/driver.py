"""The environment of a driver process a test starts: fault injection on, quiet Spark."""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SAMPLE_SPEC = REPO / "jobs" / "keyed_totals" / "job.yaml"


def driver_env(crash_at: str | None = None, **extra: str) -> dict[str, str]:
    """This process's environment, plus what a test driver needs.

    Args:
        crash_at: `point[:n]`, a crash point at which the driver SIGKILLs itself.
        extra: more variables (e.g. STREAMKEEPER_SLOW_COMMITS="0.5").
    """
    env = {**os.environ, "STREAMKEEPER_SPARK_LOG_LEVEL": "ERROR", **extra}
    env["STREAMKEEPER_INJECT"] = "tests.support.faults"
    paths = [str(REPO), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env.pop("STREAMKEEPER_CRASH_AT", None)
    if crash_at:
        env["STREAMKEEPER_CRASH_AT"] = crash_at
    return env


def run_command(root: str, checkpoint: Path, settings: list[str], *extra: str) -> list[str]:
    """`streamkeeper run` of the sample job: a root, a checkpoint directory, `--set`s."""
    command = [sys.executable, "-m", "streamkeeper", "run", str(SAMPLE_SPEC)]
    command += ["--root", root, "--checkpoint-dir", str(checkpoint)]
    for setting in settings:
        command += ["--set", setting]
    return [*command, *extra]
