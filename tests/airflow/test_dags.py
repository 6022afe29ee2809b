"""The DAG folder, the plugin and the provider registration, each in a fresh interpreter
(so nothing another test imported hides a heavy import at parse time)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

HEAVY = ("pyspark", "boto3", "botocore", "great_expectations", "deltalake", "pyarrow")
ACTIONS = ("start", "monitor", "savepoint", "stop", "upgrade", "rollback")


def _python(code: str, tmp_path: Path, **env: str) -> dict[str, Any]:
    """Run `code` (which prints one JSON line last) in a fresh interpreter."""
    environment = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path / "home"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        **env,
    }
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=environment,
        cwd=REPO,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


DAGBAG = """
import json, sys, time
from airflow.dag_processing.dagbag import DagBag
started = time.perf_counter()
bag = DagBag(dag_folder="dags")
seconds = time.perf_counter() - started
print(json.dumps({
    "seconds": seconds,
    "files": {s.file: s.duration.total_seconds() for s in bag.dagbag_stats},
    "errors": bag.import_errors,
    "warnings": {k: list(v) for k, v in bag.captured_warnings.items()},
    "dags": {d: {"params": sorted(bag.dags[d].params), "schedule": str(bag.dags[d].schedule),
                 "tasks": sorted(bag.dags[d].task_ids), "tags": sorted(bag.dags[d].tags)}
             for d in bag.dag_ids},
    "heavy": sorted({m.split(".")[0] for m in sys.modules} & set(HEAVY)),
}))
""".replace("HEAVY", repr(HEAVY))


def test_every_dag_imports_light_and_fast(tmp_path: Path) -> None:
    bag = _python(DAGBAG, tmp_path)
    print(f"DagBag parse of dags/: {bag['seconds']:.2f} s; per file: {bag['files']}")
    assert bag["errors"] == {} and bag["warnings"] == {}
    assert bag["heavy"] == []  # no pyspark, boto3, great_expectations at parse time
    jobs = sorted(p.parent.name for p in (REPO / "jobs").glob("*/job.yaml"))
    assert jobs == ["keyed_totals"]
    assert sorted(bag["dags"]) == [f"keyed-totals.{a}" for a in sorted(ACTIONS)]
    start = bag["dags"]["keyed-totals.start"]
    assert start["params"] == sorted(
        ["start_from", "checkpoint_id", "savepoint_id", "new_checkpoints", "takeover",
         "launcher", "spark_master", "overrides", "start_timeout"]
    )  # fmt: skip
    assert start["tasks"] == ["start"] and start["tags"] == ["keyed-totals", "streamkeeper"]
    monitor = bag["dags"]["keyed-totals.monitor"]
    assert monitor["tasks"] == ["check", "restart"]
    assert monitor["params"] == [
        "backoff_seconds", "max_attempts", "max_backoff_seconds", "restart",
    ]  # fmt: skip
    # Event-driven: the job's health asset (watched in the triggerer), or the daily net.
    assert "AssetOrTimeSchedule" in monitor["schedule"] and "0 0 * * *" in monitor["schedule"]
    assert "streamkeeper://keyed-totals/health" in monitor["schedule"]
    assert "0 * * * *" in bag["dags"]["keyed-totals.savepoint"]["schedule"]  # the spec's cron
    assert bag["dags"]["keyed-totals.stop"]["params"] == ["format", "mode", "savepoint"]
    upgrade = bag["dags"]["keyed-totals.upgrade"]
    assert upgrade["tasks"] == sorted(
        ["begin", "start_green", "validate", "handover", "probation", "rollback", "outcome"]
    )
    assert {"green_spec_path", "format", "probation_seconds"} <= set(upgrade["params"])
    rollback = bag["dags"]["keyed-totals.rollback"]
    assert rollback["params"] == ["overrides", "savepoint_id", "spec_path"]
    assert bag["seconds"] < 20, bag["files"]


def test_a_bad_spec_is_an_import_error_naming_it_and_the_others_stay(tmp_path: Path) -> None:
    """A spec that does not validate has no DAGs (no monitor, no alerts): Airflow shows it
    as dags/job_specs.py's import error, with the spec and the field; every valid job
    keeps its DAGs."""
    jobs = tmp_path / "jobs"
    for name in ("good", "bad", "twin"):
        (jobs / name).mkdir(parents=True)
    good = (REPO / "jobs/keyed_totals/job.yaml").read_text()
    (jobs / "good" / "job.yaml").write_text(good)
    (jobs / "twin" / "job.yaml").write_text(good)  # the same job name again
    (jobs / "bad" / "job.yaml").write_text("name: Bad Name\nsource: {type: rate}\n")
    bag = _python(DAGBAG, tmp_path, AIRFLOW__STREAMKEEPER__JOBS_FOLDER=str(jobs))
    assert list(bag["errors"]) == ["dags/job_specs.py"], bag["errors"]
    error = bag["errors"]["dags/job_specs.py"]
    assert "InvalidJobSpecsError: 2 job spec(s)" in error
    assert "bad/job.yaml skipped" in error and "name:" in error
    assert "twin/job.yaml skipped: job 'keyed-totals' is already defined" in error
    assert "keyed-totals.start" in bag["dags"] and len(bag["dags"]) == len(ACTIONS)


def test_a_workers_parse_for_a_task_builds_only_that_tasks_dag(tmp_path: Path) -> None:
    """Airflow 3 workers parse the DAG file again for each task, with its DAG id as the
    parsing context: one DAG is built, not one per job (benchmarks/dag_parse.py)."""
    jobs = tmp_path / "jobs"
    spec = (REPO / "jobs/keyed_totals/job.yaml").read_text()
    for name in ("keyed-totals", "orders", "payments"):
        (jobs / name).mkdir(parents=True)
        (jobs / name / "job.yaml").write_text(spec.replace("keyed-totals", name))
    env = {"AIRFLOW__STREAMKEEPER__JOBS_FOLDER": str(jobs)}
    everything = _python(DAGBAG, tmp_path, **env)
    assert len(everything["dags"]) == 3 * len(ACTIONS)
    one = _python(DAGBAG, tmp_path, _AIRFLOW_PARSING_CONTEXT_DAG_ID="orders.upgrade", **env)
    assert list(one["dags"]) == ["orders.upgrade"] and one["errors"] == {}
    assert one["dags"]["orders.upgrade"] == everything["dags"]["orders.upgrade"]


def test_operators_survive_dag_serialization(tmp_path: Path) -> None:
    code = """
