"""The bad-input corpus: every surface refuses bad input with an error that names the bad
value and the fix, and leaves storage exactly as it was.

One table of named cases over every surface a user or an operator feeds: job spec fields,
CLI arguments, savepoint ids, uid mappings, control-plane commands, the Airflow DAGs'
Params and operators, paths that escape their root, job names with path separators,
corrupt or truncated savepoint manifests, a savepoint from another job and a state schema
that does not fit.

The world: the sample job run for real (Spark, local storage) until it committed two
checkpoints, a native self-contained savepoint taken while it ran, then stopped with a
canonical savepoint. Each case gets its own copy of that storage root in a fresh folder,
may damage it first (`prepare`), then lists every file and folder of the case's folder
(size and sha256: the root, the checkpoint directories, the specs) before and after
feeding the bad input through the real surface (the typer CLI in-process, the client, the
spec loader, the runner, an Airflow DAG's Params or operator). The listing after must equal
the listing before; the only exception is a malformed command picked up by a running job,
which answers it `failed` (its command-log record and result, which the case names).

The cases whose bad input meets the object store (corrupt records and manifests, paths,
unknown ids and jobs) run again on S3 (SeaweedFS): the damaged root is uploaded to a fresh
prefix, and the bucket's listing (size, ETag) must not change either.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import shutil
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from jobs.keyed_totals.sample_events import write_event_files
from streamkeeper.cli import app
from streamkeeper.client import StreamkeeperClient
from streamkeeper.runtime.runner import RunOptions
from streamkeeper.spec import load_spec
from tests.conftest import SAMPLE_SPEC
from tests.support.traffic import BackgroundRun, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.corpus]

JOB = "keyed-totals"
CONN_ID = "sk_corpus"
UNKNOWN_SP = "sp-20990101T000000-deadbeef"  # well formed, never taken


# -- the world: a real run of the sample job with two savepoints ---------------------------


@dataclass(frozen=True)
class World:
    base: Path
    events: Path
    root: Path
    native: str  # a native self-contained savepoint, taken while the job ran
    canonical: str  # the canonical savepoint the job stopped with
    stop_command: str  # the stop command's id (answered and acknowledged)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    base = tmp_path_factory.mktemp("corpus-world")
    events = base / "events"
    write_event_files(events, files=2, events_per_file=50)
    root = base / "data"
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(base)
        spec = load_spec(SAMPLE_SPEC, _settings(events, root, base / "ck"))
        client = StreamkeeperClient(str(root))
        run = BackgroundRun(
            spec, RunOptions(spec_dir=SAMPLE_SPEC.parent, command_poll_interval=0.2)
        )
        run.start()
        wait_for(lambda: _head_seq(client) >= 1, 300, "two committed checkpoints")
        taken = client.send_command(JOB, "savepoint", self_contained=True)
        native = client.wait_for_result(JOB, taken.id, timeout=300)
        stop = client.send_command(JOB, "stop", format="canonical")
        stopped = client.wait_for_result(JOB, stop.id, timeout=300)
        run.finish()
    assert native.ok and stopped.ok, (native, stopped)
    assert native.savepoint_id and stopped.savepoint_id
    yield World(base, events, root, native.savepoint_id, stopped.savepoint_id, stop.id)


def _settings(events: Path, root: Path, checkpoint: Path) -> dict[str, Any]:
    return {
        "source.path": str(events),
        "storage.root": str(root),
        "checkpoint.dir": str(checkpoint),
        "checkpoint.interval": "200ms",
        "spark.master": "local[2]",
        "spark.shuffle_partitions": 2,
    }


def _head_seq(client: StreamkeeperClient) -> int:
    try:
        head = client.status(JOB).head
    except Exception:  # noqa: BLE001 - not started yet
        return -1
    return -1 if head is None else head.seq


# -- one case's folder --------------------------------------------------------------------


@dataclass
class Ctx:
    """A case's folder: a copy of the world's root, and what the case set up in it."""

    world: World
    base: Path
    monkeypatch: pytest.MonkeyPatch
    names: dict[str, str] = field(default_factory=dict)

    @property
    def root(self) -> Path:
        return self.base / "data"

    def fmt(self, text: str) -> str:
        return text.format(**self.names)

    def savepoint_folder(self, savepoint_id: str) -> Path:
        return self.root / "lineages" / JOB / "savepoints" / savepoint_id

    def manifest(self, savepoint_id: str) -> Path:
        return self.savepoint_folder(savepoint_id) / "manifest.json"


def listing(folder: Path) -> dict[str, tuple[int, str]]:
    """Every file (size, sha256) and folder below `folder`: what 'nothing changed' means."""
    found: dict[str, tuple[int, str]] = {}
    for path in sorted(folder.rglob("*")):
        name = path.relative_to(folder).as_posix()
        if path.is_dir() and not path.is_symlink():
            found[name + "/"] = (-1, "folder")
        else:
            found[name] = (path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest())
    return found


@dataclass(frozen=True)
class Refusal:
    """What a surface answered: `kind` (an exit code or an error type) and its message."""

    kind: str
    message: str


Feed = Callable[[Ctx], Refusal]


def _outcome(call: Callable[[], Any]) -> Refusal:
    try:
        value = call()
    except BaseException as error:  # noqa: BLE001 - the refusal under test (or a deferral)
        if isinstance(error, KeyboardInterrupt | SystemExit):
            raise
        text = str(error)
        if not _ours(error):  # an error we did not mean to raise: show where it came from
            text += "\n" + "".join(traceback.format_exception(error))
        return Refusal(type(error).__name__, text)
    return Refusal("accepted", repr(value))


def _ours(error: BaseException) -> bool:
    from streamkeeper.errors import StreamkeeperError

    names = {"AirflowFailException", "ParamValidationError", "AirflowSkipException"}
    return isinstance(error, StreamkeeperError) or type(error).__name__ in names


def cli(*args: str) -> Feed:
    """`streamkeeper ARGS` in-process ({names} in the arguments are the case's)."""

    def feed(ctx: Ctx) -> Refusal:
        result = CliRunner().invoke(app, [ctx.fmt(a) for a in args])
        text = result.output
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            text += "\n" + "".join(traceback.format_exception(result.exception))
        return Refusal(f"exit {result.exit_code}", text)

    return feed


def run(*args: str, spec: str = str(SAMPLE_SPEC)) -> Feed:
    """`streamkeeper run SPEC` of the sample job on the case's root, plus `args`."""
    return cli(
        "run",
        spec,
        "--root",
        "{root}",
        "--checkpoint-dir",
        "{base}/ck",
        "--set",
        "source.path={events}",
        "--set",
        "spark.master=local[2]",
        "--set",
        "spark.shuffle_partitions=2",
        *args,
    )


def call(function: Callable[[Ctx], Any]) -> Feed:
    return lambda ctx: _outcome(lambda: function(ctx))


@dataclass(frozen=True)
class Case:
    """One bad input: where it goes, the refusal it gets, what the message must say.

    `says`: substrings of the message, the bad value and the fix ({names} are the case's).
    `prepare`: damage done to the case's copy of the world before the first listing.
    `answers`: files the refusal itself writes (a running job's answer), else none.
    """

    id: str
    surface: str
    feed: Feed
    kind: str
    says: tuple[str, ...]
    prepare: Callable[[Ctx], None] | None = None
    answers: Callable[[Ctx], set[str]] | None = None


# -- preparing a case: specs and damage -----------------------------------------------------


def spec_file(edit: Callable[[dict[str, Any]], Any] | None = None, text: str | None = None):
    """Write {spec}: the sample spec edited (or raw `text`), its transform by module path."""

    def prepare(ctx: Ctx) -> None:
        path = ctx.base / "specs" / "job.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        if text is None:
            data = yaml.safe_load(SAMPLE_SPEC.read_text())
            data["transform"] = "jobs.keyed_totals.transform:build"
            if edit is not None:
                edit(data)
            path.write_text(yaml.safe_dump(data))
        else:
            path.write_text(text)
        ctx.names["spec"] = str(path)

    return prepare


def rewrite_manifest(savepoint: str, change: Callable[[dict[str, Any]], Any]):
    """The savepoint's manifest as `change` leaves it (or as it returns it, if not None)."""

    def prepare(ctx: Ctx) -> None:
        path = ctx.manifest(ctx.names[savepoint])
        data = json.loads(path.read_text())
        replaced = change(data)
        path.write_text(json.dumps(data if replaced is None else replaced))

    return prepare


def truncate(relative: Callable[[Ctx], Path], keep: float = 0.5):
    def prepare(ctx: Ctx) -> None:
        path = relative(ctx)
        body = path.read_bytes()
        path.write_bytes(body[: int(len(body) * keep)])

    return prepare


def remove(relative: Callable[[Ctx], Path]):
    def prepare(ctx: Ctx) -> None:
        target = relative(ctx)
        shutil.rmtree(target) if target.is_dir() else target.unlink()

    return prepare


def native_file(name: str) -> Callable[[Ctx], Path]:
    return lambda ctx: ctx.savepoint_folder(ctx.names["native"]) / "checkpoint" / name


def canonical_file(name: str) -> Callable[[Ctx], Path]:
    return lambda ctx: ctx.savepoint_folder(ctx.names["canonical"]) / name


def copy_native_out(ctx: Ctx) -> None:
    """{copied}: the native savepoint's folder copied out of the root (portable)."""
    target = ctx.base / "copied-savepoint"
    shutil.copytree(ctx.savepoint_folder(ctx.names["native"]), target)
    ctx.names["copied"] = str(target)


def live_heartbeat(ctx: Ctx) -> None:
    """The job's heartbeat says RUNNING, just now (as a live runner's does)."""
    path = ctx.root / "jobs" / JOB / "heartbeat.json"
    beat = json.loads(path.read_text())
    beat.update(state="RUNNING", reason=None, time=time.time(), pid=os.getpid())
    path.write_text(json.dumps(beat))


def rollback_left_halfway(ctx: Ctx, *, every_table: bool = True) -> None:
    """A rollback to the native savepoint restored the tables (its marker written) and died
    before its start; or died before it restored every table."""
    path = ctx.root / "jobs" / JOB / "rewind-pending.json"
    pending = {"savepoint": ctx.names["native"], "seq": 1, "epoch": 99, "at": 0}
    if every_table:
        pending["marker_seq"] = 1000
    path.write_text(json.dumps(pending))


def rollback_restored_not_every_table(ctx: Ctx) -> None:
    rollback_left_halfway(ctx, every_table=False)


# -- the client, the runner's command executor ----------------------------------------------


def client(ctx: Ctx) -> StreamkeeperClient:
    return StreamkeeperClient(ctx.names["root"])  # the local copy, or its upload to S3


def command_file(name: str, body: str):
    """A command file dropped into the job's commands folder (not by the client)."""

    def prepare(ctx: Ctx) -> None:
        folder = ctx.root / "jobs" / JOB / "commands"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.json").write_text(body)

    return prepare


def runner_polls(ctx: Ctx) -> Refusal:
    """A running job's command executor polls once; returns the result it published."""
    from streamkeeper.lineage.commands import CommandBox
    from streamkeeper.lineage.control import ControlPlane, Fence, Lease
    from streamkeeper.lineage.layout import LineageLayout
    from streamkeeper.runtime.commands import CommandExecutor, Outcome
    from streamkeeper.storage import LocalStore, Location

    store = LocalStore(ctx.root)
    layout = LineageLayout(Location(str(ctx.root)), JOB, JOB)
    executed: list[str] = []

    def execute(command: Any) -> Outcome:
        executed.append(command.id)
        return Outcome(savepoint_id="sp-never")

    control = ControlPlane(store, layout)
    # The job's own epoch (no new one is taken: the listing must show only the answer).
    fence = Fence(control, Lease.for_this_process(control.latest_epoch()))
    box = CommandBox(store, layout)
    pending = box.pending()
    executor = CommandExecutor(
        box, fence, {"savepoint": execute, "stop": execute, "cancel": execute}, interval=0.0
    )
    crashed = _outcome(executor.poll)
    if crashed.kind != "accepted":  # the runner's loop must not crash on a command file
        return crashed
    if executed:
        return Refusal("executed", f"the runner executed {executed}")
    results = [box.result(i) for i in pending]
    if not results or any(r is None or r.ok for r in results):
        return Refusal("not answered", repr(results))
    return Refusal("answered failed", "; ".join(f"{r.error}: {r.reason}" for r in results if r))


def answer_of(name: str) -> Callable[[Ctx], set[str]]:
    return lambda ctx: {
        f"data/jobs/{JOB}/command-log/{name}.json",
        f"data/jobs/{JOB}/commands/{name}.result.json",
    }


# -- Airflow: DAG Params and operators -------------------------------------------------------


def dag_params(action: str, conf: dict[str, Any]) -> Feed:
    """Trigger `{job}.{action}` with `conf`: Airflow validates it against the DAG's Params."""

    def feed(ctx: Ctx) -> Refusal:
        from airflow.serialization.serialized_objects import DagSerialization

        from streamkeeper_airflow import dag_factory

        entry = dag_factory.JobEntry(SAMPLE_SPEC, load_spec(SAMPLE_SPEC))
        dag = getattr(dag_factory, f"{action}_dag")(entry)
        # As the scheduler and the API server hold it: serialized, then checked on trigger.
        served = DagSerialization.from_dict(DagSerialization.to_dict(dag))
        return _outcome(lambda: served.params.deep_merge(conf).validate())

    return feed


def _connect(ctx: Ctx) -> None:
    """The operators' connection: a streamkeeper connection to the case's (local) root."""
    connection = {"conn_type": "streamkeeper", "extra": {"root": str(ctx.root)}}
    ctx.monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(connection))


