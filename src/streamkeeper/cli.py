"""`streamkeeper` command line: run jobs, recover them, read their control plane.

Exit codes: 0 ok; 1 a run failed, or `status --check` found the job unhealthy (DEGRADED,
FAILING, FAILED); 2 bad input (a spec, an option, an unknown job or root).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from streamkeeper.client import StreamkeeperClient
from streamkeeper.errors import StreamkeeperError
from streamkeeper.spec import JobSpec, load_spec

EXIT_FAILED = 1  # a run failed, or `status --check` found the job unhealthy
EXIT_BAD_INPUT = 2  # a bad spec, option, job name or root
RUN_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")

T = TypeVar("T")

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
        raise typer.Exit(EXIT_BAD_INPUT) from None


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
    run_token: Annotated[
        str | None,
        typer.Option(
            "--run-token",
            help="An id of this start, recorded in the heartbeat and job record (a starter "
            "such as Airflow finds the driver it launched by it).",
        ),
    ] = None,
) -> None:
    """Run a job's streaming query, resuming from its checkpoint when one exists."""
    if run_token is not None and not RUN_TOKEN.fullmatch(run_token):
        raise typer.BadParameter(
            f"{run_token!r}: expected 1-128 letters, digits, '_', '.', ':' or '-'",
            param_hint="--run-token",
        )
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
    from streamkeeper.observability.progress import RunProgress
    from streamkeeper.runtime.runner import RunOptions, main_guard, run_job

    main_guard()
    with RunProgress() as progress:  # drawn on a terminal only
        options = RunOptions(
            master=master,
            available_now=available_now,
            takeover=takeover,
            spec_dir=spec_path.parent,
            from_checkpoint=from_checkpoint,
            progress=progress if progress.enabled else None,
            run_token=run_token,
        )
        try:
            result = run_job(spec, options)
        except StreamkeeperError as error:
            typer.echo(f"error: {error}", err=True)
            raise typer.Exit(EXIT_FAILED) from None
        progress.finish(result.batches)
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


JobArg = Annotated[str, typer.Argument(help="The job's name (its spec's `name`).")]
DataRootOpt = Annotated[
    str,
    typer.Option(
        "--root", envvar="STREAMKEEPER_ROOT", help="Storage root URI the job writes below."
    ),
]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print JSON (field names documented in the README).")
]


def _client(root: str) -> StreamkeeperClient:
    try:
        return StreamkeeperClient(root)
    except StreamkeeperError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None


def _read(read: Callable[[], T]) -> T:
    """Run a control-plane read; a bad job name or root is bad input (exit 2)."""
    try:
        return read()
    except StreamkeeperError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None


def _print_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2))


@app.command()
def jobs(root: DataRootOpt = ".streamkeeper/data", as_json: JsonOpt = False) -> None:
    """List every job below the root with its status."""
    from streamkeeper.observability.report import jobs_table, print_table

    client = _client(root)
    reports = _read(lambda: [client.status(job) for job in client.jobs()])
    if as_json:
        _print_json({"root": client.root, "jobs": [r.to_json() for r in reports]})
        return
    if not reports:
        typer.echo(f"no jobs under {client.root} (check --root: the spec's storage.root)")
        return
    print_table(jobs_table(client.root, reports))


@app.command()
def status(
    job: JobArg,
    root: DataRootOpt = ".streamkeeper/data",
    as_json: JsonOpt = False,
    check: Annotated[
        bool,
        typer.Option("--check", help="Exit 1 if the job is DEGRADED, FAILING or FAILED."),
    ] = False,
) -> None:
    """Where the job's lineage stands, what its runner says, and its health and why."""
    from streamkeeper.observability.report import print_table, status_table

    client = _client(root)
    report = _read(lambda: client.status(job))
    if as_json:
        _print_json(report.to_json())
    else:
        print_table(status_table(report))
    if check and not report.healthy:
        raise typer.Exit(EXIT_FAILED)


@app.command()
def checkpoints(
    job: JobArg,
    root: DataRootOpt = ".streamkeeper/data",
    last: Annotated[int, typer.Option(min=1, help="How many of the latest checkpoints.")] = 20,
    as_json: JsonOpt = False,
) -> None:
    """The job's committed checkpoints: duration, rows, rates, state, upload, visibility."""
    from streamkeeper.observability.report import checkpoints_table, print_table

    client = _client(root)
    rows = _read(lambda: client.history(job, last=last))
    if as_json:
        record = client.job_record(job)
        _print_json(
            {
                "job": job,
                "lineage": record.lineage,
                "checkpoints": [r.to_json() for r in rows],
            }
        )
        return
    print_table(checkpoints_table(job, rows))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
