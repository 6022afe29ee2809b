"""Load: the highest input rate the sample job sustains before its status turns DEGRADED.

Run:  /work/main/.venv/bin/python benchmarks/load.py [--rates 250,500,...] [--hold 50]
          [--interval 1s] [--keys 100] [--after-degraded 0] [--warmup 40]
          [--warmup-rate 1000] [--workdir DIR] [--keep]

The sample job (keyed-totals, exactly once into two Delta tables on local storage) runs
as a real driver (`streamkeeper run`, local[2]). Input is one file per trigger interval
with `rate x interval` events (benchmarks/loadgen.py). After a warm-up (`--warmup` s at
`--warmup-rate`: a cold driver's first batches overrun at any rate) the rate steps up; each step is
held `--hold` seconds (several checkpoints) while `StreamkeeperClient.status` is read
every 2 s. Per step: the offered rate (events written / time), the processed rate (the
checkpoint history's input rows over the step's second half), the median batch
duration, the backlog (events written but not yet committed) at the step's end, the
status (state and reason) at the end, how many of the step's readings were DEGRADED,
and whether the old rate rule (Spark's processed < 0.9 x input rows/s over the last 5
batches) would have fired. A step is sustained when no reading of its second half was
DEGRADED and the backlog at its end is under five intervals of input. The run stops
`--after-degraded` steps after the first DEGRADED step. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "src")]
sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

from benchmarks.loadgen import (  # noqa: E402
    JOB,
    RateFeeder,
    driver_command,
    finite,
    load_average,
    machine,
    start_driver,
    write_events,
)
from streamkeeper.client import StreamkeeperClient  # noqa: E402
from streamkeeper.spec import parse_duration  # noqa: E402

SEED_ROWS = 100
# Backlog (events written but not in the history yet) of a job that keeps up: the file
# just written, the batch running, and up to 2 s until the history is flushed.
BACKLOG_INTERVALS = 5
DEFAULT_RATES = "250,500,1000,2000,4000,8000,16000,32000,64000"


def _start(row: Any) -> float:
    return datetime.fromisoformat(str(row.trigger_time).replace("Z", "+00:00")).timestamp()


def rate_rule(rows: list[Any]) -> bool:
    """The rule status used before the overrun rule: processed < 0.9 x input rows/s."""
    recent = [r for r in rows[-5:] if r.input_rows > 0]
    if len(recent) < 3:
        return False
    arriving = sum(r.input_rows_per_second for r in recent) / len(recent)
    processing = sum(r.processed_rows_per_second for r in recent) / len(recent)
    return processing < 0.9 * arriving


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default=DEFAULT_RATES, help="events/s per step")
    parser.add_argument("--hold", type=float, default=50.0, help="seconds per step")
    parser.add_argument("--interval", default="1s", help="trigger interval")
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--after-degraded", type=int, default=0)
    parser.add_argument(
        "--warmup", type=float, default=40.0, help="seconds at --warmup-rate before the steps"
    )
    parser.add_argument("--warmup-rate", type=float, default=1000.0)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",") if r.strip()]
    interval = parse_duration(args.interval)

    work = args.workdir or Path(tempfile.mkdtemp(prefix="sk-load-"))
    work.mkdir(parents=True, exist_ok=True)
    root, checkpoint, events = work / "data", work / "checkpoint", work / "events"
    print(f"machine: {machine()}", flush=True)
    print(f"workdir {work}; interval {interval:g} s; hold {args.hold:g} s per step", flush=True)
    client = StreamkeeperClient(str(root))
    feeder = RateFeeder(events, rates[0], interval, keys=args.keys)
    # One file for the first batch; the feeder starts once the driver is up, so the
    # first step does not inherit the input that piled up during the driver's start.
    write_events(events / "events-seed.json", 10**12, SEED_ROWS, args.keys, feeder.rng)
    driver = start_driver(
        driver_command(root, checkpoint, events, args.interval), work / "driver.log", work
    )
    steps: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        _wait_first_checkpoint(client, driver, work)
        print(f"driver up: first checkpoint after {time.monotonic() - started:.1f} s", flush=True)
        # A cold driver's first batches (JIT, Python workers) overrun the interval at any
        # rate; the steps start warm.
        feeder.rate = args.warmup_rate
        feeder.start()
        time.sleep(args.warmup)
        print(
            f"warm-up: {args.warmup:g} s at {args.warmup_rate:g} events/s, now "
            f"{client.status(JOB).state}; load {load_average():.2f}",
            flush=True,
        )
        header = (
            f"{'offered/s':>10} {'processed/s':>11} {'batch s':>7} {'backlog':>9} "
            f"{'load':>5} {'DEGRADED':>8} {'rate rule':>9}  state: reason"
        )
        print(header, flush=True)
        after = None
        for rate in rates:
            step = _step(client, driver, feeder, rate, args.hold, interval)
            steps.append(step)
            print(
                f"{step['offered']:>10.0f} {step['processed']:>11.0f} "
                f"{step['batch_s']:>7.2f} {step['backlog']:>9} {step['load']:>5.2f} "
                f"{step['degraded_readings']:>3}/{step['readings']:<4} "
                f"{'fires' if step['rate_rule'] else '-':>9}  {step['state']}: {step['reason']}",
                flush=True,
            )
            if step["degraded"] and after is None:
                after = args.after_degraded
            if after is not None:
                if after <= 0:
                    break
                after -= 1
    finally:
        if feeder.is_alive():
            feeder.stop()
        if driver.poll() is None:
            driver.terminate()
            try:
                driver.wait(timeout=120)
            except Exception:  # noqa: BLE001
                driver.kill()
    sustained = [s for s in steps if s["sustained"]]
    first_degraded = next((s for s in steps if s["degraded"]), None)
    before = [s for s in sustained if first_degraded is None or s["rate"] < first_degraded["rate"]]
    best = max((s["rate"] for s in before), default=0)
    print(f"highest sustained rate before DEGRADED: {best:.0f} rows/s", flush=True)
    if first_degraded is None:
        print("(no step turned DEGRADED: raise --rates)", flush=True)
    else:
        print(
            f"first DEGRADED at {first_degraded['rate']:.0f} rows/s offered: "
            f"{first_degraded['degraded_reason']}",
            flush=True,
        )
    print(
        json.dumps(
            finite(
                {
                    "benchmark": "load",
                    "machine": machine(),
                    "interval_s": interval,
                    "hold_s": args.hold,
                    "keys": args.keys,
                    "highest_sustained_rows_per_s": best,
                    "first_degraded_rows_per_s": None
                    if first_degraded is None
                    else first_degraded["rate"],
                    "steps": steps,
                    "wall_s": round(time.monotonic() - started, 1),
                }
            )
        ),
        flush=True,
    )
    if not args.keep and args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _wait_first_checkpoint(client: StreamkeeperClient, driver: Any, work: Path) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if driver.poll() is not None:
            raise SystemExit(f"the driver exited ({driver.returncode}); see {work}/driver.log")
        try:
            if client.status(JOB).head is not None:
                return
        except Exception:  # noqa: BLE001 - not registered yet
            pass
        time.sleep(0.5)
    raise SystemExit(f"no checkpoint within 300 s; see {work}/driver.log")


def _step(
    client: StreamkeeperClient,
    driver: Any,
    feeder: RateFeeder,
    rate: float,
    hold: float,
    interval: float,
) -> dict[str, Any]:
    rows0, _ = feeder.written()
    feeder.rate = rate
    t0 = time.time()
    readings: list[tuple[float, str, str]] = []
    degraded_reason = None
    while time.time() - t0 < hold:
        if driver.poll() is not None:
            raise SystemExit(f"the driver exited ({driver.returncode})")
        status = client.status(JOB)
        readings.append((time.time() - t0, status.state, status.reason))
        if status.state == "DEGRADED" and degraded_reason is None:
            degraded_reason = status.reason
        time.sleep(2.0)
    t1 = time.time()
    rows1, files1 = feeder.written()
    history = client.history(JOB, last=200)
    committed = sum(r.input_rows for r in client.history(JOB, last=None))
    steady = [r for r in history if _start(r) >= t0 + hold / 2 and r.input_rows > 0]
    if len(steady) >= 2:
        span = _start(steady[-1]) + steady[-1].duration_ms / 1000 - _start(steady[0])
        processed = sum(r.input_rows for r in steady) / max(span, 1e-9)
        batch = statistics.median(r.duration_ms / 1000 for r in steady)
    else:
        processed, batch = 0.0, float("nan")
    last_state, last_reason = readings[-1][1], readings[-1][2]
    late = [r for r in readings if r[0] >= hold / 2]
    backlog = rows1 + SEED_ROWS - committed
    degraded = any(state == "DEGRADED" for _, state, _ in late)
    return {
        "rate": rate,
        "offered": (rows1 - rows0) / (t1 - t0),
        "processed": processed,
        "batch_s": batch,
        "batches": len(steady),
        "backlog": backlog,
        "files_written": files1,
        "load": load_average(),
        "readings": len(readings),
        "degraded_readings": sum(1 for _, state, _ in readings if state == "DEGRADED"),
        "degraded": degraded,
        "degraded_reason": degraded_reason,
        "sustained": not degraded and backlog < BACKLOG_INTERVALS * rate * interval,
        "state": last_state,
        "reason": last_reason,
        "rate_rule": rate_rule(history),
    }


if __name__ == "__main__":
    sys.exit(main())
