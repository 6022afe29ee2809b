"""`streamkeeper` command line: run jobs, recover them, read their control plane, send
them commands (savepoint, stop, cancel) and manage their savepoints.

Exit codes: 0 ok; 1 a run failed, a command failed or got no answer in time, or
`status --check` found the job unhealthy (DEGRADED, FAILING, FAILED); 2 bad input (a
spec, an option, an unknown job, root, checkpoint or savepoint, a checkpoint or savepoint
that cannot be restored into this job).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer
from typer.core import TyperGroup

from streamkeeper.errors import (
    CheckpointRestoreError,
    CommandError,
    SavepointError,
    StreamkeeperError,
    UnsafePathError,
    UnusableRootError,
)
from streamkeeper.spec import UID_PATTERN, JobSpec, load_spec

if TYPE_CHECKING:
    from streamkeeper.client import StreamkeeperClient
    from streamkeeper.lineage.driver_beat import DriverBeat

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
    from_savepoint: Annotated[
        str | None,
        typer.Option(
            "--from-savepoint",
            help="Restore a savepoint (its id, or the path/URI of a copied savepoint folder) "
            "into the empty checkpoint directory, then run from it.",
        ),
    ] = None,
    allow_rewind: Annotated[
        bool,
        typer.Option(
            "--allow-rewind",
            help="Restore a savepoint or checkpoint older than where the lineage stands: the "
            "batches after it run again (their committed output stays: written twice).",
        ),
    ] = False,
    allow_fresh_start: Annotated[
        bool,
        typer.Option(
            "--allow-fresh-start",
            help="Start a new query on an empty checkpoint directory although the lineage "
            "has committed: its sources start over (refused otherwise).",
        ),
    ] = False,
    uid_mapping: Annotated[
        list[str] | None,
        typer.Option("--uid-mapping", help="Canonical savepoint: old_uid=new_uid (repeatable)."),
    ] = None,
    allow_non_restored_state: Annotated[
        bool,
        typer.Option(
            "--allow-non-restored-state",
            help="Canonical savepoint: skip state of operators the job no longer has.",
        ),
    ] = False,
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
    mapping = _uid_mapping(uid_mapping)
    spec = _load(spec_path, _overrides(root, checkpoint_dir, set_))
    if detach:
        _detach(spec)
        return
    from streamkeeper.observability.progress import RunProgress
    from streamkeeper.runtime.runner import RunOptions, main_guard, run_job

    main_guard()
    with _driver_beat(spec, run_token) as beat, RunProgress() as progress:
        options = RunOptions(
            master=master,
            available_now=available_now,
            takeover=takeover,
            spec_dir=spec_path.parent,
            from_checkpoint=from_checkpoint,
            progress=progress if progress.enabled else None,
            run_token=run_token,
            from_savepoint=from_savepoint,
            allow_rewind=allow_rewind,
            allow_fresh_start=allow_fresh_start,
            uid_mapping=mapping,
            allow_non_restored_state=allow_non_restored_state,
            on_heartbeat=None if beat is None else beat.hand_over,
        )
        try:
            result = run_job(spec, options)
        except (
            SavepointError,
            CheckpointRestoreError,
            UnusableRootError,
            UnsafePathError,
        ) as error:
            _fail(beat, error, EXIT_BAD_INPUT)
        except StreamkeeperError as error:
            _fail(beat, error, EXIT_FAILED)
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
                "savepoint_id": result.savepoint_id,
            }
        )
    )


@contextmanager
def _driver_beat(spec: JobSpec, run_token: str | None) -> Iterator[DriverBeat | None]:
    """Beat `drivers/{token}.json` while this driver runs (lineage/driver_beat.py): how a
    starter on any host knows it is alive before, and ended after, its heartbeat."""
    if run_token is None:
        yield None
        return
    from streamkeeper.lineage.driver_beat import DriverBeat
    from streamkeeper.storage import Location, S3Settings, resolve_root

    try:
        store = Location(resolve_root(spec.storage.root), S3Settings.from_env(spec.storage)).store()
    except StreamkeeperError:
        yield None  # the run refuses the root itself, with the error a user can act on
        return
    beat = DriverBeat(store, run_token, spec.name).start()
    try:
        yield beat
    except typer.Exit as done:
        beat.close(int(done.exit_code or 0), beat.error)
        raise
    except BaseException as error:  # noqa: BLE001 - recorded, then raised as it was
        beat.close(EXIT_FAILED, f"{type(error).__name__}: {error}")
        raise
    beat.close(0)


def _fail(beat: DriverBeat | None, error: StreamkeeperError, code: int) -> NoReturn:
    """Print a run's error, say it in the driver's beat, and exit with `code`."""
    typer.echo(f"error: {error}", err=True)
    if beat is not None:
        beat.error = f"{type(error).__name__}: {error}"
    raise typer.Exit(code) from None


def _uid_mapping(items: list[str] | None) -> dict[str, str]:
    mapping: dict[str, str] = {}
    for item in items or []:
        old, sep, new = (part.strip() for part in item.partition("="))
        if not sep or not old or not new:
            raise typer.BadParameter(
                f"{item!r}: expected old_uid=new_uid, e.g. totals-0=totals",
                param_hint="--uid-mapping",
            )
        for uid in (old, new):
            if not re.match(UID_PATTERN, uid):
                raise typer.BadParameter(
                    f"{item!r}: uid {uid!r} must be 1 to 64 characters of a-z, 0-9, '_' and "
                    "'-', e.g. totals-0=totals",
                    param_hint="--uid-mapping",
                )
        if old in mapping:
            raise typer.BadParameter(
                f"uid {old!r} is mapped more than once ({mapping[old]!r} and {new!r}); its "
                "state goes to one operator: give one --uid-mapping per uid",
                param_hint="--uid-mapping",
            )
        mapping[old] = new
    return mapping


def _detach(spec: JobSpec, log_name: str | None = None) -> None:
    """Re-run this command without --detach in a new session; the child owns the lease."""
    log_dir = Path(".streamkeeper/logs")
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{log_name or spec.name}.log"
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
    from streamkeeper.client import StreamkeeperClient

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
    if not client.location.is_s3 and not Path(client.root).is_dir():
        typer.echo(
            f"error: root {client.root!r} does not exist; give the spec's storage.root with --root",
            err=True,
        )
        raise typer.Exit(EXIT_BAD_INPUT)
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


# -- commands to a running job -----------------------------------------------------------

FormatOpt = Annotated[
    str, typer.Option("--format", help="Savepoint format: native (Spark's files) or canonical.")
]
SelfContainedOpt = Annotated[
    bool,
    typer.Option("--self-contained", help="Copy the savepoint's files into its folder (portable)."),
]
TimeoutOpt = Annotated[float, typer.Option("--timeout", min=1, help="Seconds to wait for it.")]
CommandIdOpt = Annotated[
    str | None,
    typer.Option("--id", help="The command's id (a retry with the same id runs once)."),
]


def _check_format(value: str) -> str:
    if value not in ("native", "canonical"):
        raise typer.BadParameter(f"{value!r}: expected native or canonical", param_hint="--format")
    return value


def _require_running(client: StreamkeeperClient, job: str) -> None:
    """A command is executed by a running job only: refuse to queue one for nobody."""
    from streamkeeper.observability.status import RUNNER_LIVE

    report = _read(lambda: client.status(job))
    runner = report.runner
    if runner is None or runner.state not in RUNNER_LIVE or report.state == "FAILED":
        typer.echo(
            f"error: job {job!r} is not running ({report.state}: {report.reason}); a command "
            f"is executed by its running job: start it first (`streamkeeper run`)",
            err=True,
        )
        raise typer.Exit(EXIT_BAD_INPUT)


def _send(client: StreamkeeperClient, job: str, kind: str, **options: Any) -> Any:
    _require_running(client, job)
    try:
        return client.send_command(job, kind, **options)
    except StreamkeeperError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None


def _report_result(
    client: StreamkeeperClient, job: str, command_id: str, timeout: float, as_json: bool
) -> None:
    """Wait for the result, print it; exit 1 if it failed or never came."""
    try:
        result = client.wait_for_result(job, command_id, timeout=timeout)
    except CommandError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(EXIT_FAILED) from None
    _print_result(job, result, as_json)


def _print_result(job: str, result: Any, as_json: bool) -> None:
    from streamkeeper.observability.report import print_table
    from streamkeeper.observability.savepoint_report import command_result_table

    if as_json:
        _print_json(result.to_json())
    else:
        print_table(command_result_table(job, result))
    if not result.ok:
        raise typer.Exit(EXIT_FAILED)


def _report_sent(job: str, command: Any, as_json: bool) -> None:
    if as_json:
        _print_json(command.to_json())
    else:
        typer.echo(
            f"sent {command.kind} command {command.id} to {job}; read its result with "
            f"`streamkeeper result {job} {command.id}`"
        )


@app.command()
def savepoint(
    job: JobArg,
    root: DataRootOpt = ".streamkeeper/data",
    format: FormatOpt = "native",
    self_contained: SelfContainedOpt = False,
    wait: Annotated[bool, typer.Option("--wait", help="Wait for the result.")] = False,
    timeout: TimeoutOpt = 600.0,
    command_id: CommandIdOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Take a savepoint of a running job at its next batch boundary; the job keeps running."""
    _check_format(format)
    client = _client(root)
    sent = _send(
        client,
        job,
        "savepoint",
        format=format,
        self_contained=self_contained,
        command_id=command_id,
    )
    if wait:
        _report_result(client, job, sent.id, timeout, as_json)
    else:
        _report_sent(job, sent, as_json)


