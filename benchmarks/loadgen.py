"""Shared by load.py and soak.py: input at a set rate for the sample job, and its driver.

The sample job (keyed-totals) runs as a detached driver (`streamkeeper run`) on local
storage; input is one JSON-lines file per period with `rate x period` events (the
spec's `maxFilesPerTrigger: 1` reads one file per batch, so with the period equal to
the trigger interval every batch has one period's input when the job keeps up, and
files pile up when it does not).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
JOB = "keyed-totals"
SPEC = REPO / "jobs" / "keyed_totals" / "job.yaml"


def write_events(path: Path, first_id: int, count: int, keys: int, rng: np.random.Generator):
    """One JSON-lines file of `count` events, written aside and renamed into place."""
    key_ids = rng.integers(0, keys, count)
    values = rng.integers(0, 1000, count)
    lines = [
        f'{{"event_id":{first_id + n},"key":"k{k:04d}","value":{v}}}\n'
        for n, (k, v) in enumerate(zip(key_ids.tolist(), values.tolist(), strict=True))
    ]
    tmp = path.parent / f".{path.name}.tmp"  # hidden: the file source never lists it
    tmp.write_text("".join(lines))
    os.replace(tmp, path)


class RateFeeder(threading.Thread):
    """Writes one file of `rate x period` events every `period` seconds; rate can change."""

    def __init__(self, directory: Path, rate: float, period: float, keys: int = 100) -> None:
        super().__init__(daemon=True)
        directory.mkdir(parents=True, exist_ok=True)
        self.directory, self.rate, self.period, self.keys = directory, rate, period, keys
        self.rows = 0
        self.files = 0
        self.rng = np.random.default_rng(7)
        self.halt = threading.Event()
        self.lock = threading.Lock()

    def run(self) -> None:
        due = time.monotonic()
        while not self.halt.is_set():
            count = max(1, round(self.rate * self.period))
            path = self.directory / f"events-{self.files:07d}.json"
            write_events(path, self.rows, count, self.keys, self.rng)
            with self.lock:
                self.rows += count
                self.files += 1
            due += self.period
            if self.halt.wait(max(0.0, due - time.monotonic())):
                break

    def written(self) -> tuple[int, int]:
        with self.lock:
            return self.rows, self.files

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=30)


def driver_command(
    root: Path, checkpoint: Path, events: Path, interval: str, *extra_sets: str
) -> list[str]:
    settings = {
        "source.path": str(events),
        "checkpoint.interval": interval,
        "spark.master": "local[2]",
        "spark.shuffle_partitions": "2",
    }
    argv = [sys.executable, "-m", "streamkeeper", "run", str(SPEC)]
    argv += ["--root", str(root), "--checkpoint-dir", str(checkpoint)]
    for key, value in settings.items():
        argv += ["--set", f"{key}={value}"]
    for setting in extra_sets:
        argv += ["--set", setting]
    return argv


def driver_env() -> dict[str, str]:
    env = {**os.environ, "STREAMKEEPER_SPARK_LOG_LEVEL": "ERROR"}
    paths = [str(REPO / "src"), str(REPO), *filter(None, env.get("PYTHONPATH", "").split(":"))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    return env


def start_driver(argv: list[str], log: Path, cwd: Path) -> subprocess.Popen:
    handle = open(log, "ab")  # noqa: SIM115 - the driver owns it until it exits
    return subprocess.Popen(argv, cwd=cwd, env=driver_env(), stdout=handle, stderr=handle)


def load_average() -> float:
    return os.getloadavg()[0]


def machine() -> str:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    one, five, fifteen = os.getloadavg()
    return f"{os.cpu_count()} cores, {cpu}, load average {one:.2f} {five:.2f} {fifteen:.2f}"


def finite(value: Any) -> Any:
    """NaN (e.g. a minute without checkpoints) as null, so the JSON line is strict JSON."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value
