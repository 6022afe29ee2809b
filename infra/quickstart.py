"""The quickstart: sample events in, the sample job end to end, output locations out.

Run by `infra/quickstart.sh` (which sets up the environment first).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from streamkeeper.reader import read_table_rows
from streamkeeper.runtime.runner import RunOptions, main_guard, run_job
from streamkeeper.spec import load_spec

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the sample job's event generator lives in jobs/
SAMPLE_SPEC = REPO / "jobs" / "keyed_totals" / "job.yaml"


def run_demo(workdir: Path, *, files: int, events_per_file: int) -> None:
    """Run the sample job over freshly generated events and check its output."""
    from jobs.keyed_totals.sample_events import expected_results, write_event_files

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path(".streamkeeper/demo"))
    parser.add_argument("--files", type=int, default=5, help="event files (one batch each)")
    parser.add_argument("--events-per-file", type=int, default=20_000)
    args = parser.parse_args()
    run_demo(args.workdir.resolve(), files=args.files, events_per_file=args.events_per_file)


if __name__ == "__main__":
    main()