def _context(dag_id: str, task_id: str) -> dict[str, Any]:
    ti = SimpleNamespace(
        dag_id=dag_id,
        run_id="manual__corpus",
        task_id=task_id,
        map_index=-1,
        try_number=1,
        xcom_push=lambda **_kwargs: None,
    )
    return {"ti": ti}


def start_operator(**kwargs: Any) -> Feed:
    """The start DAG's operator, run with these arguments (a launch would be a failure)."""

    def feed(ctx: Ctx) -> Refusal:
        from streamkeeper_airflow.operators.start import StartJobOperator

        def no_launch(*_args: Any, **_kwargs: Any) -> Any:
            raise AssertionError("the bad input got as far as launching a driver")

        _connect(ctx)
        ctx.monkeypatch.setattr(StartJobOperator, "start", no_launch)
        options = {"job": JOB, "spec_path": str(SAMPLE_SPEC), "conn_id": CONN_ID}
        options.update({k: ctx.fmt(v) if isinstance(v, str) else v for k, v in kwargs.items()})
        operator = StartJobOperator(task_id="start", workdir=str(ctx.base), **options)
        return _outcome(lambda: operator.execute(_context(f"{JOB}.start", "start")))

    return feed


def command_operator(kind: str, **kwargs: Any) -> Feed:
    def feed(ctx: Ctx) -> Refusal:
        from streamkeeper_airflow.operators.commands import SavepointOperator, StopJobOperator

        _connect(ctx)
        cls = SavepointOperator if kind == "savepoint" else StopJobOperator
        operator = cls(task_id=kind, job=JOB, conn_id=CONN_ID, quick_wait=0.5, **kwargs)
        return _outcome(lambda: operator.execute(_context(f"{JOB}.{kind}", kind)))

    return feed


