"""The quickstart: sample events in, the sample job end to end, output locations out.

Run by `infra/quickstart.sh` (which sets up the environment first). It ends with a short
summary: what ran, where the tables are, and the CLI commands to look at them
(`--json`: the same as JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from streamkeeper.observability.progress import RunProgress
from streamkeeper.reader import read_table_rows
from streamkeeper.runtime.runner import RunOptions, main_guard, run_job
from streamkeeper.spec import load_spec

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the sample job's event generator lives in jobs/
SAMPLE_SPEC = REPO / "jobs" / "keyed_totals" / "job.yaml"


def run_demo(workdir: Path, *, files: int, events_per_file: int, as_json: bool = False) -> None:
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
    with RunProgress() as progress:  # on a terminal only
        listener = progress if progress.enabled else None
        options = RunOptions(available_now=True, spec_dir=spec_path.parent, progress=listener)
        result = run_job(spec, options)
        progress.finish(result.batches)
    totals, _ = expected_results(paths)
    rows = read_table_rows(result.tables["totals"])
    got = {r["key"]: (r["events"], r["total"]) for r in rows}
    summary = {
        "job": spec.name,
        "batches_this_run": result.batches,
        "last_committed_seq": result.last_committed_seq,
        "input_files": len(paths),
        "keys": len(got),
        "totals_match_reference": got == totals,
        "root": str(workdir / "data"),
        "tables": result.tables,
        "checkpoint": str(workdir / "checkpoint"),
    }
    print(json.dumps(summary, indent=2) if as_json else human_summary(summary))
    if got != totals:
        raise SystemExit("demo output does not match the reference result")


def _shown(path: str) -> str:
    """A path as short as it can be said from here."""
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return path


def _command() -> str:
    """How to call the CLI from here: the venv's script if the venv is not on PATH."""
    script = Path(sys.executable).parent / "streamkeeper"
    if shutil.which("streamkeeper") == str(script) or not script.exists():
        return "streamkeeper"
    return _shown(str(script))


def human_summary(summary: dict[str, Any]) -> str:
    """What ran, where its output is, and how to look at it with the CLI."""
    job, root, cli = summary["job"], _shown(summary["root"]), _command()
    check = "matches" if summary["totals_match_reference"] else "DOES NOT match"
    lines = [
        f"Ran job {job!r} (jobs/keyed_totals/job.yaml) on local Spark: "
        f"{summary['batches_this_run']} new checkpoints this run, over "
        f"{summary['input_files']} event files in all; last commit seq "
        f"{summary['last_committed_seq']}.",
        f"Its output ({summary['keys']} keys) {check} the reference result.",
        "",
        "Delta tables (read them with any Delta reader, e.g. deltalake.DeltaTable):",
        *(f"  {name:<8} {_shown(uri)}" for name, uri in summary["tables"].items()),
        f"Spark checkpoint: {_shown(summary['checkpoint'])}",
        "",
        "Look at the job:",
        f"  {cli} status {job} --root {root}",
        f"  {cli} checkpoints {job} --root {root} --last 10",
        f"  {cli} jobs --root {root}",
        "(add --json to any of them for machine-readable output)",
        "",
        "Run the quickstart again: it adds new events and resumes from the checkpoint.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path(".streamkeeper/demo"))
    parser.add_argument("--files", type=int, default=5, help="event files (one batch each)")
    parser.add_argument("--events-per-file", type=int, default=20_000)
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_args()
    run_demo(
        args.workdir.resolve(),
        files=args.files,
        events_per_file=args.events_per_file,
        as_json=args.json,
    )


if __name__ == "__main__":
    main()