@app.command()
def stop(
    job: JobArg,
    root: DataRootOpt = ".streamkeeper/data",
    cancel: Annotated[
        bool, typer.Option("--cancel", help="Stop now, without a savepoint or a drain.")
    ] = False,
    no_savepoint: Annotated[
        bool, typer.Option("--no-savepoint", help="Stop at a batch boundary, no savepoint.")
    ] = False,
    format: FormatOpt = "native",
    self_contained: SelfContainedOpt = False,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Wait for the result.")] = True,
    timeout: TimeoutOpt = 600.0,
    command_id: CommandIdOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Stop a running job: drain, savepoint, stop (default); or cancel it (--cancel)."""
    _check_format(format)
    client = _client(root)
    if cancel:
        sent = _send(client, job, "cancel", command_id=command_id)
    else:
        sent = _send(
            client,
            job,
            "stop",
            format=format,
            self_contained=self_contained,
            savepoint=not no_savepoint,
            command_id=command_id,
        )
    if wait:
        _report_result(client, job, sent.id, timeout, as_json)
    else:
        _report_sent(job, sent, as_json)


@app.command()
def result(
    job: JobArg,
    command_id: Annotated[str, typer.Argument(help="The command's id.")],
    root: DataRootOpt = ".streamkeeper/data",
    wait: Annotated[bool, typer.Option("--wait", help="Wait for it.")] = False,
    timeout: TimeoutOpt = 600.0,
    as_json: JsonOpt = False,
) -> None:
    """The result of a command sent earlier (exit 1 if it failed or is not answered)."""
    from streamkeeper.lineage.commands import check_command_id

    client = _client(root)
    _read(lambda: (client.job_record(job), check_command_id(command_id)))
    if wait:
        _report_result(client, job, command_id, timeout, as_json)
        return
    found = _read(lambda: client.command_result(job, command_id, acknowledge=True))
    if found is None:
        typer.echo(f"command {command_id} of {job} has no result yet (add --wait)", err=True)
        raise typer.Exit(EXIT_FAILED)
    _print_result(job, found, as_json)


# -- savepoints ----------------------------------------------------------------------------


class _ListByDefault(TyperGroup):
    """`streamkeeper savepoints JOB` is `streamkeeper savepoints list JOB`."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["list", *args]
        return super().parse_args(ctx, args)


savepoints_app = typer.Typer(
    cls=_ListByDefault,
    no_args_is_help=True,
    help="A job's savepoints: list (default), describe, delete, protect, unprotect.",
)
app.add_typer(savepoints_app, name="savepoints")
SavepointArg = Annotated[str, typer.Argument(help="A savepoint id (sp-...).")]


@savepoints_app.command("list")
def savepoints_list(
    job: JobArg, root: DataRootOpt = ".streamkeeper/data", as_json: JsonOpt = False
) -> None:
    """The job lineage's savepoints, oldest first."""
    from streamkeeper.observability.report import print_table
    from streamkeeper.observability.savepoint_report import savepoints_table

    client = _client(root)
    entries = _read(lambda: client.savepoints(job))
    if as_json:
        _print_json({"job": job, "savepoints": [e.to_json() for e in entries]})
        return
    print_table(savepoints_table(job, entries))


@savepoints_app.command("describe")
def savepoints_describe(
    savepoint_id: SavepointArg, root: DataRootOpt = ".streamkeeper/data", as_json: JsonOpt = False
) -> None:
    """A savepoint's entry and manifest, checked whole (exit 1 if it is broken)."""
    from streamkeeper.observability.report import print_table
    from streamkeeper.observability.savepoint_report import savepoint_table

    client = _client(root)
    description = _read(lambda: client.describe_savepoint(savepoint_id)).to_json()
    if as_json:
        _print_json(description)
    else:
        print_table(savepoint_table(description))
    if description["broken"]:
        raise typer.Exit(EXIT_FAILED)


@savepoints_app.command("delete")
def savepoints_delete(savepoint_id: SavepointArg, root: DataRootOpt = ".streamkeeper/data") -> None:
    """Dispose of a savepoint's data, then forget it (refused if protected, held or in use)."""
    client = _client(root)
    _read(lambda: client.delete_savepoint(savepoint_id))
    typer.echo(f"savepoint {savepoint_id} deleted")


@savepoints_app.command("protect")
def savepoints_protect(
    savepoint_id: SavepointArg,
    reason: Annotated[
        str, typer.Option("--reason", help="Why it is kept, e.g. a rollback target.")
    ],
    root: DataRootOpt = ".streamkeeper/data",
) -> None:
    """Keep a savepoint from retention and deletion."""
    client = _client(root)
    _read(lambda: client.protect_savepoint(savepoint_id, reason))
    typer.echo(f"savepoint {savepoint_id} protected: {reason}")


@savepoints_app.command("unprotect")
def savepoints_unprotect(
    savepoint_id: SavepointArg, root: DataRootOpt = ".streamkeeper/data"
) -> None:
    """Let retention and `delete` remove a savepoint again."""
    client = _client(root)
    _read(lambda: client.unprotect_savepoint(savepoint_id))
    typer.echo(f"savepoint {savepoint_id} unprotected")


@app.command()
def state(
    savepoint_id: SavepointArg,
    root: DataRootOpt = ".streamkeeper/data",
    uid: Annotated[str | None, typer.Option("--uid", help="Only this operator uid.")] = None,
    key: Annotated[str | None, typer.Option("--key", help="Only this key's rows.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="Rows per operator.")] = 20,
    as_json: JsonOpt = False,
) -> None:
    """Rows of a savepoint's state (canonical: Delta tables; native: Spark's state reader)."""
    from streamkeeper.observability.report import print_table
    from streamkeeper.observability.savepoint_report import state_table
    from streamkeeper.snapshots.savepoint_state import read_state

    client = _client(root)
    found = _read(lambda: read_state(client.location, savepoint_id, uid=uid, key=key, limit=limit))
    if as_json:
        _print_json(
            [{"uid": s.uid, "rows": s.rows} for s in found],
        )
        return
    for rows in found:
        print_table(state_table(f"state of {rows.uid} in {savepoint_id}", rows.rows))


@app.command("upgrade-green")
def upgrade_green(
    spec_path: SpecArg,
    upgrade_id: Annotated[str, typer.Option("--upgrade-id", help="The upgrade (its record).")],
    root: RootOpt = None,
    checkpoint_dir: CheckpointOpt = None,
    set_: SetOpt = None,
    master: Annotated[str | None, typer.Option(help="Spark master.")] = None,
    run_token: Annotated[
        str | None, typer.Option("--run-token", help="Recorded in green's heartbeats.")
    ] = None,
    detach: Annotated[
        bool, typer.Option("--detach", help="Run in the background; print the pid and log file.")
    ] = False,
) -> None:
    """Run an upgrade's green side: its shadow run, then the handover when it is asked for.

    Started by the upgrade DAG (streamkeeper_airflow) after it created the upgrade record
    and took blue's savepoint; see src/streamkeeper/upgrade/UPGRADE.md.
    """
    from streamkeeper.upgrade.shadow import check_upgrade_id

    _read(lambda: check_upgrade_id(upgrade_id))
    spec = _load(spec_path, _overrides(root, checkpoint_dir, set_))
    if detach:
        _detach(spec, log_name=f"{spec.name}.{upgrade_id}")
        return
    from streamkeeper.runtime.runner import main_guard
    from streamkeeper.upgrade.green import GreenOptions, run_green

    main_guard()
    options = GreenOptions(upgrade_id, spec_path.parent, run_token=run_token, master=master)
    # Green beats for its whole life: it runs as the shadow job before it runs as the job,
    # and the handover task follows it by this beat, not by either heartbeat's host.
    with _driver_beat(spec, run_token) as beat:
        try:
            result = run_green(spec, options)
        except StreamkeeperError as error:
            _fail(beat, error, EXIT_FAILED)
    live = None if result is None else {"batches": result.batches, "seq": result.last_committed_seq}
    typer.echo(json.dumps({"job": spec.name, "upgrade": upgrade_id, "live": live}))


@app.command()
def upgrades(
    job: JobArg, root: DataRootOpt = ".streamkeeper/data", as_json: JsonOpt = False
) -> None:
    """A job's blue-green upgrades: phase, savepoints, validation, handover gap."""
    from streamkeeper.upgrade.record import UpgradeRecords

    client = _client(root)
    _read(lambda: client.job_record(job))  # an unknown job (or a path) is refused
    client_records = UpgradeRecords(client.store, job)
    found = [r.to_json() for r in _read(client_records.list)]
    if as_json:
        _print_json(found)
        return
    for record in found:
        gap = (record.get("handover") or {}).get("gap_s")
        line = f"{record['id']}  {record['phase']:<18} green={record['green'].get('spec_path')}"
        if gap is not None:
            line += f"  gap={gap:.2f}s"
        if record.get("reason"):
            line += f"  ({record['reason']})"
        typer.echo(line)


@app.command("driver-archive")
def driver_archive(
    path: Annotated[Path, typer.Argument(help="Where to write the archive (e.g. .jsa).")],
) -> None:
    """Make a class-data sharing archive for this host's drivers (Spark's classes mapped at
    start, not loaded); name it in a spec's spark.class_data_archive. Make it again after
    upgrading Java or pyspark: a JVM ignores an archive that does not match it."""
    from streamkeeper.runtime.class_data import create_archive

    try:
        size = create_archive(path)
    except StreamkeeperError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(EXIT_FAILED) from None
    typer.echo(json.dumps({"archive": str(path.expanduser().absolute()), "bytes": size}))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
