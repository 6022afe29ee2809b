"""Sink throughput of the sample job keyed-totals: exactly_once, idempotent, at_least_once, noop.

Run:  /work/venv/bin/python benchmarks/sink_throughput.py [--events N] [--files F]
          [--backends local,s3] [--repeats R] [--warmup-files W] [--workdir DIR] [--keep]

Everything runs in ONE process: the SparkSession (and its JVM) is created once, by the
warm-up, and reused by every measured run through `getOrCreate`. Every run processes the
same input from scratch, with a fresh storage root and a fresh Spark checkpoint.

How the time is measured (see benchmarks/README.md): from Spark's checkpoint, listener-free.
  start = mtime of `offsets/0`  (Spark writes it when it plans batch 0, before running it)
  end   = the moment the last batch's output is visible in Delta:
            exactly_once:             `committed_at` of the last commit marker (the coordinator
                                      commits the tables after `commits/N`, then writes it)
            idempotent/at_least_once: mtime of `commits/{last}` (tables are committed inside
                                      the batch, before Spark writes its commit log entry)
            noop:                     mtime of `commits/{last}`
  throughput = input events / (end - start)
So query start-up (session, table creation, recovery, query planning) is excluded, the same
way for every variant, and the tail commit of exactly_once is included.

The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import traceback
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SAMPLE_SPEC = REPO / "jobs" / "keyed_totals" / "job.yaml"
sys.path.insert(0, str(REPO))  # the sample job's events (jobs/) and local services (tests/)

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("STREAMKEEPER_SPARK_LOG_LEVEL", "ERROR")

MODES = ("exactly_once", "idempotent", "at_least_once")
# Run order of a repeat (reversed every other repeat); exactly_once and at_least_once are
# adjacent so that the pair the target compares runs under the most similar machine load.
VARIANTS = ("noop", "idempotent", "at_least_once", "exactly_once")
TARGET_RATIO = 0.9  # the target: exactly_once >= 0.9 x at_least_once

S3_BUCKET = "streamkeeper-bench"
S3_ACCESS_KEY = "streamkeeper-bench"
S3_SECRET_KEY = "streamkeeper-bench-secret"


# -- machine ----------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    cpu_model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
                break
    except OSError:
        pass
    import pyspark

    try:
        import deltalake

        deltalake_version = deltalake.__version__
    except Exception:  # noqa: BLE001
        deltalake_version = "unknown"
    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model,
        "ram_gib": ram_gib,
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
        "deltalake": deltalake_version,
    }


# -- one run ----------------------------------------------------------------------------


@dataclass
class RunRecord:
    backend: str
    variant: str
    repeat: int  # -1 for a warm-up run
    events: int
    batches: int
    span_s: float  # offsets/0 -> last output visible
    batch_span_s: float  # offsets/0 -> commits/{last}
    wall_s: float  # the whole call (query start-up and shutdown included)
    throughput: float  # events / span_s
    batch_throughput: float  # events / batch_span_s
    delays_ms: list[float] = field(default_factory=list)  # exactly_once: marker visibility delays
    result_delays_ms: list[float] = field(default_factory=list)  # RunResult.visibility_delays_ms
    correct: bool | None = None  # tables match the reference result (None: not checked)
    progress_span_s: float | None = None  # noop only: the same span from query.recentProgress
    load1: float | None = None  # 1-minute load average when the run started
    note: str = ""


def spec_overrides(mode: str, root: str, checkpoint: Path, events_dir: Path) -> dict[str, Any]:
    overrides: dict[str, Any] = {
        "storage.root": root,
        "checkpoint.dir": str(checkpoint),
        "source.path": str(events_dir),
        "spark.master": "local[2]",
        "spark.shuffle_partitions": 2,
    }
    if mode in ("exactly_once", "at_least_once"):
        overrides["checkpoint.mode"] = mode
    else:
        # checkpoint.mode only accepts exactly_once | at_least_once (spec.CheckpointMode), so
        # the idempotent mode is set on every sink instead (SinkSpec.mode accepts it).
        import yaml

        sinks = yaml.safe_load(SAMPLE_SPEC.read_text())["sinks"]
        overrides["sinks"] = [{**sink, "mode": mode} for sink in sinks]
    return overrides


def checkpoint_span(checkpoint: Path) -> tuple[float, float, int]:
    """(mtime of offsets/0, mtime of commits/{last}, number of committed batches)."""
    commits = sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    if not commits:
        raise RuntimeError(f"no committed batch in {checkpoint}")
    first_offsets = checkpoint / "offsets" / str(commits[0])
    start = os.stat(first_offsets).st_mtime
    end = os.stat(checkpoint / "commits" / str(commits[-1])).st_mtime
    return start, end, len(commits)


def read_markers(root: str, lineage: str) -> list[dict[str, Any]]:
    from streamkeeper.storage import Location, S3Settings

    location = Location(root, S3Settings.from_env())
    store = location.store()
    keys = store.list(f"lineages/{lineage}/markers")
    markers = [store.read_json(k) for k in keys if k.endswith(".json")]
    return sorted((m for m in markers if m), key=lambda m: m["seq"])


def check_tables(tables: dict[str, str], root: str, reference: dict[str, Any]) -> tuple[bool, str]:
    from streamkeeper.reader import read_table_rows
    from streamkeeper.storage import Location, S3Settings

    location = Location(root, S3Settings.from_env())
    totals = {
        r["key"]: (r["events"], r["total"])
        for r in read_table_rows(tables["totals"], location=location)
    }
    changes = sorted(
        (r["key"], r["events"], r["total"])
        for r in read_table_rows(tables["changes"], location=location)
    )
    problems = []
    if totals != reference["totals"]:
        problems.append(f"totals differ ({len(totals)} keys vs {len(reference['totals'])})")
    if changes != reference["changes"]:
        problems.append(f"changes differ ({len(changes)} rows vs {len(reference['changes'])})")
    return not problems, "; ".join(problems)


def run_sink_mode(
    mode: str,
    *,
    backend: str,
    repeat: int,
    root: str,
    checkpoint: Path,
    events_dir: Path,
    events: int,
    reference: dict[str, Any] | None,
) -> RunRecord:
    from streamkeeper.runtime.runner import RunOptions, run_job
    from streamkeeper.spec import load_spec

    spec = load_spec(SAMPLE_SPEC, spec_overrides(mode, root, checkpoint, events_dir))
    assert all(spec.sink_mode(s) == mode for s in spec.sinks), "mode override did not apply"
    wall_start = time.monotonic()
    result = run_job(spec, RunOptions(available_now=True, spec_dir=SAMPLE_SPEC.parent))
    wall = time.monotonic() - wall_start
    start, batches_end, batches = checkpoint_span(checkpoint)
    markers = read_markers(root, spec.lineage_id)
    end = batches_end
    delays: list[float] = []
    note = ""
    if len(markers) != batches:
        note = f"{len(markers)} commit markers for {batches} batches"
    if mode == "exactly_once":
        if not markers:
            raise RuntimeError("exactly_once run left no commit marker")
        end = max(batches_end, max(m["committed_at"] for m in markers))
        delays = [
            float(m["visibility_delay_ms"])
            for m in markers
            if m.get("visibility_delay_ms") is not None
        ]
    correct = None
    if reference is not None:
        correct, problems = check_tables(result.tables, root, reference)
        if problems:
            note = "; ".join(x for x in (note, problems) if x)
    return RunRecord(
        backend=backend,
        variant=mode,
        repeat=repeat,
        events=events,
        batches=batches,
        span_s=end - start,
        batch_span_s=batches_end - start,
        wall_s=wall,
        throughput=events / (end - start),
        batch_throughput=events / (batches_end - start),
        delays_ms=delays,
        result_delays_ms=[float(x) for x in result.visibility_delays_ms],
        correct=correct,
        note=note,
    )


def run_noop(
    *,
    backend: str,
    repeat: int,
    checkpoint: Path,
    events_dir: Path,
    events: int,
) -> RunRecord:
    """The same source, transformation and trigger into Spark's noop sink."""
    from streamkeeper.runtime.job import build_output
    from streamkeeper.runtime.session import build_session
    from streamkeeper.spec import load_spec

    spec = load_spec(
        SAMPLE_SPEC, spec_overrides("exactly_once", "/nonexistent", checkpoint, events_dir)
    )
    wall_start = time.monotonic()
    spark = build_session(spec)
    output = build_output(spark, spec, SAMPLE_SPEC.parent)
    query = (
        output.writeStream.queryName(f"bench-noop-{uuid.uuid4().hex[:8]}")
        .format("noop")
        .outputMode(spec.output_mode)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"noop query failed: {query.exception()}")
    progress = query.recentProgress
    progress_rows = sum(int(p.get("numInputRows", 0)) for p in progress)
    wall = time.monotonic() - wall_start
    start, end, batches = checkpoint_span(checkpoint)
    note = ""
    if progress_rows != events:
        note = f"query progress reports {progress_rows} input rows, expected {events}"
    return RunRecord(
        backend=backend,
        variant="noop",
        repeat=repeat,
        events=events,
        batches=batches,
        span_s=end - start,
        batch_span_s=end - start,
        wall_s=wall,
        throughput=events / (end - start),
        batch_throughput=events / (end - start),
        correct=None,
        progress_span_s=progress_span(progress),
        note=note,
    )


