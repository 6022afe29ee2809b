"""The quickstart: sample events in, the sample job end to end, output locations out."""

from __future__ import annotations

import json
import os
from pathlib import Path

from streamkeeper.reader import read_table_rows
from streamkeeper.runner import RunOptions, main_guard, run_job
from streamkeeper.sample_events import expected_results, write_event_files
from streamkeeper.spec import load_spec

SAMPLE_SPEC = Path(__file__).resolve().parents[2] / "jobs" / "keyed_totals" / "job.yaml"


def run_demo(workdir: Path, *, files: int, events_per_file: int) -> None:
    """Run the sample job over freshly generated events and check its output."""
    main_guard()
    events = workdir / "events"
    existing = sorted(events.glob("events-*.json")) if events.exists() else []
    paths = existing + write_event_files(
        events, files=files, events_per_file=events_per_file, first_file=len(existing)
    )
    spec_path = Path(os.environ.get("STREAMKEEPER_DEMO_SPEC", SAMPLE_SPEC))
    spec = load_spec(
        spec_path,
        {
            "source.path": str(events),
            "storage.root": str(workdir / "data"),
            "checkpoint.dir": str(workdir / "checkpoint"),
        },
    )
    result = run_job(spec, RunOptions(available_now=True, spec_dir=spec_path.parent))
    totals, _ = expected_results(paths)
    rows = read_table_rows(result.tables["totals"])
    got = {r["key"]: (r["events"], r["total"]) for r in rows}
    print(
        json.dumps(
            {
                "job": spec.name,
                "batches_this_run": result.batches,
                "input_files": len(paths),
                "keys": len(got),
                "totals_match_reference": got == totals,
                "tables": result.tables,
                "checkpoint": str(workdir / "checkpoint"),
            },
            indent=2,
        )
    )
    if got != totals:
        raise SystemExit("demo output does not match the reference result")