def rollback_operator(savepoint_id: str) -> Feed:
    def feed(ctx: Ctx) -> Refusal:
        from streamkeeper_airflow.operators.upgrade import RollbackOperator

        def no_stop(*_args: Any, **_kwargs: Any) -> Any:
            raise AssertionError("the bad input got as far as stopping the running job")

        _connect(ctx)
        ctx.monkeypatch.setattr(RollbackOperator, "_stop_running", no_stop)
        operator = RollbackOperator(
            task_id="rollback",
            job=JOB,
            conn_id=CONN_ID,
            savepoint_id=ctx.fmt(savepoint_id),
            spec_path=str(SAMPLE_SPEC),
            workdir=str(ctx.base),
        )
        return _outcome(lambda: operator.execute(_context(f"{JOB}.rollback", "rollback")))

    return feed


def find_jobs_warns(ctx: Ctx) -> Refusal:
    """The DAG factory's scan of the jobs folder: a bad spec is skipped, with a warning."""
    import warnings

    from streamkeeper_airflow.dag_factory import find_jobs

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = find_jobs(Path(ctx.names["spec"]).parents[1])
    if found:
        return Refusal("accepted", repr(found))
    return Refusal("warning", "\n".join(str(w.message) for w in caught))


def check_specs_of(ctx: Ctx) -> Any:
    """dags/job_specs.py's check: what Airflow shows as that file's import error."""
    from streamkeeper_airflow.dag_factory import check_specs

    return check_specs(Path(ctx.names["spec"]).parents[1])


# -- the corpus ------------------------------------------------------------------------------

SPEC, NAMES, ESCAPE, CLI_ARGS, SAVEPOINT_IDS = "spec", "job name", "path", "cli", "savepoint id"
UIDS, OTHER_JOB, SCHEMA, MANIFEST = "uid mapping", "other job", "state schema", "manifest"
COMMANDS, PARAMS = "command", "dag params"

