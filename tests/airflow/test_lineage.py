"""OpenLineage of the operators (streamkeeper_airflow/lineage.py): the datasets named from
a spec, the run, savepoint and upgrade facets, the parent run the driver is given, and a
provider that still imports and runs without apache-airflow-providers-openlineage.

The events through a real scheduler (file transport) are in test_scheduler_runs.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from streamkeeper.spec import load_spec, parse_spec
from streamkeeper_airflow import lineage

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "jobs" / "keyed_totals"
JOB = "keyed-totals"
LOGICAL_DATE = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


def _spec(**source: Any) -> Any:
    return parse_spec(
        {
            "name": JOB,
            "source": source,
            "transform": "transform:build",
            "sinks": [
                {"name": "totals"},
                {"name": "archive", "table": "s3://archive-bucket/keyed/totals"},
                {"name": "local", "table": "/srv/tables/local"},
            ],
        }
    )


def _pairs(datasets: list[Any]) -> list[tuple[str, str]]:
    return [(d.namespace, d.name) for d in datasets]


# -- datasets -----------------------------------------------------------------------------


def test_locations_are_named_as_openlineage_names_storage(tmp_path: Path) -> None:
    assert lineage.location_name("s3://bucket/a/b/") == ("s3://bucket", "a/b")
    assert lineage.location_name("file:///data/t") == ("file", "/data/t")
    assert lineage.location_name("/data/t") == ("file", "/data/t")
    assert lineage.location_name("events", str(tmp_path)) == ("file", str(tmp_path / "events"))


def test_each_source_kind_is_a_dataset_but_generated_rows(tmp_path: Path) -> None:
    folder = _spec(type="file", path="in/events", schema="k STRING").source
    assert lineage.source_name(folder, str(tmp_path)) == ("file", str(tmp_path / "in" / "events"))
    nats = _spec(type="nats", url="nats://127.0.0.1:4333", stream="EVENTS").source
    assert lineage.source_name(nats) == ("nats://127.0.0.1:4333", "EVENTS")
    subject = _spec(type="nats", url="nats://broker", stream="EVENTS", subject="events.eu").source
    assert lineage.source_name(subject) == ("nats://broker:4222", "EVENTS/events.eu")
    delta = _spec(type="delta", table="s3://lake/upstream/totals").source
    assert lineage.source_name(delta) == ("s3://lake", "upstream/totals")
    assert lineage.source_name(_spec(type="rate").source) is None


def test_each_sink_is_its_table_below_the_root_or_where_it_says() -> None:
    spec = _spec(type="rate")
    assert lineage.sink_names(spec, "s3://bucket/prefix") == {
        "totals": ("s3://bucket", "prefix/tables/totals"),
        "archive": ("s3://archive-bucket", "keyed/totals"),
        "local": ("file", "/srv/tables/local"),
    }
    assert lineage.sink_names(spec, "/var/data")["totals"] == ("file", "/var/data/tables/totals")


def test_the_job_lineage_has_the_source_in_and_the_tables_out(tmp_path: Path) -> None:
    spec = load_spec(SAMPLE / "job.yaml", {"source.path": str(tmp_path / "events")})
    found = lineage.job_lineage(spec, str(tmp_path / "data"), workdir="/elsewhere")
    assert _pairs(found.inputs) == [("file", str(tmp_path / "events"))]
    assert _pairs(found.outputs) == [
        ("file", str(tmp_path / "data" / sink.table_path)) for sink in spec.sinks
    ]
    assert found.run_facets == {}
    assert lineage.job_lineage(None).inputs == []


# -- run facets ---------------------------------------------------------------------------


def _json(facet: Any) -> dict[str, Any]:
    from openlineage.client.serde import Serde

    return json.loads(Serde.to_json(facet))


def test_the_run_facet_is_the_run_the_trigger_followed() -> None:
    event = {
        "status": "success",
        "run_token": "af-0123",
        "status_report": {
            "state": "RUNNING",
            "last_committed_seq": 7,
            "runner": {"epoch": 4, "run_token": "af-0123"},
        },
    }
    facets = lineage.run_facet(JOB, event, start_from="checkpoint", checkpoint_id=12)
    facet = _json(facets[lineage.RUN_FACET])
    assert facet["runToken"] == "af-0123" and facet["epoch"] == 4
    assert (facet["startFrom"], facet["checkpointId"], facet["lastCommittedSeq"]) == (
        "checkpoint",
        "12",
        7,
    )
    assert facet["_schemaURL"] and facet["_producer"]
    assert lineage.run_facet(JOB, None) == {}  # a start that never ran: no run to name


def test_run_tokens_pass_the_redaction_of_token_like_fields() -> None:
    """The listener masks values of fields named like secrets ("token"): a run token is a
    hash of the task instance's ids, which the control plane and XComs show anyway."""
    from airflow.providers.openlineage.utils.utils import OpenLineageRedactor

    redactor = OpenLineageRedactor()
    redactor.sensitive_variables_fields = ["token", "password"]
    event = {"run_token": "af-1", "status_report": {"runner": {"epoch": 1}}}
    facet = lineage.run_facet(JOB, event)[lineage.RUN_FACET]
    assert redactor.redact(facet, max_depth=20).runToken == "af-1"
    assert redactor.redact({"runToken": "af-1"}, max_depth=20) == {"runToken": "***"}


