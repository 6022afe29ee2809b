"""`streamkeeper` command line: run jobs, recover them, read their control plane."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from streamkeeper.errors import StreamkeeperError
from streamkeeper.spec import JobSpec, load_spec

app = typer.Typer(
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False, help=__doc__
)

SpecArg = Annotated[Path, typer.Argument(help="The job's YAML spec file.")]
RootOpt = Annotated[
    str | None, typer.Option("--root", help="Storage root URI (local path or s3://bucket/prefix).")
]
CheckpointOpt = Annotated[
    str | None, typer.Option("--checkpoint-dir", help="Spark checkpoint directory (local path).")
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a spec field: dotted.key=value (repeatable)."),
]


def _overrides(
    root: str | None, checkpoint_dir: str | None, sets: list[str] | None
) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    for item in sets or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise typer.BadParameter(f"--set {item!r}: expected dotted.key=value")
        overrides[key] = value
    if root:
        overrides["storage.root"] = root
    if checkpoint_dir:
        overrides["checkpoint.dir"] = checkpoint_dir
    return overrides


def _load(spec_path: Path, overrides: dict[str, Any]) -> JobSpec:
    try:
        return load_spec(spec_path, overrides)
    except StreamkeeperError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None


@app.command()
def run(
    spec_path: SpecArg,
    root: RootOpt = None,
    checkpoint_dir: CheckpointOpt = None,
    set_: SetOpt = None,
    master: Annotated[
        str | None, typer.Option(help="Spark master, e.g. spark://127.0.0.1:7077.")
    ] = None,
    available_now: Annotated[
        bool, typer.Option("--available-now", help="Process what is available, then stop.")
    ] = False,
    takeover: Annotated[
        bool, typer.Option("--takeover", help="Fence a live runner of the same lineage.")
    ] = False,
    detach: Annotated[
        bool, typer.Option("--detach", help="Run in the background; print the pid and log file.")
    ] = False,
    from_checkpoint: Annotated[
        str | None,
        typer.Option(
            "--from-checkpoint",
            help="Restore an externalized checkpoint ('latest' or an id) into the empty "
            "checkpoint directory, then run from it.",
        ),
    ] = None,
) -> None:
    """Run a job's streaming query, resuming from its checkpoint when one exists."""
    if from_checkpoint is not None and not (
        from_checkpoint == "latest" or from_checkpoint.isdigit()
    ):
        raise typer.BadParameter(
            f"{from_checkpoint!r}: expected 'latest' or a checkpoint id (a number)",
            param_hint="--from-checkpoint",
        )
    spec = _load(spec_path, _overrides(root, checkpoint_dir, set_))
    if detach:
        _detach(spec)
        return
    from streamkeeper.runtime.runner import RunOptions, main_guard, run_job

    main_guard()
    options = RunOptions(
        master=master,
        available_now=available_now,
        takeover=takeover,
        spec_dir=spec_path.parent,
        from_checkpoint=from_checkpoint,
    )
    try:
        result = run_job(spec, options)
    except StreamkeeperError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from None
    typer.echo(
        json.dumps(
            {
                "job": spec.name,
                "batches": result.batches,
                "last_committed_seq": result.last_committed_seq,
                "recovered": {
                    "committed": result.recovery.committed,
                    "discarded": result.recovery.discarded,
                    "files_removed": len(result.recovery.files_removed),
                },
                "tables": result.tables,
            }
        )
    )


def _detach(spec: JobSpec) -> None:
    """Re-run this command without --detach in a new session; the child owns the lease."""
    log_dir = Path(".streamkeeper/logs")
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{spec.name}.log"
    argv = [a for a in sys.argv[1:] if a != "--detach"]
    with open(log_path, "ab") as log_file:
        child = subprocess.Popen(
            [sys.executable, "-m", "streamkeeper", *argv],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=os.environ.copy(),
        )
    typer.echo(json.dumps({"job": spec.name, "pid": child.pid, "log": str(log_path.resolve())}))


JobArg = Annotated[str, typer.Argument(help="The job's name.")]
DataRootOpt = Annotated[
    str,
    typer.Option(
        "--root", envvar="STREAMKEEPER_ROOT", help="Storage root URI the job writes below."
    ),
]


def _job_view(job: str, root: str) -> tuple[Any, Any, dict[str, Any] | None]:
    from streamkeeper.lineage.control import ControlPlane
    from streamkeeper.lineage.layout import LineageLayout
    from streamkeeper.observability.history import CheckpointHistory
    from streamkeeper.storage import Location, S3Settings, resolve_root

    location = Location(resolve_root(root), S3Settings.from_env())
    probe_layout = LineageLayout(location, job, job)
    heartbeat = ControlPlane(location.store(), probe_layout).heartbeat()
    lineage = (heartbeat or {}).get("lineage", job)
    layout = LineageLayout(location, lineage, job)
    history = CheckpointHistory(location.child(f"{layout.base}/history"))
    return layout, history, heartbeat


@app.command()
def status(job: JobArg, root: DataRootOpt = ".streamkeeper/data") -> None:
    """Print the job's status (RUNNING, DEGRADED, FAILING, STOPPED, FAILED) and why."""
    from streamkeeper.observability.health import assess
    from streamkeeper.observability.report import print_table, status_table

    _, history, heartbeat = _job_view(job, root)
    beat = heartbeat or {}
    assessed = assess(
        heartbeat,
        history.read(last=20),
        interval=float(beat.get("interval", 1.0)),
        timeout=float(beat.get("timeout", 600.0)),
    )
    print_table(status_table(job, assessed, heartbeat))


@app.command()
def checkpoints(
    job: JobArg,
    root: DataRootOpt = ".streamkeeper/data",
    last: Annotated[int, typer.Option(help="How many of the latest checkpoints.")] = 20,
) -> None:
    """Print the job's checkpoint history: duration, rows, rates, state, upload, visibility."""
    from streamkeeper.observability.report import checkpoints_table, print_table

    _, history, _ = _job_view(job, root)
    print_table(checkpoints_table(job, history.read(last=last)))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