def progress_span(progress: list[dict[str, Any]]) -> float | None:
    """First batch's trigger start -> last batch's end, from the query's progress reports.

    A cross-check of the checkpoint-mtime method, possible only where we own the query.
    """
    from datetime import datetime

    batches = [p for p in progress if int(p.get("numInputRows", 0)) > 0]
    if not batches:
        return None
    first = datetime.fromisoformat(batches[0]["timestamp"]).timestamp()
    last = batches[-1]
    last_end = (
        datetime.fromisoformat(last["timestamp"]).timestamp()
        + last["durationMs"]["triggerExecution"] / 1000
    )
    return last_end - first


# -- backends ---------------------------------------------------------------------------


class Backend:
    """Where a run's storage root lives: a local directory or a SeaweedFS S3 bucket."""

    def __init__(self, name: str, workdir: Path) -> None:
        self.name = name
        self.workdir = workdir
        self.server: Any = None
        self._saved_env: dict[str, str | None] = {}
        self.prefix = f"bench-{uuid.uuid4().hex[:8]}"
        self.start_seconds: float | None = None

    def __enter__(self) -> Backend:
        if self.name == "s3":
            from tests.support.services import start_seaweedfs

            started = time.monotonic()
            self.server = start_seaweedfs(
                self.workdir / "seaweedfs", S3_BUCKET, S3_ACCESS_KEY, S3_SECRET_KEY
            )
            self.start_seconds = time.monotonic() - started
            for key, value in self.server.env().items():
                self._saved_env[key] = os.environ.get(key)
                os.environ[key] = value
        return self

    def __exit__(self, *exc: object) -> None:
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if self.server is not None:
            self.server.stop()

    def root(self, run_id: str) -> str:
        if self.name == "s3":
            return f"s3://{S3_BUCKET}/{self.prefix}/{run_id}"
        return str(self.workdir / "roots" / run_id)

    def discard(self, root: str) -> None:
        """Free the run's storage (keeps the disk and the bucket small between runs)."""
        if self.name == "local":
            shutil.rmtree(root, ignore_errors=True)
            return
        from streamkeeper.storage import Location, S3Settings

        store = Location(root, S3Settings.from_env()).store()
        store.delete(store.list(""))  # type: ignore[arg-type]