def test_the_savepoint_facet_comes_from_the_commands_answer() -> None:
    event = {
        "status": "success",
        "savepoint_id": "sp-20261127-1",
        "command_id": "savepoint-af-1",
        "result": {
            "state": "ok",
            "details": {"format": "canonical", "storage": "self_contained", "seq": 9},
        },
    }
    facet = _json(lineage.savepoint_facet(JOB, "savepoint", event)[lineage.SAVEPOINT_FACET])
    assert facet["savepointId"] == "sp-20261127-1"
    assert (facet["format"], facet["storage"], facet["seq"]) == ("canonical", "self_contained", 9)
    assert (facet["command"], facet["commandId"]) == ("savepoint", "savepoint-af-1")
    cancelled = {"status": "success", "savepoint_id": None, "result": {"state": "ok"}}
    assert lineage.savepoint_facet(JOB, "cancel", cancelled) == {}


def test_the_upgrade_facet_is_the_record_blue_green_and_the_handover() -> None:
    from streamkeeper.upgrade.record import UpgradeRecord

    record = UpgradeRecord(
        id="up-1",
        job=JOB,
        lineage=JOB,
        phase="promoted",
        blue={"run_token": "af-blue", "savepoint": "sp-0"},
        green={"run_token": "af-green", "shadow_job": f"{JOB}--green-up-1"},
        handover={"blue_savepoint": "sp-1", "seq": 42, "gap_s": 1.25},
    )
    facet = _json(lineage.upgrade_facet(record)[lineage.UPGRADE_FACET])
    assert (facet["upgradeId"], facet["phase"]) == ("up-1", "promoted")
    assert (facet["blueRunToken"], facet["greenRunToken"]) == ("af-blue", "af-green")
    assert (facet["handoverSavepointId"], facet["handoverSeq"], facet["gapSeconds"]) == (
        "sp-1",
        42,
        1.25,
    )
    assert lineage.upgrade_facet(None) == {}


# -- the parent run -----------------------------------------------------------------------


