"""Soak: the sample job under steady input for an hour; nothing it costs may creep up.

Run:  /work/main/.venv/bin/python benchmarks/soak.py [--minutes 60] [--rate 2000]
          [--interval 1s] [--restart-every 10] [--warmup 3] [--workdir DIR] [--keep]
      /work/main/.venv/bin/python benchmarks/soak.py --judge LOG

The sample job (keyed-totals, exactly once into two Delta tables on local storage) runs
as a real driver (`streamkeeper run`, local[2]) fed `--rate` events/s (one file per
trigger interval, benchmarks/loadgen.py). Every `--restart-every` minutes the driver is
stopped (SIGTERM: a clean stop) and a new one started on the same checkpoint and lineage.
Every minute one line:

  driver memory     RSS of the driver's Python process and of its JVM (psutil)
  objects           files under the lineage (`lineages/<lineage>`: markers, WAL, history,
                    epochs, externalized checkpoints), under the tables' Delta logs, the
                    tables' data files, and Spark's checkpoint directory
  commit cost       medians over the minute's checkpoints (history table): batch duration,
                    Spark's walCommit and commitOffsets, and the delay from the batch's end
                    to its Delta commit (`visibility_delay_ms`: the deferred commit)
  recovery cost     the last start's time from process start to its first new checkpoint
                    (and to its first heartbeat)

At the end, each series' range within each driver life, its least-squares slope per hour
and whether it is flat: the slope, extrapolated over an hour, moves the series by at most
10 % of its median (`--flat`). Samples of the first `--warmup` minutes (JIT, heap growing
to its working size) are left out. Driver memory restarts with every driver, so its slope
is the pooled slope within each driver's life (one intercept per driver, each life's first
`--warmup` minutes left out: a new JVM grows its heap for minutes). A slope down by more
than that is FALLING: a cost that does not creep up. An object count kept by retention
is a sawtooth (it grows, a maintenance pass cuts it back), whose per-minute fit follows
where the passes fall: it is judged by the mean of each life from the second on (the
first fills the retention windows), one point per life, from three lives (and flat within
an object an hour, for counts of a few files); the lineage's epochs are not judged
(fencing keeps one small file per start). The recovery series has one value per restart.
Data files of the tables are printed but not judged: an append table keeps every batch's
file by design and nothing vacuums the merged table's replaced files. Last line: one JSON
object; `--judge LOG` judges an earlier run's again.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "src")]
sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

import psutil  # noqa: E402

from benchmarks.loadgen import (  # noqa: E402
    JOB,
    RateFeeder,
    driver_command,
    finite,
    load_average,
    machine,
    start_driver,
)
from streamkeeper.client import StreamkeeperClient  # noqa: E402
from streamkeeper.spec import parse_duration  # noqa: E402

MIB = 1024 * 1024


def count_files(path: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(path)) if path.exists() else 0


def objects(root: Path, checkpoint: Path) -> dict[str, int]:
    lineage = root / "lineages"
    tables = root / "tables"
    log_files = (
        sum(count_files(t / "_delta_log") for t in tables.iterdir()) if tables.exists() else 0
    )
    all_table = count_files(tables)
    parts: dict[str, int] = {}
    for base in lineage.iterdir() if lineage.exists() else []:
        for folder in base.iterdir():
            name = folder.name if folder.is_dir() else "(files)"
            count = count_files(folder) if folder.is_dir() else 1
            parts[f"lineage/{name}"] = parts.get(f"lineage/{name}", 0) + count
    return {
        "lineage": count_files(lineage),
        **parts,
        "table_logs": log_files,
        "table_data": all_table - log_files,
        "spark_checkpoint": count_files(checkpoint),
    }


def memory(pid: int) -> tuple[float, float]:
    """RSS in MiB of the driver's Python process and of its JVM (its java children)."""
    try:
        process = psutil.Process(pid)
        python = process.memory_info().rss / MIB
        jvm = sum(
            child.memory_info().rss
            for child in process.children(recursive=True)
            if "java" in child.name()
        )
        return python, jvm / MIB
    except psutil.Error:
        return float("nan"), float("nan")


