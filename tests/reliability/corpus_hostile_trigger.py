"""The bad-input corpus's hostile-trigger section (issue 27, items 2 and 6).

Whoever may trigger a DAG, and whatever may write under the storage root (where the launch
record lives), is trusted less than the DAG author and the operator: each Param and
override that would put code in the driver, send the root's signed requests elsewhere, run
another spec or point the driver at another master, and a launch record edited in storage,
is refused before any side effect (streamkeeper_airflow/launch_policy.py). The cases run
in the corpus's world and are judged like every other: the listing of the case's folder
(root, specs, checkpoints) is unchanged and the message names the value and the fix.
"""

from __future__ import annotations

import json
import logging
import time
from types import SimpleNamespace
from typing import Any

from tests.conftest import SAMPLE_SPEC
from tests.reliability.test_bad_input_corpus import (
    CONN_ID,
    JOB,
    PARAMS,
    Case,
    Ctx,
    Feed,
    Refusal,
    _connect,
    _context,
    _outcome,
    call,
    spec_file,
    start_operator,
)

JOBS = str(SAMPLE_SPEC.parents[1])  # the jobs folder the DAG factory confines operators to
EVIL = "203.0.113.9"  # TEST-NET-3: never routed


def _never_launch(ctx: Ctx, cls: type, method: str = "start") -> None:
    def no_launch(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError(f"the hostile input got as far as {cls.__name__}.{method}")

    ctx.monkeypatch.setattr(cls, method, no_launch)


def begin_upgrade_operator(green_spec_path: str) -> Feed:
    def feed(ctx: Ctx) -> Refusal:
        from streamkeeper_airflow.operators.upgrade import BeginUpgradeOperator

        _connect(ctx)
        operator = BeginUpgradeOperator(
            task_id="begin",
            job=JOB,
            conn_id=CONN_ID,
            green_spec_path=ctx.fmt(green_spec_path),
            jobs_folder=JOBS,
        )
        return _outcome(lambda: operator.execute(_context(f"{JOB}.upgrade", "begin")))

    return feed


def quality_gate(expectations_path: str) -> Feed:
    """The validate and probation tasks' suite lookup, as the upgrade DAG configures it."""

    def gate(ctx: Ctx) -> Any:
        from streamkeeper_airflow.operators.upgrade import run_quality_gate

        record = SimpleNamespace(job=JOB, green={"spec_path": str(SAMPLE_SPEC)}, blue={})
        log = logging.getLogger("corpus")
        return run_quality_gate(ctx.fmt(expectations_path), record, {}, log, jobs_folder=JOBS)

    return call(gate)


def rollback_with_spec(spec_path: str) -> Feed:
    def feed(ctx: Ctx) -> Refusal:
        from streamkeeper_airflow.operators.upgrade import RollbackOperator

        _connect(ctx)
        _never_launch(ctx, RollbackOperator, "_stop_running")
        _never_launch(ctx, RollbackOperator, "start")
        operator = RollbackOperator(
            task_id="rollback",
            job=JOB,
            conn_id=CONN_ID,
            savepoint_id=ctx.names["canonical"],
            spec_path=ctx.fmt(spec_path),
            workdir=str(ctx.base),
            jobs_folder=JOBS,
        )
        return _outcome(lambda: operator.execute(_context(f"{JOB}.rollback", "rollback")))

    return feed


def restart_operator() -> Feed:
    """The monitor DAG's restart of the (FAILED) job, launched as its launch record says."""

    def feed(ctx: Ctx) -> Refusal:
        from streamkeeper_airflow.operators.restart import RestartJobOperator

        _connect(ctx)
        _never_launch(ctx, RestartJobOperator)
        operator = RestartJobOperator(
            task_id="restart",
            job=JOB,
            spec_path=str(SAMPLE_SPEC),
            conn_id=CONN_ID,
            workdir=str(ctx.base),
            jobs_folder=JOBS,
        )
        return _outcome(lambda: operator.execute(_context(f"{JOB}.monitor", "restart")))

    return feed


def _failed_heartbeat(ctx: Ctx) -> None:
    """The job's heartbeat says FAILED (what makes the monitor restart it)."""
    path = ctx.root / "jobs" / JOB / "heartbeat.json"
    beat = json.loads(path.read_text())
    beat.update(state="FAILED", reason="the driver died", time=time.time())
    path.write_text(json.dumps(beat))


def planted_launch_record(**request: Any):
    """A FAILED job whose `jobs/{job}/launch.json` was edited in storage to launch `request`
    ({names} in string values are the case's; run `spec_file()` first for {spec})."""

    def prepare(ctx: Ctx) -> None:
        if "spec_path" in request:
            spec_file()(ctx)
        _failed_heartbeat(ctx)
        described = {
            "spec_path": str(SAMPLE_SPEC),
            "workdir": str(ctx.base),
            "overrides": {"checkpoint.interval": "1s"},
            "checkpoint_dir": None,
            "master": None,
        }
        described.update({k: ctx.fmt(v) if isinstance(v, str) else v for k, v in request.items()})
        record = {
            "token": "af-planted",
            "job": JOB,
            "state": "launched",
            "requested_at": time.time() - 3600,
            "host": "gateway-1",
            "after_epoch": 1,
            "baseline_seq": 1,
            "launcher": "embedded",
            "request": described,
        }
        path = ctx.root / "jobs" / JOB / "launch.json"
        path.write_text(json.dumps(record))

    return prepare


def allow_overrides(patterns: str):
    def prepare(ctx: Ctx) -> None:
        ctx.monkeypatch.setenv("AIRFLOW__STREAMKEEPER__TRIGGER_OVERRIDES", patterns)

    return prepare


NEVER = ("never taken from a trigger", "set it in the job spec")
LAUNCH_RECORD = (f"launch record jobs/{JOB}/launch.json refused", f"run {JOB}.start")

HOSTILE_TRIGGER_CASES: list[Case] = [
    Case(
        "hostile-trigger-jars-and-plugins",
        PARAMS,
        start_operator(
            overrides={
                "spark.conf.spark.jars": "{base}/evil.jar",
                "spark.conf.spark.plugins": "evil.Plugin",
            },
            jobs_folder=JOBS,
        ),
        "AirflowFailException",
        ("override 'spark.conf.spark.jars'", *NEVER),
    ),
    Case(
        "hostile-trigger-driver-java-options",
        PARAMS,
        start_operator(
            overrides={"spark.conf.spark.driver.extraJavaOptions": "-javaagent:{base}/a.jar"},
            jobs_folder=JOBS,
        ),
        "AirflowFailException",
        ("override 'spark.conf.spark.driver.extraJavaOptions'", *NEVER),
    ),
    Case(
        "hostile-trigger-storage-endpoint",
        PARAMS,
        start_operator(overrides={"storage.endpoint_url": f"http://{EVIL}:9000"}, jobs_folder=JOBS),
        "AirflowFailException",
        ("override 'storage.endpoint_url'", *NEVER),
    ),
    Case(
        "hostile-trigger-checkpoint-dir-not-allowed",
        PARAMS,
        start_operator(overrides={"checkpoint.dir": "/etc/streamkeeper"}, jobs_folder=JOBS),
        "AirflowFailException",
        (
            "override 'checkpoint.dir' is not one a trigger may set",
            "airflow.trigger_overrides",
            "[streamkeeper] trigger_overrides",
        ),
    ),
    Case(
        "hostile-trigger-credential-in-a-value",
        PARAMS,
        start_operator(
            overrides={"source.url": "nats://reader:hunter2pass@10.0.0.5:4222"}, jobs_folder=JOBS
        ),
        "AirflowFailException",
        (
            "override 'source.url' carries a credential",
            "nats://***@10.0.0.5:4222",
            "by environment (`[streamkeeper] driver_env`) or a file it reads",
        ),
        prepare=allow_overrides("source.*"),
    ),
    Case(
        "hostile-trigger-spec-path-outside-the-jobs-folder",
        PARAMS,
        start_operator(spec_path="{spec}", jobs_folder=JOBS),
        "AirflowFailException",
        ("spec_path of job 'keyed-totals' '{spec}' is outside the jobs folder", JOBS),
        prepare=spec_file(),
    ),
    Case(
        "hostile-trigger-spec-path-escaping-by-dots",
        PARAMS,
        start_operator(spec_path=f"{JOBS}/keyed_totals/../../tests/conftest.py", jobs_folder=JOBS),
        "AirflowFailException",
        ("is outside the jobs folder", "keyed_totals/../../tests/conftest.py"),
    ),
    Case(
        "hostile-trigger-green-spec-path",
        PARAMS,
        begin_upgrade_operator("{spec}"),
        "AirflowFailException",
        ("green_spec_path '{spec}' is outside the jobs folder", JOBS, "spec_folders"),
        prepare=spec_file(),
    ),
    Case(
        "hostile-trigger-expectations-path",
        PARAMS,
        quality_gate("{base}/data/jobs/keyed-totals/heartbeat.json"),
        "LaunchPolicyError",
        ("expectations_path '{base}/data/jobs/keyed-totals/heartbeat.json' is outside", JOBS),
    ),
    Case(
        "hostile-trigger-rollback-spec-path",
        PARAMS,
        rollback_with_spec("{spec}"),
        "AirflowFailException",
        ("rollback of 'keyed-totals' refused", "'{spec}' is outside the jobs folder"),
        prepare=spec_file(),
    ),
    Case(
        "hostile-trigger-spark-master",
        PARAMS,
        start_operator(spark_master=f"spark://{EVIL}:7077", jobs_folder=JOBS),
        "AirflowFailException",
        (f"Spark master 'spark://{EVIL}:7077' is not allowed", "[streamkeeper] spark_masters"),
    ),
    Case(
        "hostile-launch-record-spec-path",
        PARAMS,
        restart_operator(),
        "AirflowFailException",
        (*LAUNCH_RECORD, "'{spec}' is outside the jobs folder"),
        prepare=planted_launch_record(spec_path="{spec}"),
    ),
    Case(
        "hostile-launch-record-plugins",
        PARAMS,
        restart_operator(),
        "AirflowFailException",
        (*LAUNCH_RECORD, "override 'spark.conf.spark.plugins'", "never taken"),
        prepare=planted_launch_record(overrides={"spark.conf.spark.plugins": "evil.Plugin"}),
    ),
    Case(
        "hostile-launch-record-master",
        PARAMS,
        restart_operator(),
        "AirflowFailException",
        (*LAUNCH_RECORD, f"Spark master 'spark://{EVIL}:7077' is not allowed"),
        prepare=planted_launch_record(master=f"spark://{EVIL}:7077"),
    ),
]