# -- statistics -------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolation percentile (numpy's default), q in [0, 100]."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(records: list[RunRecord], backends: list[str]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for backend in backends:
        runs = [r for r in records if r.backend == backend and r.repeat >= 0]
        per_variant: dict[str, Any] = {}
        for variant in VARIANTS:
            mine = [r for r in runs if r.variant == variant]
            if not mine:
                continue
            per_variant[variant] = {
                "throughput_eps": statistics.median(r.throughput for r in mine),
                "batch_throughput_eps": statistics.median(r.batch_throughput for r in mine),
                "span_s": statistics.median(r.span_s for r in mine),
                "wall_s": statistics.median(r.wall_s for r in mine),
                "runs_eps": [round(r.throughput, 1) for r in mine],
                "correct": None
                if all(r.correct is None for r in mine)
                else all(r.correct for r in mine if r.correct is not None),
            }
        for figures in per_variant.values():
            for base in ("at_least_once", "noop"):
                if base in per_variant:
                    figures[f"vs_{base}"] = (
                        figures["throughput_eps"] / per_variant[base]["throughput_eps"]
                    )
        entry: dict[str, Any] = {"variants": per_variant}
        eo_runs = [r for r in runs if r.variant == "exactly_once"]
        delays = [d for r in eo_runs for d in r.delays_ms]
        result_delays = [d for r in eo_runs for d in r.result_delays_ms]
        entry["exactly_once_visibility_delay_ms"] = {
            "samples": len(delays),
            "p50": percentile(delays, 50),
            "p95": percentile(delays, 95),
            "max": max(delays) if delays else None,
            "run_result_samples": len(result_delays),
            "run_result_p50": percentile(result_delays, 50),
            "run_result_p95": percentile(result_delays, 95),
        }
        if "exactly_once" in per_variant and "at_least_once" in per_variant:
            ratio = per_variant["exactly_once"]["vs_at_least_once"]
            paired = []
            for repeat in sorted({r.repeat for r in runs}):
                pair = {r.variant: r.throughput for r in runs if r.repeat == repeat}
                if "exactly_once" in pair and "at_least_once" in pair:
                    paired.append(pair["exactly_once"] / pair["at_least_once"])
            entry["target"] = {
                "exactly_once_vs_at_least_once": ratio,
                "required": TARGET_RATIO,
                "pass": ratio >= TARGET_RATIO,
                "per_repeat_ratios": paired,
            }
        summary[backend] = entry
    return summary