import json
from airflow.dag_processing.dagbag import DagBag
from airflow.serialization.serialized_objects import DagSerialization
bag = DagBag(dag_folder="dags")
out = {}
for dag_id, dag in bag.dags.items():
    data = json.loads(json.dumps(DagSerialization.to_dict(dag)))
    back = DagSerialization.from_dict(data)
    out[dag_id] = {t.task_id: {"type": t.task_type, "template_fields": list(t.template_fields),
                               "teardown": t.is_teardown} for t in back.tasks}
start = DagSerialization.from_dict(json.loads(json.dumps(
    DagSerialization.to_dict(bag.dags["keyed-totals.start"])))).get_task("start")
out["start_from"] = start.start_from
out["job"] = start.job
out["links"] = sorted(start.extra_links)
monitor = DagSerialization.from_dict(json.loads(json.dumps(
    DagSerialization.to_dict(bag.dags["keyed-totals.monitor"]))))
out["monitor_timetable"] = [type(monitor.timetable).__name__, monitor.timetable.summary]
print(json.dumps(out))
"""
    out = _python(code, tmp_path)
    start = out["keyed-totals.start"]["start"]
    assert start["type"] == "StartJobOperator"
    assert {"start_from", "checkpoint_id", "overrides", "takeover"} <= set(start["template_fields"])
    assert out["start_from"] == "{{ params.start_from }}" and out["job"] == "keyed-totals"
    assert out["links"] == ["Driver log", "Spark UI", "Streaming job"]  # what the API shows
    monitor = out["keyed-totals.monitor"]
    assert monitor["check"]["type"] == "JobHealthOperator"
    assert monitor["restart"]["type"] == "RestartJobOperator" and monitor["restart"]["teardown"]
    assert out["monitor_timetable"] == ["AssetOrTimeSchedule", "Asset or 0 0 * * *"]
    assert out["keyed-totals.savepoint"]["savepoint"]["type"] == "SavepointOperator"
    assert out["keyed-totals.stop"]["stop"]["type"] == "StopJobOperator"
    upgrade = out["keyed-totals.upgrade"]
    assert upgrade["start_green"]["type"] == "StartGreenOperator"
    assert "upgrade_id" in upgrade["probation"]["template_fields"]
    assert out["keyed-totals.rollback"]["rollback"]["type"] == "RollbackOperator"


def test_the_installed_provider_declares_what_its_project_does() -> None:
    """The venv's provider distribution carries provider/pyproject.toml's entry points (a
    stale install would register another provider or no plugin)."""
    from importlib.metadata import distribution

    project = tomllib.loads((REPO / "provider" / "pyproject.toml").read_text())["project"]
    installed = distribution(project["name"]).entry_points
    for group, points in project["entry-points"].items():
        assert {(e.name, e.value) for e in installed.select(group=group)} == set(points.items())
    assert set(project["entry-points"]) == {"apache_airflow_provider", "airflow.plugins"}


def test_the_provider_is_registered_and_the_plugin_loads(tmp_path: Path) -> None:
    code = """