CASES: list[Case] = [
    # -- spec fields (the CLI's `run`: refused on load, exit 2) ------------------------------
    Case(
        "spec-interval-not-a-duration",
        SPEC,
        run("--set", "checkpoint.interval=fast"),
        "exit 2",
        ("checkpoint.interval", "'fast'", "expected e.g. '500ms', '10s'"),
    ),
    Case(
        "spec-timeout-negative",
        SPEC,
        run(spec="{spec}"),
        "exit 2",
        ("checkpoint.timeout", "-5", "must not be negative"),
        prepare=spec_file(lambda d: d["checkpoint"].update(timeout=-5)),
    ),
    Case(
        "spec-timeout-zero",
        SPEC,
        run("--set", "checkpoint.timeout=0s"),
        "exit 2",
        ("checkpoint.timeout", "must be positive", "e.g. '10m'"),
    ),
    Case(
        "spec-min-pause-negative",
        SPEC,
        run(spec="{spec}"),
        "exit 2",
        ("checkpoint.min_pause", "-1", "must not be negative"),
        prepare=spec_file(lambda d: d["checkpoint"].update(min_pause=-1)),
    ),
    Case(
        "spec-unknown-checkpoint-mode",
        SPEC,
        run("--set", "checkpoint.mode=twice"),
        "exit 2",
        ("checkpoint.mode", "'twice'", "'exactly_once' or 'at_least_once'"),
    ),
    Case(
        "spec-unknown-sink-mode",
        SPEC,
        run("--set", "sinks.0.mode=maybe"),
        "exit 2",
        ("sinks.0.mode", "'maybe'", "'exactly_once', 'idempotent' or 'at_least_once'"),
    ),
    Case(
        "spec-unknown-state-backend",
        SPEC,
        run("--set", "state_backend.type=leveldb"),
        "exit 2",
        ("state_backend.type", "'leveldb'", "'hdfs' or 'rocksdb'"),
    ),
    Case(
        "spec-changelog-on-hdfs",
        SPEC,
        run("--set", "state_backend.changelog=true"),
        "exit 2",
        ("state_backend.changelog", "set type: rocksdb or drop changelog"),
    ),
    Case(
        "spec-unknown-key",
        SPEC,
        run("--set", "checkpoint.intervall=1s"),
        "exit 2",
        ("checkpoint.intervall", "unknown field; remove it or check its spelling"),
    ),
    Case(
        "spec-unknown-top-level-key",
        SPEC,
        run(spec="{spec}"),
        "exit 2",
        ("sink:", "unknown field; remove it or check its spelling"),
        prepare=spec_file(lambda d: d.update(sink=d["sinks"][0])),
    ),
    Case(
        "spec-partitions-not-a-number",
        SPEC,
        run("--set", "spark.shuffle_partitions=four"),
        "exit 2",
        ("spark.shuffle_partitions", "'four'", "valid integer"),
    ),
    Case(
        "spec-sinks-not-a-list",
        SPEC,
        run(spec="{spec}"),
        "exit 2",
        ("sinks", "'totals'", "valid list"),
        prepare=spec_file(lambda d: d.update(sinks="totals")),
    ),
    Case(
        "spec-negative-tolerable-failures",
        SPEC,
        run("--set", "checkpoint.tolerable_failures=-1"),
        "exit 2",
        ("checkpoint.tolerable_failures", "'-1'", "greater than or equal to 0"),
    ),
    Case(
        "spec-merge-sink-without-key",
        SPEC,
        run(spec="{spec}"),
        "exit 2",
        ("sink 'totals' has output 'merge' but no key", "key: [customer_id]"),
        prepare=spec_file(lambda d: d["sinks"][0].pop("key")),
    ),
    Case(
        "spec-not-a-mapping",
        SPEC,
        run(spec="{spec}"),
        "exit 2",
        ("expected a mapping at the top level", "['name', 'keyed-totals']"),
        prepare=spec_file(text="- name\n- keyed-totals\n"),
    ),
    Case(
        "spec-invalid-yaml",
        SPEC,
        run(spec="{spec}"),
        "exit 2",
        ("{spec}", "is not valid YAML", "line 2"),
        prepare=spec_file(text="name: keyed-totals\nsinks: [unclosed\n"),
    ),
    Case(
        "spec-file-missing",
        SPEC,
        run(spec="{base}/no-such-job.yaml"),
        "exit 2",
        ("no-such-job.yaml", "not found; pass the path to a job's YAML file"),
    ),
    Case(
        "spec-bad-schedule",
        SPEC,
        run("--set", "airflow.monitor_schedule=every 5 minutes"),
        "exit 2",
        ("airflow.monitor_schedule", "'every 5 minutes'", "'*/5 * * * *'"),
    ),
    Case(
        "spec-override-of-a-missing-sink",
        SPEC,
        run("--set", "sinks.7.mode=idempotent"),
        "exit 2",
        ("sinks.7.mode", "'7'", "a list of 2", "index from 0 to 1"),
    ),
    Case(
        "spec-in-the-dag-folder-skipped",
        SPEC,
        find_jobs_warns,
        "warning",
        ("skipped", "checkpoint.interval", "'soon'", "expected e.g. '500ms'"),
        prepare=spec_file(lambda d: d["checkpoint"].update(interval="soon")),
    ),
    Case(
        "spec-in-the-dag-folder-is-an-import-error",
        SPEC,
        call(check_specs_of),
        "InvalidJobSpecsError",
        ("1 job spec(s)", "skipped", "checkpoint.interval", "'soon'", "expected e.g. '500ms'"),
        prepare=spec_file(lambda d: d["checkpoint"].update(interval="soon")),
    ),
    # -- job names with path separators -------------------------------------------------------
    Case(
        "name-with-a-slash",
        NAMES,
        run("--set", "name=keyed/totals"),
        "exit 2",
        ("name", "'keyed/totals'", "a-z, 0-9 and '-'", "e.g. 'keyed-totals'"),
    ),
    Case(
        "name-climbing-out",
        NAMES,
        run("--set", "name=../evil"),
        "exit 2",
        ("name", "'../evil'", "a-z, 0-9 and '-'"),
    ),
    Case(
        "lineage-with-a-slash",
        NAMES,
        run("--set", "lineage=x/../y"),
        "exit 2",
        ("lineage", "'x/../y'", "a-z, 0-9 and '-'"),
    ),
    Case(
        "sink-name-climbing-out",
        NAMES,
        run("--set", "sinks.1.name=../changes"),
        "exit 2",
        ("sinks.1.name", "'../changes'", "a-z, 0-9 and '_'"),
    ),
    Case(
        "status-of-a-path",
        NAMES,
        cli("status", "../keyed-totals", "--root", "{root}"),
        "exit 2",
        ("'../keyed-totals'", "jobs there: keyed-totals"),
    ),
    Case(
        "upgrades-of-a-path",
        NAMES,
        cli("upgrades", "../../etc", "--root", "{root}"),
        "exit 2",
        ("'../../etc'", "jobs there: keyed-totals"),
    ),
    Case(
        "savepoints-of-a-path",
        NAMES,
        cli("savepoints", "jobs/keyed-totals", "--root", "{root}"),
        "exit 2",
        ("'jobs/keyed-totals'", "jobs there: keyed-totals"),
    ),
    Case(
        "command-to-a-path",
        NAMES,
        call(lambda ctx: client(ctx).send_command("../jobs/keyed-totals", "savepoint")),
        "UnknownJobError",
        ("'../jobs/keyed-totals'", "jobs there: keyed-totals"),
    ),
    Case(
        "airflow-start-of-another-job-name",
        NAMES,
        start_operator(job="keyed/totals"),
        "AirflowFailException",
        ("'keyed/totals'", "is job 'keyed-totals'", "pass the job's own spec"),
    ),
    # -- paths that escape their root ---------------------------------------------------------
    Case(
        "table-above-the-root",
        ESCAPE,
        run("--set", "sinks.0.table=../outside"),
        "exit 2",
        ("sinks.0.table", "'../outside'", "escapes the storage root", "absolute path or URI"),
    ),
    Case(
        "table-climbing-out-through-a-folder",
        ESCAPE,
        run("--set", "sinks.1.table=tables/../../../etc/changes"),
        "exit 2",
        ("sinks.1.table", "'tables/../../../etc/changes'", "escapes the storage root"),
    ),
    Case(
        "restore-from-a-folder-that-is-no-savepoint",
        ESCAPE,
        run("--from-savepoint", "../data/jobs"),
        "exit 2",
        ("'../data/jobs'", "no savepoint folder", "pass a savepoint id"),
    ),
    Case(
        "result-of-a-command-path",
        ESCAPE,
        cli(
            "result", JOB, "../../../lineages/keyed-totals/savepoints/registry", "--root", "{root}"
        ),
        "exit 2",
        ("'../../../lineages/keyed-totals/savepoints/registry'", "letters, digits, '-' or '_'"),
    ),
    Case(
        "state-of-a-uid-path",
        ESCAPE,
        cli("state", "{canonical}", "--uid", "../../../tables/totals", "--root", "{root}"),
        "exit 2",
        ("'../../../tables/totals'", "its operators: ['op-0']"),
    ),
    Case(
        "describe-a-savepoint-path",
        ESCAPE,
        cli("savepoints", "describe", "../registry", "--root", "{root}"),
        "exit 2",
        ("'../registry' is not a savepoint id", "`streamkeeper savepoints JOB`"),
    ),
    Case(
        "rollback-to-a-savepoint-path",
        ESCAPE,
        rollback_operator("../../../jobs/keyed-totals"),
        "AirflowFailException",
        ("'../../../jobs/keyed-totals' is not a savepoint id", "`streamkeeper savepoints JOB`"),
    ),
    # -- CLI arguments ------------------------------------------------------------------------
    Case(
        "savepoint-format",
        CLI_ARGS,
        cli("savepoint", JOB, "--root", "{root}", "--format", "binary"),
        "exit 2",
        ("'binary'", "expected native or canonical"),
    ),
    Case(
        "stop-format",
        CLI_ARGS,
        cli("stop", JOB, "--root", "{root}", "--format", "json"),
        "exit 2",
        ("'json'", "expected native or canonical"),
    ),
    Case(
        "root-of-another-scheme",
        CLI_ARGS,
        cli("jobs", "--root", "ftp://host/data"),
        "exit 2",
        ("'ftp://host/data'", "use a local path or s3://bucket/prefix"),
    ),
    Case(
        "root-without-a-bucket",
        CLI_ARGS,
        cli("status", JOB, "--root", "s3:///prefix"),
        "exit 2",
        ("'s3:///prefix'", "expected s3://bucket/prefix"),
    ),
    Case(
        "jobs-under-a-missing-root",
        CLI_ARGS,
        cli("jobs", "--root", "{root}-typo"),
        "exit 2",
        ("-typo' does not exist", "storage.root"),
    ),
    Case(
        "root-that-is-a-file",
        CLI_ARGS,
        cli("status", JOB, "--root", "{root}/jobs/keyed-totals/job.json"),
        "exit 2",
        ("job.json", "not a folder", "storage.root"),
    ),
    Case(
        "unknown-job",
        CLI_ARGS,
        cli("status", "keyed-totalz", "--root", "{root}"),
        "exit 2",
        ("'keyed-totalz'", "jobs there: keyed-totals"),
    ),
    Case(
        "uid-mapping-without-equals",
        CLI_ARGS,
        run("--from-savepoint", "{canonical}", "--uid-mapping", "op-0"),
        "exit 2",
        ("'op-0'", "expected old_uid=new_uid"),
    ),
    Case(
        "from-checkpoint-not-a-number",
        CLI_ARGS,
        run("--from-checkpoint", "newest"),
        "exit 2",
        ("'newest'", "expected 'latest' or a checkpoint id"),
    ),
    Case(
        "from-checkpoint-unknown",
        CLI_ARGS,
        run("--from-checkpoint", "7"),
        "exit 2",
        ("checkpoint '7'", "enable checkpoint.externalized"),
    ),
    Case(
        "run-token-with-spaces",
        CLI_ARGS,
        run("--run-token", "my token!"),
        "exit 2",
        ("'my token!'", "expected 1-128 letters, digits"),
    ),
    Case(
        "set-without-a-value",
        CLI_ARGS,
        run("--set", "checkpoint.interval"),
        "exit 2",
        ("'checkpoint.interval'", "expected dotted.key=value"),
    ),
    Case(
        "checkpoints-last-zero",
        CLI_ARGS,
        cli("checkpoints", JOB, "--root", "{root}", "--last", "0"),
        "exit 2",
        ("--last", "0", "x>=1"),
    ),
    Case(
        "rewind-without-a-savepoint",
        CLI_ARGS,
        run("--allow-rewind"),
        "exit 2",
        ("--allow-rewind applies to a restore", "add one, or drop it"),
    ),
    Case(
        "native-savepoint-into-another-state-backend",
        CLI_ARGS,
        run("--from-savepoint", "{native}", "--set", "state_backend.type=rocksdb"),
        "exit 2",
        ("'{native}' is native", "'hdfs'", "'rocksdb'", "--format canonical"),
    ),
    Case(
        "plain-start-after-a-rollback-left-halfway",
        CLI_ARGS,
        run(),
        "exit 2",
        (
            "a rollback restored the tables to savepoint {native} and did not start the job",
            "--from-savepoint {native} --takeover",
        ),
        prepare=rollback_left_halfway,
    ),
    Case(
        "start-that-would-read-the-input-again",
        CLI_ARGS,
        run(),  # the case's checkpoint folder is empty; the lineage committed
        "exit 2",
        (
            "holds no checkpoint",
            "read its input from the start again",
            "--from-savepoint {canonical}",
            "--allow-fresh-start",
        ),
    ),
    Case(
        "start-from-the-savepoint-of-a-rollback-that-restored-not-every-table",
        CLI_ARGS,
        run("--from-savepoint", "{native}", "--takeover"),
        "exit 2",
        ("a rollback to savepoint {native} did not restore every table", "run the rollback again"),
        prepare=rollback_restored_not_every_table,
    ),
    Case(
        "checkpoint-and-savepoint-together",
        CLI_ARGS,
        run("--from-checkpoint", "1", "--from-savepoint", "{native}"),
        "exit 2",
        ("--from-checkpoint and --from-savepoint exclude each other", "pass one"),
    ),
    Case(
        "protect-without-a-reason",
        CLI_ARGS,
        cli("savepoints", "protect", "{native}", "--reason", " ", "--root", "{root}"),
        "exit 2",
        ("'{native}' needs a reason", "--reason 'rollback target"),
    ),
    # -- savepoint ids ------------------------------------------------------------------------
    Case(
        "describe-a-malformed-id",
        SAVEPOINT_IDS,
        cli("savepoints", "describe", "sp-latest", "--root", "{root}"),
        "exit 2",
        ("'sp-latest' is not a savepoint id", "sp-20270115T080000-1a2b3c4d"),
    ),
    Case(
        "describe-an-unknown-id",
        SAVEPOINT_IDS,
        cli("savepoints", "describe", UNKNOWN_SP, "--root", "{root}"),
        "exit 2",
        (f"no savepoint '{UNKNOWN_SP}'", "`streamkeeper savepoints JOB` lists"),
    ),
    Case(
        "restore-an-unknown-id",
        SAVEPOINT_IDS,
        run("--from-savepoint", UNKNOWN_SP),
        "exit 2",
        (f"no savepoint '{UNKNOWN_SP}'", "`streamkeeper savepoints JOB` lists"),
    ),
    Case(
        "delete-a-malformed-id",
        SAVEPOINT_IDS,
        cli("savepoints", "delete", "latest", "--root", "{root}"),
        "exit 2",
        ("'latest' is not a savepoint id", "`streamkeeper savepoints JOB`"),
    ),
    Case(
        "state-of-an-unknown-id",
        SAVEPOINT_IDS,
        cli("state", UNKNOWN_SP, "--root", "{root}"),
        "exit 2",
        (f"no savepoint '{UNKNOWN_SP}'", "`streamkeeper savepoints JOB` lists"),
    ),
    # -- uid mappings (canonical restores) ---------------------------------------------------
    Case(
        "uid-mapping-from-an-unknown-uid",
        UIDS,
        run("--from-savepoint", "{canonical}", "--uid-mapping", "totals=op-0"),
        "exit 2",
        ("['totals']", "which savepoint '{canonical}' does not have", "its uids are ['op-0']"),
    ),
    Case(
        "uid-mapping-to-a-uid-the-job-lacks",
        UIDS,
        run("--from-savepoint", "{canonical}", "--uid-mapping", "op-0=totals"),
        "exit 2",
        ("'op-0'", "'totals'", "state.operators", "--allow-non-restored-state"),
    ),
    Case(
        "uid-mapping-twice-for-one-uid",
        UIDS,
        run(
            "--from-savepoint", "{canonical}", "--uid-mapping", "op-0=a", "--uid-mapping", "op-0=b"
        ),
        "exit 2",
        ("'op-0'", "more than once", "one --uid-mapping per uid"),
    ),
    Case(
        "uid-mapping-to-a-malformed-uid",
        UIDS,
        run("--from-savepoint", "{canonical}", "--uid-mapping", "op-0=Totals/v2"),
        "exit 2",
        ("'Totals/v2'", "a-z, 0-9, '_' and '-'"),
    ),
    Case(
        "uid-mapping-on-a-native-savepoint",
        UIDS,
        run("--from-savepoint", "{native}", "--uid-mapping", "op-0=totals"),
        "exit 2",
        ("'{native}' is native", "drop them, or restore a canonical savepoint"),
    ),
    Case(
        "uid-mapping-without-a-savepoint",
        UIDS,
        run("--uid-mapping", "op-0=totals"),
        "exit 2",
        ("--uid-mapping", "add --from-savepoint ID, or drop them"),
    ),
    Case(
        "spec-uid-for-an-operator-the-job-lacks",
        UIDS,
        run("--from-savepoint", "{canonical}", spec="{spec}"),
        "exit 2",
        ("['totals']", "operator id(s) [5]", "remove those entries or fix their operator_id"),
        prepare=spec_file(
            lambda d: d.update(state={"operators": [{"uid": "totals", "operator_id": 5}]})
        ),
    ),
    # -- a savepoint from another job ---------------------------------------------------------
    Case(
        "restore-another-jobs-savepoint",
        OTHER_JOB,
        run("--set", "name=other-job", "--from-savepoint", "{native}"),
        "exit 2",
        (
            "'{native}'",
            "lineage 'keyed-totals' of job 'keyed-totals'",
            "with job 'keyed-totals''s spec",
        ),
    ),
    Case(
        "restore-another-lineages-savepoint",
        OTHER_JOB,
        run("--set", "lineage=keyed-totals-v2", "--from-savepoint", "{canonical}"),
        "exit 2",
        ("'{canonical}'", "not to lineage 'keyed-totals-v2'", "with job 'keyed-totals''s spec"),
    ),
    Case(
        "restore-another-jobs-copied-savepoint",
        OTHER_JOB,
        run("--set", "name=other-job", "--from-savepoint", "{copied}"),
        "exit 2",
        ("was taken by job 'keyed-totals'", "this spec runs job 'other-job'", "its own job's spec"),
        prepare=copy_native_out,
    ),
    Case(
        "restore-native-into-another-partition-count",
        OTHER_JOB,
        run("--set", "spark.shuffle_partitions=3", "--from-savepoint", "{native}"),
        "exit 2",
        ("'{native}'", "2", "3", "canonical"),
    ),
    # -- a state schema that does not fit -----------------------------------------------------
    Case(
        "state-schema-sum-bigint-to-double",
        SCHEMA,
        run(
            "--from-savepoint",
            "{canonical}",
            "--set",
            "transform=tests.reliability.transforms:double_totals",
            "--set",
            "sinks.0.table=tables/totals_double",
            "--set",
            "sinks.1.table=tables/changes_double",
        ),
        "exit 2",
        ("'op-0'", "'sum'", "bigint", "double", "state processor API"),
    ),
    Case(
        "state-schema-key-string-to-int",
        SCHEMA,
        run(
            "--from-savepoint",
            "{canonical}",
            "--set",
            "transform=tests.reliability.transforms:length_keyed_totals",
            "--set",
            "sinks.0.table=tables/totals_by_length",
            "--set",
            "sinks.1.table=tables/changes_by_length",
        ),
        "exit 2",
        ("'op-0'", "key field 1 is 'key' (string)", "(int) in the new job", "state processor"),
    ),
    # -- corrupt or truncated savepoint manifests ---------------------------------------------
    Case(
        "manifest-truncated",
        MANIFEST,
        run("--from-savepoint", "{native}"),
        "exit 2",
        ("'{native}' is broken", "manifest.json", "not valid JSON", "restore another savepoint"),
        prepare=truncate(lambda ctx: ctx.manifest(ctx.names["native"])),
    ),
    Case(
        "manifest-empty",
        MANIFEST,
        run("--from-savepoint", "{canonical}"),
        "exit 2",
        ("'{canonical}' is broken", "not valid JSON", "restore another savepoint"),
        prepare=truncate(lambda ctx: ctx.manifest(ctx.names["canonical"]), keep=0.0),
    ),
    Case(
        "manifest-a-json-list",
        MANIFEST,
        run("--from-savepoint", "{native}"),
        "exit 2",
        ("'{native}' is broken", "not a JSON object", "restore another savepoint"),
        prepare=rewrite_manifest("native", lambda d: [d]),
    ),
    Case(
        "manifest-of-a-future-version",
        MANIFEST,
        run("--from-savepoint", "{native}"),
        "exit 2",
        ("has version 99, expected 1", "another streamkeeper version", "restore another"),
        prepare=rewrite_manifest("native", lambda d: d.update(manifest_version=99)),
    ),
    Case(
        "manifest-without-operators",
        MANIFEST,
        run("--from-savepoint", "{canonical}"),
        "exit 2",
        ("is corrupt", "'operators'", "restore another savepoint"),
        prepare=rewrite_manifest("canonical", lambda d: d.pop("operators") and None),
    ),
    Case(
        "manifest-operator-not-an-object",
        MANIFEST,
        run("--from-savepoint", "{canonical}"),
        "exit 2",
        ("is corrupt", "'op-0'", "restore another savepoint"),
        prepare=rewrite_manifest("canonical", lambda d: d.update(operators=["op-0"])),
    ),
    Case(
        "manifest-of-another-savepoint",
        MANIFEST,
        run("--from-savepoint", "{native}"),
        "exit 2",
        ("'{native}' is broken", "its manifest is savepoint '{canonical}''s", "restore another"),
        prepare=lambda ctx: shutil.copy(
            ctx.manifest(ctx.names["canonical"]), ctx.manifest(ctx.names["native"])
        ),
    ),
    Case(
        "savepoint-file-missing",
        MANIFEST,
        run("--from-savepoint", "{native}"),
        "exit 2",
        ("'{native}' is broken", "'commits/1' is missing", "restore another savepoint"),
        prepare=remove(native_file("commits/1")),
    ),
    Case(
        "savepoint-file-truncated",
        MANIFEST,
        run("--from-savepoint", "{native}"),
        "exit 2",
        ("'{native}' is broken", "'metadata' has", "the manifest says", "restore another"),
        prepare=truncate(native_file("metadata")),
    ),
    Case(
        "canonical-state-table-without-its-log",
        MANIFEST,
        run("--from-savepoint", "{canonical}"),
        "exit 2",
        ("'{canonical}' is broken", "operator 'op-0'", "has no Delta log", "restore another"),
        prepare=remove(canonical_file("state/op-0/_delta_log")),
    ),
    Case(
        "describe-a-truncated-manifest",
        MANIFEST,
        cli("savepoints", "describe", "{native}", "--root", "{root}"),
        "exit 1",
        ("{native}", "not valid JSON", "restore another savepoint"),
        prepare=truncate(lambda ctx: ctx.manifest(ctx.names["native"])),
    ),
    Case(
        "savepoint-registry-truncated",
        MANIFEST,
        cli("savepoints", JOB, "--root", "{root}"),
        "exit 2",
        ("savepoints/registry.json", "not valid JSON", "backup"),
        prepare=truncate(lambda ctx: ctx.root / "lineages" / JOB / "savepoints" / "registry.json"),
    ),
    Case(
        "job-record-garbled",
        MANIFEST,
        cli("status", JOB, "--root", "{root}"),
        "exit 2",
        (f"jobs/{JOB}/job.json", "not valid JSON", "backup"),
        prepare=lambda ctx: (ctx.root / "jobs" / JOB / "job.json").write_text("{'job': nope"),
    ),
    # -- commands in the control plane --------------------------------------------------------
    Case(
        "command-of-an-unknown-kind",
        COMMANDS,
        call(lambda ctx: client(ctx).send_command(JOB, "restart")),
        "CommandError",
        ("'restart' is unknown", "'savepoint', 'stop', 'cancel'"),
    ),
    Case(
        "command-with-an-unknown-format",
        COMMANDS,
        call(lambda ctx: client(ctx).send_command(JOB, "savepoint", format="binary")),
        "CommandError",
        ("'binary' is unknown", "'native', 'canonical'"),
    ),
    Case(
        "command-id-that-is-a-path",
        COMMANDS,
        call(lambda ctx: client(ctx).send_command(JOB, "stop", command_id="../../escape")),
        "CommandError",
        ("'../../escape' is not valid", "omit it to get a generated one"),
    ),
    Case(
        "savepoint-of-a-stopped-job",
        COMMANDS,
        cli("savepoint", JOB, "--root", "{root}"),
        "exit 2",
        ("'keyed-totals' is not running (STOPPED", "start it first"),
    ),
    Case(
        "stop-of-a-stopped-job",
        COMMANDS,
        cli("stop", JOB, "--root", "{root}", "--cancel"),
        "exit 2",
        ("'keyed-totals' is not running (STOPPED", "start it first"),
    ),
    Case(
        "command-id-reused-after-its-answer",
        COMMANDS,
        call(lambda ctx: client(ctx).send_command(JOB, "savepoint", command_id=ctx.names["stop"])),
        "CommandError",
        ("'{stop}'", "already used for another command", "use a new id"),
    ),
    Case(
        "command-file-not-json",
        COMMANDS,
        runner_polls,
        "answered failed",
        ("'broken-1'", "not valid JSON"),
        prepare=command_file("broken-1", '{"kind": "savepoint", '),
        answers=answer_of("broken-1"),
    ),
    Case(
        "command-file-of-an-unknown-kind",
        COMMANDS,
        runner_polls,
        "answered failed",
        ("'explode' is unknown", "'savepoint', 'stop', 'cancel'"),
        prepare=command_file("boom-1", json.dumps({"id": "boom-1", "kind": "explode", "job": JOB})),
        answers=answer_of("boom-1"),
    ),
    Case(
        "command-file-with-a-text-expiry",
        COMMANDS,
        runner_polls,
        "answered failed",
        ("expires_at", "'tomorrow'"),
        prepare=command_file(
            "late-1",
            json.dumps({"id": "late-1", "kind": "savepoint", "job": JOB, "expires_at": "tomorrow"}),
        ),
        answers=answer_of("late-1"),
    ),
    Case(
        "airflow-savepoint-of-a-stopped-job",
        COMMANDS,
        command_operator("savepoint"),
        "AirflowFailException",
        ("'keyed-totals' is not running (STOPPED", "start it first", "keyed-totals.start"),
    ),
    # -- DAG Params (what Airflow checks when a run is triggered) and the operators' checks --
    Case(
        "param-start-from",
        PARAMS,
        dag_params("start", {"start_from": "yesterday"}),
        "ParamValidationError",
        ("start_from", "'yesterday' is not one of", "'latest_checkpoint'"),
    ),
    Case(
        "param-checkpoint-id-negative",
        PARAMS,
        dag_params("start", {"start_from": "checkpoint", "checkpoint_id": -3}),
        "ParamValidationError",
        ("checkpoint_id", "-3 is less than the minimum of 0"),
    ),
    Case(
        "param-new-checkpoints-not-a-number",
        PARAMS,
        dag_params("start", {"new_checkpoints": "many"}),
        "ParamValidationError",
        ("new_checkpoints", "'many' is not of type 'integer'"),
    ),
    Case(
        "param-savepoint-format",
        PARAMS,
        dag_params("savepoint", {"format": "binary"}),
        "ParamValidationError",
        ("format", "'binary' is not one of ['native', 'canonical']"),
    ),
    Case(
        "param-stop-mode",
        PARAMS,
        dag_params("stop", {"mode": "pause"}),
        "ParamValidationError",
        ("mode", "'pause' is not one of ['stop', 'cancel']"),
    ),
    Case(
        "param-rollback-without-a-savepoint",
        PARAMS,
        dag_params("rollback", {"savepoint_id": ""}),
        "ParamValidationError",
        ("savepoint_id", "'' should be non-empty"),
    ),
    Case(
        "start-from-an-unknown-savepoint",
        PARAMS,
        start_operator(start_from="savepoint", savepoint_id=UNKNOWN_SP),
        "AirflowFailException",
        (f"no savepoint '{UNKNOWN_SP}'", "`streamkeeper savepoints JOB` lists"),
    ),
    Case(
        "start-from-a-malformed-savepoint-id",
        PARAMS,
        start_operator(start_from="savepoint", savepoint_id="../sp-1"),
        "AirflowFailException",
        ("'../sp-1' is not a savepoint id", "`streamkeeper savepoints JOB`"),
    ),
    Case(
        "start-from-a-broken-savepoint",
        PARAMS,
        start_operator(start_from="savepoint", savepoint_id="{native}"),
        "AirflowFailException",
        ("'{native}' is broken", "'commits/1' is missing", "restore another savepoint"),
        prepare=remove(native_file("commits/1")),
    ),
    Case(
        "start-from-a-checkpoint-without-an-id",
        PARAMS,
        start_operator(start_from="checkpoint", checkpoint_id="latest"),
        "AirflowFailException",
        ("needs checkpoint_id", "'latest'", "`streamkeeper checkpoints keyed-totals`"),
    ),
    Case(
        "start-with-a-credential-override",
        PARAMS,
        start_operator(overrides={"storage.secret_access_key": "hunter2"}),
        "AirflowFailException",
        ("'storage.secret_access_key' looks like a credential", "through the connection"),
    ),
    Case(
        "start-with-a-bad-override",
        PARAMS,
        start_operator(overrides={"checkpoint.interval": "often"}),
        "AirflowFailException",
        ("checkpoint.interval", "'often'", "expected e.g. '500ms'"),
    ),
    Case(
        "stop-with-a-savepoint-flag-of-maybe",
        PARAMS,
        command_operator("stop", savepoint="maybe"),
        "AirflowFailException",
        ("savepoint must be true or false", "'maybe'"),
    ),
    Case(
        "rollback-to-an-unknown-savepoint-of-a-running-job",
        PARAMS,
        rollback_operator(UNKNOWN_SP),
        "AirflowFailException",
        (f"no savepoint '{UNKNOWN_SP}'", "`streamkeeper savepoints JOB` lists"),
        prepare=live_heartbeat,
    ),
]
CASES += importlib.import_module("tests.reliability.corpus_hostile_trigger").HOSTILE_TRIGGER_CASES
from tests.reliability.corpus_hostile_storage import (  # noqa: E402 - uses the helpers above
    HOSTILE_STORAGE_CASES,
    HOSTILE_STORAGE_ON_S3,
)