# -- output -----------------------------------------------------------------------------


def print_run(record: RunRecord) -> None:
    label = "warm-up" if record.repeat < 0 else f"repeat {record.repeat + 1}"
    extra = ""
    if record.delays_ms:
        extra = f"  vis p50 {percentile(record.delays_ms, 50):.0f} ms"
    if record.progress_span_s is not None:
        extra = f"  (query progress: {record.progress_span_s:.2f} s)"
    check = {None: "", True: "  output ok", False: "  OUTPUT WRONG"}[record.correct]
    note = f"  [{record.note}]" if record.note else ""
    print(
        f"  {record.backend:5} {label:9} {record.variant:13} {record.batches:3d} batches  "
        f"{record.span_s:7.2f} s  {record.throughput:10,.0f} ev/s  "
        f"(wall {record.wall_s:6.2f} s, load {record.load1:.1f}){extra}{check}{note}",
        flush=True,
    )


def print_summary(summary: dict[str, Any], args: argparse.Namespace) -> None:
    def fmt_ms(value: float | None) -> str:
        return "-" if value is None else f"{value:,.0f}"

    for backend, entry in summary.items():
        print()
        print(
            f"== {backend}: {args.files} files x {args.events:,} events = "
            f"{args.files * args.events:,} events, median of {args.repeats} =="
        )
        header = (
            f"{'sink':15} {'events/s':>12} {'vs at_least_once':>17} {'vs noop':>8} "
            f"{'span s':>8} {'batch-only ev/s':>16} {'wall s':>7}  output  runs (k ev/s)"
        )
        print(header)
        print("-" * len(header))
        for variant in ("exactly_once", "idempotent", "at_least_once", "noop"):
            figures = entry["variants"].get(variant)
            if figures is None:
                print(f"{variant:15} {'FAILED':>12}")
                continue
            vs_alo = figures.get("vs_at_least_once")
            vs_noop = figures.get("vs_noop")
            correct = {None: "-", True: "ok", False: "WRONG"}[figures["correct"]]
            print(
                f"{variant:15} {figures['throughput_eps']:12,.0f} "
                f"{'-' if vs_alo is None else f'{vs_alo:.3f}':>17} "
                f"{'-' if vs_noop is None else f'{vs_noop:.3f}':>8} "
                f"{figures['span_s']:8.2f} {figures['batch_throughput_eps']:16,.0f} "
                f"{figures['wall_s']:7.2f}  {correct:6}  "
                + " ".join(f"{x / 1000:.1f}" for x in figures["runs_eps"])
            )
        delay = entry["exactly_once_visibility_delay_ms"]
        print(
            f"exactly_once batch end -> Delta visible: p50 {fmt_ms(delay['p50'])} ms, "
            f"p95 {fmt_ms(delay['p95'])} ms, max {fmt_ms(delay['max'])} ms "
            f"({delay['samples']} commit markers; RunResult.visibility_delays_ms: "
            f"p50 {fmt_ms(delay['run_result_p50'])}, p95 {fmt_ms(delay['run_result_p95'])}, "
            f"{delay['run_result_samples']} samples)"
        )
        target = entry.get("target")
        if target is None:
            print("target exactly_once >= 0.9 x at_least_once: NOT MEASURED (a run failed)")
        else:
            verdict = "PASS" if target["pass"] else "FAIL"
            paired = ", ".join(f"{x:.3f}" for x in target["per_repeat_ratios"])
            print(
                f"target exactly_once >= {TARGET_RATIO} x at_least_once: "
                f"{target['exactly_once_vs_at_least_once']:.3f} -> {verdict}  "
                f"(per-repeat ratios of adjacent runs: {paired})"
            )