@pytest.fixture
def openlineage_on(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """OpenLineage enabled (a console transport); the provider does not cache its settings
    under pytest (PYTEST_VERSION), and any cache there is is cleared around the test."""
    from airflow.providers.openlineage import conf

    def clear() -> None:
        for value in vars(conf).values():
            if hasattr(value, "cache_clear"):
                value.cache_clear()

    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__TRANSPORT", '{"type": "console"}')
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__NAMESPACE", "sk-tests")
    clear()
    yield
    monkeypatch.undo()
    clear()


def _context(task_id: str = "start") -> dict[str, Any]:
    dag_run = SimpleNamespace(
        logical_date=LOGICAL_DATE, run_after=LOGICAL_DATE, clear_number=0, conf={}
    )
    ti = SimpleNamespace(
        dag_id=f"{JOB}.start",
        run_id="manual__lineage",
        task_id=task_id,
        map_index=-1,
        try_number=1,
        dag_run=dag_run,
        xcom_push=lambda **_kwargs: None,
    )
    ti.get_template_context = lambda: {"dag_run": dag_run, "ti": ti}
    return {"ti": ti, "dag_run": dag_run}


def test_the_parent_run_is_the_tasks_openlineage_run(openlineage_on: None) -> None:
    from airflow.providers.openlineage.plugins.adapter import OpenLineageAdapter

    conf = lineage.parent_run_spark_conf(_context(), {"spark.sql.shuffle.partitions": "2"})
    task_run = OpenLineageAdapter.build_task_instance_run_id(
        dag_id=f"{JOB}.start",
        task_id="start",
        try_number=1,
        logical_date=LOGICAL_DATE,
        map_index=-1,
    )
    dag_run = OpenLineageAdapter.build_dag_run_id(
        dag_id=f"{JOB}.start", logical_date=LOGICAL_DATE, clear_number=0
    )
    assert conf == {
        "spark.openlineage.parentJobNamespace": "sk-tests",
        "spark.openlineage.parentJobName": f"{JOB}.start.start",
        "spark.openlineage.parentRunId": str(task_run),
        "spark.openlineage.rootParentJobNamespace": "sk-tests",
        "spark.openlineage.rootParentJobName": f"{JOB}.start",
        "spark.openlineage.rootParentRunId": str(dag_run),
    }


def test_a_parent_named_by_the_spec_is_kept_and_disabled_lineage_adds_none(
    openlineage_on: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = {"spark.openlineage.parentRunId": "01890000-0000-7000-8000-000000000000"}
    assert lineage.parent_run_spark_conf(_context(), own) == {}
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__DISABLED", "true")  # read afresh: no cache
    assert lineage.parent_run_spark_conf(_context(), {}) == {}


def test_the_driver_gets_the_parent_as_spark_conf_on_its_command_line() -> None:
    from streamkeeper_airflow.launchers.base import LaunchRequest

    request = LaunchRequest(
        job=JOB,
        spec_path="/jobs/keyed_totals/job.yaml",
        root="/data",
        run_token="af-1",
        workdir="/work",
        spark_conf={"spark.openlineage.parentRunId": "run-1"},
    )
    args = request.run_args()
    at = args.index("spark.conf.spark.openlineage.parentRunId=run-1")
    assert args[at - 1] == "--set"
    spec = load_spec(SAMPLE / "job.yaml", {args[at].split("=")[0]: "run-1"})
    assert spec.spark.conf["spark.openlineage.parentRunId"] == "run-1"  # as the runtime loads it


# -- the start operator -------------------------------------------------------------------


@pytest.fixture
def start(tmp_path: Path, conn_env: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    from streamkeeper_airflow.operators.start import StartJobOperator

    jobs = tmp_path / "jobs"
    shutil.copytree(SAMPLE, jobs / "keyed_totals")
    conn_env("sk_lineage", str(tmp_path / "data"))
    for name in ("TRIGGER_OVERRIDES", "SPARK_MASTERS", "JOBS_FOLDER", "SPEC_FOLDERS"):
        monkeypatch.delenv(f"AIRFLOW__STREAMKEEPER__{name}", raising=False)
    monkeypatch.setenv("AIRFLOW__STREAMKEEPER__TRIGGER_OVERRIDES", "source.path")
    return StartJobOperator(
        task_id="start",
        job=JOB,
        spec_path=str(jobs / "keyed_totals" / "job.yaml"),
        conn_id="sk_lineage",
        workdir=str(tmp_path / "work"),
        overrides={"source.path": str(tmp_path / "events")},
        openlineage_inject_parent_job_info=True,
    )


def test_the_start_names_its_datasets_then_its_run(start: Any, tmp_path: Path) -> None:
    on_start = start.get_openlineage_facets_on_start()
    assert _pairs(on_start.inputs) == [("file", str(tmp_path / "events"))]
    assert _pairs(on_start.outputs) == [
        ("file", str(tmp_path / "data" / "tables" / name)) for name in ("totals", "changes")
    ]
    start.execute_complete(_context(), {"status": "success", "run_token": "af-9"})
    done = start.get_openlineage_facets_on_complete(None)
    assert _pairs(done.outputs) == _pairs(on_start.outputs)
    assert done.run_facets[lineage.RUN_FACET].runToken == "af-9"


def test_the_start_launches_with_the_parent_run_when_lineage_is_on(
    start: Any, openlineage_on: None
) -> None:
    request = start.launch_request(_context())
    assert request.spark_conf["spark.openlineage.parentJobName"] == f"{JOB}.start.start"
    assert set(request.spark_conf) == {
        f"spark.openlineage.{key}"
        for key in ("parentJobNamespace", "parentJobName", "parentRunId")
        + ("rootParentJobNamespace", "rootParentJobName", "rootParentRunId")
    }
    start.openlineage_inject_parent_job_info = False  # the Spark provider's switch, off
    assert start.launch_request(_context()).spark_conf == {}


def test_the_savepoint_and_upgrade_tasks_name_what_they_did(tmp_path: Path, conn_env: Any) -> None:
    from streamkeeper.storage import LocalStore
    from streamkeeper.upgrade.record import UpgradeRecord, UpgradeRecords
    from streamkeeper_airflow.operators.commands import StopJobOperator
    from streamkeeper_airflow.operators.upgrade import UpgradeOutcomeOperator

    conn_env("sk_lineage", str(tmp_path))
    stop = StopJobOperator(task_id="stop", job=JOB, conn_id="sk_lineage", format="canonical")
    answer = {"format": "canonical", "storage": "pinned", "seq": 3}
    stop.execute_complete(
        _context("stop"),
        {"status": "success", "savepoint_id": "sp-2", "result": {"details": answer}},
    )
    facet = stop.get_openlineage_facets_on_complete(None).run_facets[lineage.SAVEPOINT_FACET]
    assert (facet.savepointId, facet.format, facet.command) == ("sp-2", "canonical", "stop")

    record = UpgradeRecord(
        id="up-2", job=JOB, lineage=JOB, phase="rolled_back", blue={}, green={}, reason="probation"
    )
    UpgradeRecords(LocalStore(tmp_path), JOB).create(record)
    outcome = UpgradeOutcomeOperator(
        task_id="outcome", job=JOB, upgrade_id="up-2", conn_id="sk_lineage"
    )
    facet = outcome.get_openlineage_facets_on_complete(None).run_facets[lineage.UPGRADE_FACET]
    assert (facet.upgradeId, facet.phase, facet.reason) == ("up-2", "rolled_back", "probation")


def test_the_provider_runs_without_the_openlineage_provider(tmp_path: Path) -> None:
    """Nothing but the facets changes: the operators import, and answer None."""
    code = """
import importlib.abc, sys

class Absent(importlib.abc.MetaPathFinder):  # all but the provider list's entry point
    def find_spec(self, name, path=None, target=None):
        if name == "openlineage" or name.startswith("openlineage."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        provider = name.startswith("airflow.providers.openlineage.")
        if provider and not name.endswith(".get_provider_info"):
            raise ModuleNotFoundError(f"No module named {name!r}")

sys.meta_path.insert(0, Absent())
from streamkeeper_airflow import lineage
from streamkeeper_airflow.operators import commands, start, upgrade

assert not lineage.available() and not lineage.inject_parent_job_info_default()
op = commands.SavepointOperator(task_id="savepoint", job="keyed-totals")
assert op.get_openlineage_facets_on_complete(None) is None
assert lineage.parent_run_spark_conf({}, {}) == {}
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]