import json
from airflow.providers_manager import ProvidersManager
from airflow import plugins_manager
manager = ProvidersManager()
info = manager.providers["airflow-provider-streamkeeper"]
hook = manager.hooks.get("streamkeeper")
triggers = sorted(t.trigger_class_name for t in manager.trigger if "streamkeeper" in t.package_name)
plugins, errors = plugins_manager._get_plugins()
page = [p for p in plugins if p.name == "streamkeeper"]
print(json.dumps({
    "plugin_class": type(page[0]).__module__ if page else None,
    "plugin_views": [v["name"] for v in page[0].external_views] if page else [],
    "plugin_apps": [a["url_prefix"] for a in page[0].fastapi_apps] if page else [],
    "version": info.version,
    "hook": hook.hook_class_name if hook else None,
    "connection_types": [c["connection-type"] for c in info.data["connection-types"]],
    "trigger_modules": triggers,
    "plugins": sorted(p.name for p in plugins),
    "plugin_errors": errors,
}))
"""
    out = _python(code, tmp_path, AIRFLOW__CORE__PLUGINS_FOLDER=str(REPO / "plugins"))
    assert out["version"] == "0.1.0" and out["connection_types"] == ["streamkeeper"]
    assert out["hook"] == "streamkeeper_airflow.hooks.streamkeeper.StreamkeeperHook"
    assert out["trigger_modules"] == [
        "streamkeeper_airflow.triggers.checkpoints",
        "streamkeeper_airflow.triggers.commands",
        "streamkeeper_airflow.triggers.commits",
        "streamkeeper_airflow.triggers.health",
    ]
    # The provider's entry point loads the plugin, once, beside the plugins folder.
    assert out["plugins"].count("streamkeeper") == 1 and out["plugin_errors"] == {}
    assert out["plugin_class"] == "streamkeeper_airflow.plugin"
    assert out["plugin_views"] == ["Streaming jobs"] and out["plugin_apps"] == ["/streamkeeper"]


@pytest.mark.parametrize("action", ACTIONS)
def test_each_dag_file_is_thin(action: str) -> None:
    text = (REPO / "dags" / f"{action}.py").read_text()
    code = [line for line in text.splitlines() if line and not line.startswith(("#", '"'))]
    assert len(text.splitlines()) < 20 and "generate(" in text, code


def _monitor(tmp_path: Path, **airflow: object) -> Any:
    """The monitor DAG of the sample spec with `airflow.*` overrides, built in-process."""
    from streamkeeper.spec import load_spec
    from streamkeeper_airflow.dag_factory import JobEntry, monitor_dag

    overrides = {f"airflow.{key}": value for key, value in airflow.items()}
    path = REPO / "jobs/keyed_totals/job.yaml"
    return monitor_dag(JobEntry(path, load_spec(path, overrides)))


def test_the_monitor_runs_on_health_changes_and_keeps_the_cron_as_an_opt_in(
    tmp_path: Path,
) -> None:
    from airflow.sdk import Asset, AssetOrTimeSchedule

    from streamkeeper_airflow.triggers.health import JobHealthTrigger

    events = _monitor(tmp_path, monitor_poll_interval="20s")
    assert isinstance(events.timetable, AssetOrTimeSchedule)
    assert events.timetable.timetable.expression == "0 0 * * *"  # the daily safety net
    (health,) = events.timetable.asset_condition.objects
    assert (health.name, health.uri) == (
        "keyed-totals.health",
        "streamkeeper://keyed-totals/health",
    )
    trigger = health.watchers[0].trigger
    assert isinstance(trigger, JobHealthTrigger)
    assert (trigger.job, trigger.conn_id, trigger.poll_interval) == (
        "keyed-totals", "streamkeeper_default", 20.0,
    )  # fmt: skip
    assert sorted(events.task_ids) == ["check", "restart"]

    no_net = _monitor(tmp_path, monitor_safety_net=None)
    assert [type(a) for a in no_net.timetable.asset_condition.objects] == [Asset]
    polling = _monitor(tmp_path, monitor="schedule", monitor_schedule="*/10 * * * *")
    assert polling.timetable.expression == "*/10 * * * *"  # the previous way, as it was


@pytest.mark.parametrize(
    ("field", "value", "fix"),
    [
        ("monitor", "cron", "'events' or 'schedule'"),
        ("monitor_safety_net", "daily", "expected a cron expression"),
        ("monitor_poll_interval", "0s", "expected a duration such as '15s'"),
    ],
)
def test_a_bad_monitor_setting_names_the_field_and_the_fix(
    tmp_path: Path, field: str, value: str, fix: str
) -> None:
    from streamkeeper.errors import SpecError

    with pytest.raises(SpecError, match=rf"airflow\.{field}: .*{fix}"):
        _monitor(tmp_path, **{field: value})


def test_tasks_that_launch_drivers_run_on_the_gateway_queue_and_the_rest_anywhere() -> None:
    """`airflow.launch_queue`: a Celery worker on the Spark gateway serves it, so the
    drivers it launches run there; waits, checks and commands stay on any worker."""
    from airflow.configuration import conf

    from streamkeeper.spec import load_spec
    from streamkeeper_airflow import dag_factory
    from streamkeeper_airflow.dag_factory import JobEntry

    path = REPO / "jobs/keyed_totals/job.yaml"
    pinned = JobEntry(path, load_spec(path, {"airflow.launch_queue": "spark-gateway"}))
    default_queue = conf.get("operators", "default_queue")
    launching = {("start", "start"), ("monitor", "restart"), ("upgrade", "start_green")}
    launching |= {("upgrade", "rollback"), ("rollback", "rollback")}
    seen = set()
    for action in ("start", "monitor", "upgrade", "rollback", "savepoint", "stop"):
        dag = getattr(dag_factory, f"{action}_dag")(pinned)
        for task in dag.tasks:
            expected = "spark-gateway" if (action, task.task_id) in launching else default_queue
            assert task.queue == expected, (action, task.task_id, task.queue)
            seen |= {(action, task.task_id)} & launching
    assert seen == launching
    unpinned = JobEntry(path, load_spec(path))
    assert {t.queue for t in dag_factory.start_dag(unpinned).tasks} == {default_queue}
    from streamkeeper.errors import SpecError

    with pytest.raises(SpecError, match=r"airflow\.launch_queue"):
        load_spec(path, {"airflow.launch_queue": "no spaces please"})


def test_a_specs_launcher_options_reach_the_launcher_the_run_picks() -> None:
    from streamkeeper.spec import load_spec
    from streamkeeper_airflow import dag_factory
    from streamkeeper_airflow.dag_factory import JobEntry

    path = REPO / "jobs/keyed_totals/job.yaml"
    ssh = {"ssh_conn_id": "spark_gateway", "remote_python": "/opt/sk/bin/python"}
    spec = load_spec(path, {"airflow.launcher": "ssh", "airflow.launcher_options": {"ssh": ssh}})
    for action, task_id in (("start", "start"), ("monitor", "restart"), ("rollback", "rollback")):
        task = getattr(dag_factory, f"{action}_dag")(JobEntry(path, spec)).get_task(task_id)
        assert task.options_of("ssh") == ssh and task.options_of("embedded") == {}, action
    from streamkeeper.errors import SpecError

    with pytest.raises(SpecError, match=r"airflow\.launcher_options"):
        load_spec(path, {"airflow.launcher_options": {"telnet": {}}})