# -- main -------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--events", type=int, default=50_000, help="events per input file")
    parser.add_argument("--files", type=int, default=20, help="input files (= micro-batches)")
    parser.add_argument("--backends", default="local,s3", help="comma list of: local, s3")
    parser.add_argument("--repeats", type=int, default=2, help="measured runs per variant")
    parser.add_argument(
        "--warmup-files", type=int, default=3, help="files in each warm-up run (0: no warm-up)"
    )
    parser.add_argument("--no-check", action="store_true", help="skip the output check")
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temp directory")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    args.backend_list = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = [b for b in args.backend_list if b not in ("local", "s3")]
    if unknown or not args.backend_list:
        parser.error(f"--backends: unknown {unknown}; use local and/or s3")
    if args.files < 1 or args.events < 1 or args.repeats < 1 or args.warmup_files < 0:
        parser.error("--files, --events and --repeats must be >= 1, --warmup-files >= 0")
    return args


class Bench:
    """One invocation: the input, every run's record, and the failures."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        workdir = args.workdir or Path(tempfile.mkdtemp(prefix="sk-bench-"))
        self.workdir = workdir.resolve()
        self.events_dir = self.workdir / "events"
        self.warmup_dir = self.workdir / "warmup-events"
        self.reference: dict[str, Any] | None = None
        self.records: list[RunRecord] = []
        self.failures: list[dict[str, str]] = []
        self.backend_info: dict[str, Any] = {}

    def prepare_input(self) -> None:
        from jobs.keyed_totals.sample_events import expected_results, write_event_files

        args = self.args
        self.workdir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.events_dir, ignore_errors=True)
        shutil.rmtree(self.warmup_dir, ignore_errors=True)
        paths = write_event_files(self.events_dir, files=args.files, events_per_file=args.events)
        if args.warmup_files:
            write_event_files(
                self.warmup_dir, files=args.warmup_files, events_per_file=args.events, seed=11
            )
        if not args.no_check:
            totals, changes = expected_results(paths)
            self.reference = {"totals": totals, "changes": changes}
        print(
            f"input: {args.files} files x {args.events:,} events = "
            f"{args.files * args.events:,} events (maxFilesPerTrigger=1: one micro-batch per "
            f"file), master local[2], 2 shuffle partitions, Trigger.AvailableNow; "
            f"workdir {self.workdir}",
            flush=True,
        )

    def run_backend(self, name: str, first: bool) -> None:
        args = self.args
        print(f"\n-- backend {name} --", flush=True)
        try:
            with Backend(name, self.workdir) as backend:
                if backend.server is not None:
                    print(
                        f"  SeaweedFS S3 at {backend.server.endpoint_url} "
                        f"(ready in {backend.start_seconds:.1f} s)",
                        flush=True,
                    )
                    self.backend_info[name] = {"endpoint": backend.server.endpoint_url}
                if args.warmup_files and first:
                    # JIT warm-up of the Spark side (JSON scan, aggregation, state store),
                    # which every variant shares: one noop pass over the full input.
                    self.run_one(backend, "noop", -1, full_input=True)
                if args.warmup_files:
                    for variant in VARIANTS:
                        self.run_one(backend, variant, -1)
                for repeat in range(args.repeats):
                    order = VARIANTS if repeat % 2 == 0 else tuple(reversed(VARIANTS))
                    for variant in order:
                        self.run_one(backend, variant, repeat)
        except Exception as error:  # noqa: BLE001 - e.g. SeaweedFS did not start
            self._failed(name, "*", "*", error)
            print(f"  backend {name} FAILED: {type(error).__name__}: {error}", flush=True)

    def run_one(
        self, backend: Backend, variant: str, repeat: int, full_input: bool = False
    ) -> None:
        """One run; repeat -1 is a warm-up (over the small input unless full_input)."""
        args = self.args
        tag = "w" if repeat < 0 else f"r{repeat}"
        run_id = f"{backend.name}-{variant}-{tag}-{uuid.uuid4().hex[:6]}"
        checkpoint = self.workdir / "checkpoints" / run_id
        small = repeat < 0 and not full_input
        source = self.warmup_dir if small else self.events_dir
        events = (args.warmup_files if small else args.files) * args.events
        root = backend.root(run_id)
        load_at_start = os.getloadavg()[0]
        try:
            if variant == "noop":
                record = run_noop(
                    backend=backend.name,
                    repeat=repeat,
                    checkpoint=checkpoint,
                    events_dir=source,
                    events=events,
                )
            else:
                record = run_sink_mode(
                    variant,
                    backend=backend.name,
                    repeat=repeat,
                    root=root,
                    checkpoint=checkpoint,
                    events_dir=source,
                    events=events,
                    reference=None if repeat < 0 else self.reference,
                )
        except Exception as error:  # noqa: BLE001 - reported, the other variants still run
            self._failed(backend.name, variant, str(repeat), error)
            print(f"  {backend.name:5} {variant:13} FAILED: {type(error).__name__}: {error}")
            return
        finally:
            shutil.rmtree(checkpoint, ignore_errors=True)
            if variant != "noop":
                try:
                    backend.discard(root)
                except Exception as error:  # noqa: BLE001
                    print(f"  (could not clean {root}: {error})", flush=True)
        record.load1 = round(load_at_start, 2)
        self.records.append(record)
        print_run(record)

    def _failed(self, backend: str, variant: str, repeat: str, error: BaseException) -> None:
        traceback.print_exc()
        detail = f"{type(error).__name__}: {error}"
        self.failures.append(
            {"backend": backend, "variant": variant, "repeat": repeat, "error": detail}
        )

    def figures(self, machine: dict[str, Any], summary: dict[str, Any], elapsed: float) -> dict:
        args = self.args
        return {
            "benchmark": "sink_throughput",
            "job": "keyed-totals",
            "machine": machine,
            "config": {
                "files": args.files,
                "events_per_file": args.events,
                "events": args.files * args.events,
                "repeats": args.repeats,
                "warmup_files": args.warmup_files,
                "master": "local[2]",
                "shuffle_partitions": 2,
                "backends": args.backend_list,
                "method": "events / (mtime(offsets/0) -> last output visible in Delta)",
            },
            "backends": self.backend_info,
            "results": summary,
            "runs": [
                {k: v for k, v in asdict(r).items() if k not in ("delays_ms", "result_delays_ms")}
                | {"delays_ms": [round(d, 1) for d in r.delays_ms]}
                for r in self.records
            ],
            "failures": self.failures,
            "elapsed_s": round(elapsed, 1),
        }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    machine = machine_info()
    print(
        f"machine: {machine['nproc']} CPUs ({machine['cpu_model']}), {machine['ram_gib']} GiB "
        f"RAM, load avg {machine['loadavg_at_start']}; python {machine['python']}, "
        f"pyspark {machine['pyspark']}, deltalake {machine['deltalake']}"
    )
    bench = Bench(args)
    try:
        bench.prepare_input()
        for index, name in enumerate(args.backend_list):
            bench.run_backend(name, first=index == 0)
    finally:
        if not args.keep:
            shutil.rmtree(bench.workdir, ignore_errors=True)
    summary = summarize(bench.records, args.backend_list)
    print_summary(summary, args)
    elapsed = time.monotonic() - started
    load = [round(x, 2) for x in os.getloadavg()]
    print(f"\ntotal benchmark time {elapsed:.0f} s; load avg at end {load}")
    if bench.failures:
        print(f"{len(bench.failures)} failure(s):")
        for failure in bench.failures:
            print(f"  {failure}")
    print(json.dumps(bench.figures(machine, summary, elapsed), default=float), flush=True)
    return 1 if bench.failures else 0


if __name__ == "__main__":
    sys.exit(main())