CASES += HOSTILE_STORAGE_CASES


@pytest.fixture
def ctx(world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Ctx:
    base = tmp_path / "case"
    shutil.copytree(world.root, base / "data", symlinks=True)
    monkeypatch.chdir(base)  # a stray relative write shows up in the listing
    names = {
        "base": str(base),
        "root": str(base / "data"),
        "events": str(world.events),
        "native": world.native,
        "canonical": world.canonical,
        "stop": world.stop_command,
    }
    return Ctx(world, base, monkeypatch, names)


def _plain(text: str) -> str:
    """Text without the CLI's error box and line wrapping: words separated by one space."""
    return " ".join(text.translate({ord(c): " " for c in "│╭╮╰╯─"}).split())


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_names_the_value_and_the_fix_and_changes_nothing(case: Case, ctx: Ctx) -> None:
    if case.prepare is not None:
        case.prepare(ctx)
    before = listing(ctx.base)

    refusal = case.feed(ctx)

    after = listing(ctx.base)
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    _judge(case, ctx, refusal, changed)


def _judge(case: Case, ctx: Ctx, refusal: Refusal, changed: set[str]) -> None:
    problems = []
    if refusal.kind != case.kind:
        problems.append(f"answered {refusal.kind!r}, expected {case.kind!r}")
    if "Traceback" in refusal.message:
        problems.append("the answer holds a traceback")
    message = _plain(refusal.message)
    lacking = [ctx.fmt(p) for p in case.says if _plain(ctx.fmt(p)) not in message]
    if lacking:
        problems.append(f"the message lacks {lacking}")
    expected = case.answers(ctx) if case.answers is not None else set()
    if changed != expected:
        problems.append(f"storage changed: {sorted(changed ^ expected)}")
    assert not problems, "\n".join(problems) + f"\n--- the answer:\n{refusal.message}"


# The cases whose bad input meets the object store itself, again on S3 (SeaweedFS): the
# case's root, damaged as the case says, is uploaded to a fresh prefix and used from there.
ON_S3 = {
    "upgrades-of-a-path",
    "result-of-a-command-path",
    "describe-a-savepoint-path",
    "unknown-job",
    "restore-an-unknown-id",
    "uid-mapping-from-an-unknown-uid",
    "restore-another-jobs-savepoint",
    "manifest-truncated",
    "manifest-a-json-list",
    "savepoint-file-missing",
    "savepoint-registry-truncated",
    "job-record-garbled",
    "command-id-reused-after-its-answer",
    "savepoint-of-a-stopped-job",
} | HOSTILE_STORAGE_ON_S3
S3_CASES = [c for c in CASES if c.id in ON_S3]


def s3_listing(uri: str) -> dict[str, tuple[int, str]]:
    """Every object below the prefix, with its size and ETag."""
    import boto3

    from streamkeeper.storage import Location, S3Settings

    location = Location(uri, S3Settings.from_env())
    s3 = boto3.client("s3", endpoint_url=location.s3.endpoint_url)  # type: ignore[union-attr]
    found = {}
    pages = s3.get_paginator("list_objects_v2").paginate(
        Bucket=location.bucket, Prefix=location.key_prefix + "/"
    )
    for page in pages:
        for item in page.get("Contents", []):
            found["s3:" + item["Key"]] = (item["Size"], item["ETag"])
    return found


def _upload(folder: Path, uri: str) -> None:
    import boto3

    from streamkeeper.storage import Location, S3Settings

    location = Location(uri, S3Settings.from_env())
    s3 = boto3.client("s3", endpoint_url=location.s3.endpoint_url)  # type: ignore[union-attr]
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            key = f"{location.key_prefix}/{path.relative_to(folder).as_posix()}"
            s3.put_object(Bucket=location.bucket, Key=key, Body=path.read_bytes())


@pytest.mark.s3
@pytest.mark.parametrize("case", S3_CASES, ids=[c.id for c in S3_CASES])
def test_bad_input_on_s3_names_the_value_and_the_fix_and_changes_nothing(
    case: Case, ctx: Ctx, s3_root: str
) -> None:
    if case.prepare is not None:
        case.prepare(ctx)
    _upload(ctx.root, s3_root)
    ctx.names["root"] = s3_root
    before = listing(ctx.base) | s3_listing(s3_root)

    refusal = case.feed(ctx)

    after = listing(ctx.base) | s3_listing(s3_root)
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    _judge(case, ctx, refusal, changed)


def test_the_corpus_covers_every_surface() -> None:
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)), "case ids must be unique"
    per_surface = Counter(c.surface for c in CASES)
    surfaces = {SPEC, NAMES, ESCAPE, CLI_ARGS, SAVEPOINT_IDS, UIDS, OTHER_JOB, SCHEMA}
    surfaces |= {MANIFEST, COMMANDS, PARAMS}
    assert set(per_surface) == surfaces, per_surface
    assert len(CASES) >= 40, len(CASES)
    assert ON_S3 == {c.id for c in S3_CASES}, ON_S3 - {c.id for c in S3_CASES}
    print(f"bad-input corpus: {len(CASES)} cases, {len(S3_CASES)} of them on S3 too")
    for surface, count in per_surface.most_common():
        print(f"  {count:3d}  {surface}")
