"""Restart after a SIGKILL: streamkeeper's driver against plain PySpark, the same query
from its own checkpoint, alternated in one run.

Each side runs the sample job's query (keyed-totals over JSON files, 1 s trigger) on
local storage from its own checkpoint: streamkeeper's driver (`streamkeeper run`: WAL,
fence, commit protocol, Delta tables) and `plain_query.py` (the same query, source,
transform and session settings, Parquet appended by foreachBatch). Each round, for each
side in turn (the order alternates): add one events file, start the driver, time from the
process's start to its first new committed batch (streamkeeper: the commit's time in
the job's head marker; plain: the mtime of Spark's new `commits/N`), then SIGKILL it. So
every timed start is a restart after a SIGKILL, and only one driver runs at a time (the
other side's idle driver would take CPU from the start being timed, unevenly). Medians,
their ratio (target: at most 1.1, issue 26) and the median of each of streamkeeper's start
phases, read from its `start phases` log line. A third side, plain PySpark with the
checkpoint file manager streamkeeper's session sets (runtime/session.py), separates what
that setting gives from the rest of streamkeeper's cost.

    .venv/bin/python benchmarks/restart_vs_plain.py [--rounds 5]

`--class-data-archive PATH` (made by `streamkeeper driver-archive PATH`) gives every side
the archive, each the way its users would: the spec's `spark.class_data_archive` for
streamkeeper, `--driver-java-options` for plain PySpark. Without it all run with the
JVM's defaults (unset PYSPARK_SUBMIT_ARGS if `infra/driver_jvm.sh` was sourced).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO)]

from benchmarks.loadgen import driver_command, driver_env, machine  # noqa: E402
from jobs.keyed_totals.sample_events import write_event_files  # noqa: E402
from streamkeeper.runtime.session import (  # noqa: E402
    CHECKPOINT_FILE_MANAGER_KEY,
    LOCAL_CHECKPOINT_FILE_MANAGER,
)

JOB = "keyed-totals"
EVENTS_PER_FILE = 2_000


class Side:
    """One driver process and how to tell its newest committed batch."""

    def __init__(self, name: str, work: Path, archive: Path | None = None) -> None:
        self.name, self.work, self.archive = name, work, archive
        self.events = work / "events"
        self.process: subprocess.Popen | None = None
        self.files = 0
        self.lives = 0

    def argv(self) -> list[str]:
        raise NotImplementedError

    def committed_after(self, started: float) -> float | None:
        """Seconds from `started` to a batch committed after it, or None yet."""
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return driver_env()

    def add_file(self) -> None:
        write_event_files(
            self.events, files=1, events_per_file=EVENTS_PER_FILE, first_file=self.files
        )
        self.files += 1

    def start(self) -> float:
        log = open(self.work / f"driver-{self.lives}.log", "ab")  # noqa: SIM115
        self.lives += 1
        started = time.time()
        self.process = subprocess.Popen(
            self.argv(),
            cwd=self.work,
            env=self.env(),
            stdout=log,
            stderr=log,
            start_new_session=True,  # its own process group: the JVM dies with it
        )
        return started

    def first_commit(self, started: float, timeout: float = 300) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise SystemExit(f"{self.name} exited ({self.process.returncode}): {self.work}")
            seconds = self.committed_after(started)
            if seconds is not None:
                return seconds
            time.sleep(0.05)
        raise SystemExit(f"{self.name}: no commit within {timeout} s; see {self.work}")

    def kill(self) -> None:
        """SIGKILL the driver's whole process group: Python, its JVM, its Python workers.

        Killing only the Python process would leave its JVM shutting down (gracefully,
        for seconds) while the next start is timed.
        """
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        deadline = time.monotonic() + 10  # a zombie nobody reaps still counts as alive
        while _group_alive(self.process.pid) and time.monotonic() < deadline:
            time.sleep(0.05)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


class Streamkeeper(Side):
    def argv(self) -> list[str]:
        sets = [] if self.archive is None else [f"spark.class_data_archive={self.archive}"]
        return driver_command(
            self.work / "data", self.work / "checkpoint", self.events, "1s", *sets
        )

    def committed_after(self, started: float) -> float | None:
        # The commit markers themselves, as cheap to poll as plain's `commits/`: a
        # status() every 50 ms would take CPU from the start being timed.
        markers = self.work / "data" / "lineages" / JOB / "markers"
        newer = [p for p in markers.glob("*.json") if p.stat().st_mtime > started]
        times = [json.loads(p.read_text())["committed_at"] for p in newer]
        return min(times) - started if times else None


class Plain(Side):
    settings: tuple[str, ...] = ()  # more session settings for plain_query.py

    def env(self) -> dict[str, str]:
        env = driver_env()
        if self.archive is not None:  # what a plain PySpark user would pass
            env["PYSPARK_SUBMIT_ARGS"] = (
                f"--driver-java-options '-XX:SharedArchiveFile={self.archive}' pyspark-shell"
            )
        return env

    def argv(self) -> list[str]:
        script = Path(__file__).with_name("plain_query.py")
        return [sys.executable, str(script), str(self.events), str(self.work / "checkpoint"),
                str(self.work / "output"), *self.settings]  # fmt: skip

    def committed_after(self, started: float) -> float | None:
        commits = self.work / "checkpoint" / "commits"
        times = [p.stat().st_mtime for p in commits.glob("[0-9]*")] if commits.exists() else []
        newer = [t for t in times if t > started]
        return min(newer) - started if newer else None


class PlainWithOurFileManager(Plain):
    """Plain PySpark with the checkpoint file manager streamkeeper's session sets
    (runtime/session.py): the same query, without that one difference of settings."""

    settings = (f"{CHECKPOINT_FILE_MANAGER_KEY}={LOCAL_CHECKPOINT_FILE_MANAGER}",)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--class-data-archive",
        type=Path,
        help="an archive from `streamkeeper driver-archive`, for both sides (streamkeeper: "
        "spark.class_data_archive; plain: --driver-java-options)",
    )
    args = parser.parse_args()
    place = Path(tempfile.mkdtemp(prefix="sk-restart-"))
    archive = args.class_data_archive
    sides = [
        Streamkeeper("streamkeeper", place / "ours", archive),
        Plain("plain", place / "plain", archive),
        PlainWithOurFileManager("plain-fs-mgr", place / "plain-fs-mgr", archive),
    ]
    times: dict[str, list[float]] = {side.name: [] for side in sides}
    try:
        for side in sides:  # the first start (the empty state, the tables made) aside
            side.work.mkdir(parents=True)
            side.add_file()
            side.first_commit(side.start())
            side.kill()
        for round_ in range(args.rounds):
            for side in sides if round_ % 2 == 0 else reversed(sides):
                side.add_file()
                seconds = side.first_commit(side.start())
                side.kill()
                times[side.name].append(seconds)
                print(f"round {round_ + 1} {side.name:<13} {seconds:6.2f} s", flush=True)
    finally:
        for side in sides:
            if side.process is not None and side.process.poll() is None:
                side.kill()
    print(f"\n{machine()}; {args.rounds} rounds; work in {place}")
    ours, plain, plain_fs = (statistics.median(times[s.name]) for s in sides)
    print(
        f"restart to first new commit, median: streamkeeper {ours:.2f} s, plain {plain:.2f} s, "
        f"plain with streamkeeper's checkpoint file manager {plain_fs:.2f} s"
    )
    print(f"ratio streamkeeper / plain: {ours / plain:.2f} (target <= 1.1)")
    print(f"ratio streamkeeper / plain with its file manager: {ours / plain_fs:.2f}")
    print_start_phases(sides[0].work)
    return 0


def print_start_phases(work: Path) -> None:
    """The median of each phase over the timed restarts (the log's `start phases` line)."""
    laps: dict[str, list[float]] = {}
    for log in sorted(work.glob("driver-*.log"))[1:]:  # the first start aside, as above
        for line in log.read_text(errors="replace").splitlines():
            if "start phases: " in line:
                phases = line.split("start phases: ", 1)[1].split("; ")[0]
                for name, seconds in re.findall(r"(.+?) ([0-9.]+) s(?:, |$)", phases):
                    laps.setdefault(name.strip(), []).append(float(seconds))
    parts = ", ".join(f"{name} {statistics.median(s):.2f} s" for name, s in laps.items())
    print(f"streamkeeper's start phases, medians: {parts}")


if __name__ == "__main__":
    sys.exit(main())