def slope_per_hour(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (minute, value) points, per hour."""
    points = [(x, y) for x, y in points if y == y]  # drop NaN
    if len(points) < 2:
        return None
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return None
    return 60 * sum((x - mx) * (y - my) for x, y in points) / sxx


def pooled_slope_per_hour(groups: dict[int, list[tuple[float, float]]]) -> float | None:
    """The slope within groups (one intercept each): demean every group, then fit."""
    centred: list[tuple[float, float]] = []
    for points in groups.values():
        points = [(x, y) for x, y in points if y == y]
        if len(points) < 2:
            continue
        mx = statistics.fmean(x for x, _ in points)
        my = statistics.fmean(y for _, y in points)
        centred += [(x - mx, y - my) for x, y in points]
    return slope_per_hour(centred)


class Driver:
    def __init__(self, argv: list[str], work: Path, client: StreamkeeperClient) -> None:
        self.argv, self.work, self.client = argv, work, client
        self.process: Any = None
        self.started = 0.0
        self.starts = 0
        self.life = -1

    def start(self) -> None:
        self.started = time.time()
        self.life += 1
        self.process = start_driver(self.argv, self.work / f"driver-{self.life}.log", self.work)

    def stop(self) -> float:
        began = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=180)
        except Exception:  # noqa: BLE001
            self.process.kill()
            self.process.wait()
        return time.monotonic() - began

    def alive(self) -> None:
        if self.process.poll() is not None:
            raise SystemExit(f"the driver exited ({self.process.returncode}); see {self.work}")

    def first_checkpoint(self, timeout: float = 600) -> tuple[float, float | None]:
        """Seconds from start to this driver's first checkpoint, and to its first beat."""
        deadline = time.monotonic() + timeout
        beat_at = None
        while time.monotonic() < deadline:
            self.alive()
            try:
                status = self.client.status(JOB)
            except Exception:  # noqa: BLE001 - not registered yet
                status = None
            if status is not None and status.runner and status.runner.pid == self.process.pid:
                if beat_at is None and status.runner.heartbeat_at:
                    beat_at = float(status.runner.heartbeat_at) - self.started
                head = status.head
                if head is not None and (head.committed_at or 0) > self.started:
                    return float(head.committed_at) - self.started, beat_at
            time.sleep(0.2)
        raise SystemExit(f"no checkpoint within {timeout} s of a start; see {self.work}")


def _start_time(trigger_time: str) -> float:
    return datetime.fromisoformat(str(trigger_time).replace("Z", "+00:00")).timestamp()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=2000.0, help="events/s")
    parser.add_argument("--interval", default="1s")
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--restart-every", type=float, default=10.0, help="minutes")
    parser.add_argument("--sample", type=float, default=60.0, help="seconds between lines")
    parser.add_argument("--warmup", type=float, default=3.0, help="minutes not judged")
    parser.add_argument("--flat", type=float, default=0.10, help="max growth/h over median")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a spec setting for the driver, e.g. maintenance.history_retention=5m",
    )
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument(
        "--judge",
        type=Path,
        metavar="LOG",
        help="run nothing: judge the samples of an earlier run (its output, last line JSON)",
    )
    args = parser.parse_args()
    if args.judge is not None:
        earlier = json.loads(args.judge.read_text().strip().splitlines()[-1])
        nan = float("nan")  # the JSON wrote NaN as null
        samples, restarts = (
            [{k: nan if v is None else v for k, v in row.items()} for row in earlier[part]]
            for part in ("samples", "restarts")
        )
        report(samples, restarts, args.warmup, args.flat)
        return 0
    interval = parse_duration(args.interval)

    work = args.workdir or Path(tempfile.mkdtemp(prefix="sk-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    root, checkpoint, events = work / "data", work / "checkpoint", work / "events"
    print(f"machine: {machine()}", flush=True)
    print(
        f"workdir {work}; {args.minutes:g} min at {args.rate:g} events/s, interval "
        f"{interval:g} s, restart every {args.restart_every:g} min"
        + (f", settings {' '.join(args.set)}" if args.set else ""),
        flush=True,
    )
    # The driver's JVM options set what it measures: infra/driver_jvm.sh's (C1 only, a
    # 48 MB code cache) are for the tests' short-lived drivers, not for a soak.
    print(f"driver JVM: {os.environ.get('PYSPARK_SUBMIT_ARGS') or 'defaults'}", flush=True)
    client = StreamkeeperClient(str(root))
    feeder = RateFeeder(events, args.rate, interval, keys=args.keys)
    argv = driver_command(root, checkpoint, events, args.interval, *args.set)
    driver = Driver(argv, work, client)
    samples: list[dict[str, Any]] = []
    restarts: list[dict[str, Any]] = []
    feeder.start()
    driver.start()
    t0 = time.time()
    try:
        first, beat = driver.first_checkpoint()
        restarts.append({"minute": 0.0, "first_checkpoint_s": first, "first_beat_s": beat})
        print(f"first start: first checkpoint after {first:.1f} s", flush=True)
        print(
            f"{'min':>5} {'py MiB':>7} {'jvm MiB':>7} {'lineage':>7} {'dlog':>5} {'data':>6} "
            f"{'ckpt':>6} {'batches':>7} {'batch ms':>8} {'wal ms':>6} {'offs ms':>7} "
            f"{'commit ms':>9} {'restart s':>9} {'load':>5}",
            flush=True,
        )
        next_sample = t0 + args.sample
        next_restart = t0 + args.restart_every * 60
        end = t0 + args.minutes * 60
        last_sample_at = t0
        while time.time() < end:
            now = time.time()
            if now >= next_restart and end - now > 2 * args.sample:
                minute = (now - t0) / 60  # when the stop began
                stop_s = driver.stop()
                driver.start()
                first, beat = driver.first_checkpoint()
                restarts.append(
                    {
                        "minute": minute,
                        "stop_s": stop_s,
                        "first_checkpoint_s": first,
                        "first_beat_s": beat,
                    }
                )
                print(
                    f"restart at {minute:.1f} min: stop {stop_s:.1f} s, first checkpoint "
                    f"{first:.1f} s after start (first beat {beat or float('nan'):.1f} s), "
                    f"load {load_average():.2f}",
                    flush=True,
                )
                next_restart = time.time() + args.restart_every * 60
                continue
            if now >= next_sample:
                samples.append(_sample(client, driver, root, checkpoint, t0, last_sample_at))
                last_sample_at = now
                _print(samples[-1], restarts[-1])
                while next_sample <= time.time():  # a restart may have taken several
                    next_sample += args.sample
                continue
            driver.alive()
            time.sleep(min(1.0, max(0.0, min(next_sample, next_restart) - time.time())))
    finally:
        feeder.stop()
        if driver.process is not None and driver.process.poll() is None:
            driver.stop()
    verdicts = report(samples, restarts, args.warmup, args.flat)
    print(
        json.dumps(
            finite(
                {
                    "benchmark": "soak",
                    "machine": machine(),
                    "minutes": args.minutes,
                    "rate": args.rate,
                    "interval_s": interval,
                    "restart_every_min": args.restart_every,
                    "warmup_min": args.warmup,
                    "flat_threshold": args.flat,
                    "verdicts": verdicts,
                    "settings": args.set,
                    "restarts": restarts,
                    "samples": samples,
                }
            )
        ),
        flush=True,
    )
    if not args.keep and args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _sample(
    client: StreamkeeperClient,
    driver: Driver,
    root: Path,
    checkpoint: Path,
    t0: float,
    since: float,
) -> dict[str, Any]:
    now = time.time()
    python, jvm = memory(driver.process.pid)
    rows = [r for r in client.history(JOB, last=200) if _start_time(r.trigger_time) >= since]

    def median(values: list[float]) -> float:
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else float("nan")

    return {
        "minute": (now - t0) / 60,
        "life": driver.life,
        "life_minute": (now - driver.started) / 60,
        "python_rss_mib": python,
        "jvm_rss_mib": jvm,
        **objects(root, checkpoint),
        "batches": len(rows),
        "batch_ms": median([r.duration_ms for r in rows]),
        "wal_commit_ms": median([r.wal_commit_ms for r in rows]),
        "commit_offsets_ms": median([r.commit_offsets_ms for r in rows]),
        "delta_commit_ms": median([r.visibility_delay_ms for r in rows]),
        "load": load_average(),
    }


def _print(sample: dict[str, Any], restart: dict[str, Any]) -> None:
    print(
        f"{sample['minute']:>5.1f} {sample['python_rss_mib']:>7.0f} {sample['jvm_rss_mib']:>7.0f} "
        f"{sample['lineage']:>7} {sample['table_logs']:>5} {sample['table_data']:>6} "
        f"{sample['spark_checkpoint']:>6} {sample['batches']:>7} {sample['batch_ms']:>8.0f} "
        f"{sample['wal_commit_ms']:>6.0f} {sample['commit_offsets_ms']:>7.0f} "
        f"{sample['delta_commit_ms']:>9.0f} {restart['first_checkpoint_s']:>9.1f} "
        f"{sample['load']:>5.2f}",
        flush=True,
    )


def count_series(parts: list[str]) -> tuple[str, ...]:
    """The object counts: the lineage's files (and per folder), the tables' logs, Spark's."""
    return ("lineage", *parts, "table_logs", "spark_checkpoint")


def report(
    samples: list[dict[str, Any]], restarts: list[dict[str, Any]], warmup: float, flat: float
) -> dict[str, dict[str, Any]]:
    """Print each series' range within each driver life, then its slope and verdict."""
    judged = [s for s in samples if s["minute"] >= warmup]
    parts = sorted({k for s in judged for k in s if k.startswith("lineage/")})
    print("within each driver life (min-max after the warm-up):", flush=True)
    lives = sorted({s["life"] for s in judged})
    print(f"  {'life':<22} " + "  ".join(f"{life:>11}" for life in lives), flush=True)
    keys = (*count_series(parts), "python_rss_mib", "jvm_rss_mib", "batch_ms", "delta_commit_ms")
    for line in life_ranges(judged, keys):
        print(line, flush=True)
    verdicts = _verdicts(samples, restarts, warmup, flat)
    print(
        f"slopes (per hour; flat = |slope| x 1 h <= {flat:.0%} of the median; falling = "
        "down by more: a cost that does not creep up):",
        flush=True,
    )
    for name, verdict in verdicts.items():
        slope, median = verdict["slope_per_hour"], verdict["median"]
        shown = "n/a" if slope is None else f"{slope:+.3g}"
        judgement = {"flat": "FLAT", "falling": "FALLING", "rising": "NOT FLAT"}.get(
            verdict["trend"], "not judged"
        )
        print(
            f"  {name:<22} slope {shown:>10} /h  median {median:.4g}  {judgement}"
            + (f"  ({verdict['note']})" if verdict.get("note") else ""),
            flush=True,
        )
    return verdicts


def life_means(samples: list[dict[str, Any]], key: str) -> list[tuple[float, float]]:
    """(mean minute, mean value) of each driver life after the first."""
    first = min((s["life"] for s in samples), default=0)
    lives: dict[int, list[dict[str, Any]]] = {}
    for sample in samples:
        if sample["life"] > first:
            lives.setdefault(sample["life"], []).append(sample)
    return [
        (
            statistics.fmean(s["minute"] for s in group),
            statistics.fmean(s.get(key, 0) for s in group),
        )
        for _, group in sorted(lives.items())
    ]


def life_ranges(samples: list[dict[str, Any]], keys: tuple[str, ...]) -> list[str]:
    """One line per series: its min-max within each driver life."""
    lives = sorted({s["life"] for s in samples})
    lines = []
    for key in keys:
        ranges = []
        for life in lives:
            values = [
                s[key] for s in samples if s["life"] == life and key in s and s[key] == s[key]
            ]
            ranges.append(f"{min(values):.0f}-{max(values):.0f}" if values else "-")
        lines.append(f"  {key:<22} " + "  ".join(f"{r:>11}" for r in ranges))
    return lines


def _verdicts(
    samples: list[dict[str, Any]], restarts: list[dict[str, Any]], warmup: float, flat: float
) -> dict[str, dict[str, Any]]:
    judged = [s for s in samples if s["minute"] >= warmup]
    out: dict[str, dict[str, Any]] = {}

    def verdict(
        name: str,
        slope: float | None,
        values: list[float],
        note: str = "",
        judge: bool = True,
        floor: float = 0.0,
    ) -> None:
        """Flat: the slope moves the series by at most `flat` of its median in an hour (or
        `floor`); falling: it moves it down by more (a cost that does not creep up)."""
        values = [v for v in values if v == v]
        median = statistics.median(values) if values else float("nan")
        is_flat, trend = None, None
        if judge and slope is not None and median == median:
            limit = max(flat * abs(median), floor)
            trend = "flat" if abs(slope) <= limit else ("falling" if slope < 0 else "rising")
            is_flat = trend != "rising"
        out[name] = {
            "slope_per_hour": slope,
            "median": median,
            "flat": is_flat,
            "trend": trend,
            "note": note,
        }

    for key in ("python_rss_mib", "jvm_rss_mib"):
        # Each driver is a new process: its own warm-up (JIT, the heap growing to its
        # working size) is left out as the run's is.
        groups: dict[int, list[tuple[float, float]]] = {}
        for s in judged:
            if s["life_minute"] >= warmup:
                groups.setdefault(s["life"], []).append((s["minute"], s[key]))
        verdict(
            key,
            pooled_slope_per_hour(groups),
            [y for points in groups.values() for _, y in points],
            f"within each driver, after its first {warmup:g} min",
        )
    parts = sorted({k for s in judged for k in s if k.startswith("lineage/")})
    for key in count_series(parts):
        # A count kept by retention is a sawtooth (it grows, a pass cuts it back): judged by
        # the mean of each driver's life, from the second life on (the first fills the
        # retention windows), one point per life.
        means = life_means(judged, key)
        if key == "lineage/epochs":  # fencing keeps every epoch: one small file per start
            verdict(key, slope_per_hour(means), [y for _, y in means], "one per start", False)
            continue
        verdict(
            key,
            slope_per_hour(means),
            [y for _, y in means],
            f"means of the {len(means)} lives after the first",
            judge=len(means) >= 3,
            floor=1.0,  # a count of 1-3 files: an object an hour is not a trend
        )
    verdict(
        "table_data",
        slope_per_hour([(s["minute"], s["table_data"]) for s in judged]),
        [s["table_data"] for s in judged],
        "data files: grows by design, not judged",
        judge=False,
    )
    for key in ("batch_ms", "wal_commit_ms", "commit_offsets_ms", "delta_commit_ms"):
        verdict(
            key, slope_per_hour([(s["minute"], s[key]) for s in judged]), [s[key] for s in judged]
        )
    later = restarts[1:]  # the first start is cold (no class-data cache of the JIT, empty lineage)
    verdict(
        "recovery_first_checkpoint_s",
        slope_per_hour([(r["minute"], r["first_checkpoint_s"]) for r in later]),
        [r["first_checkpoint_s"] for r in later],
        f"{len(later)} restarts",
        judge=len(later) >= 3,
    )
    return out


if __name__ == "__main__":
    sys.exit(main())
