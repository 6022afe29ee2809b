"""Where one lifecycle chaos run lives: its folders, specs, input and environment.

{base}/data        the storage root (local): control plane, lineages, tables
{base}/events      the input, a file every `period` seconds (Feeder)
{base}/checkpoint  the job's Spark checkpoint directory
{base}/jobs        the jobs folder the DAGs are generated from (the sample job's copy,
                   without schedules: only the runs the harness triggers happen)
{base}/green       green's spec: v2, or v2 with a transform that fails its probation
{base}/airflow     AIRFLOW_HOME (SQLite) and each component's log
{base}/drivers     the drivers' working directory and logs
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

from jobs.keyed_totals.sample_events import write_event_files
from tests.support.lifecycle_chaos.scenarios import Scenario

REPO = Path(__file__).resolve().parents[3]
SAMPLE = REPO / "jobs" / "keyed_totals"
BOMB = REPO / "tests" / "airflow" / "jobs" / "bomb_totals.py"
JOB = "keyed-totals"


@dataclass(frozen=True)
class World:
    base: Path

    @property
    def root(self) -> Path:
        return self.base / "data"

    @property
    def events(self) -> Path:
        return self.base / "events"

    @property
    def checkpoint(self) -> Path:
        return self.base / "checkpoint"

    @property
    def airflow_home(self) -> Path:
        return self.base / "airflow"

    @property
    def green_spec(self) -> Path:
        return self.base / "green" / "green.yaml"

    @property
    def bomb(self) -> Path:
        """Green's live batches go wrong once this file exists (bomb_totals.py)."""
        return self.base / "bomb"

    @property
    def crash_marker(self) -> Path:
        """Written by the process a crash point killed (faults.py, STREAMKEEPER_CRASH_ONCE)."""
        return self.base / "crash-fired"

    @property
    def overrides(self) -> dict[str, str]:
        return {
            "source.path": str(self.events),
            "checkpoint.dir": str(self.checkpoint),
            "spark.master": "local[2]",
            "spark.shuffle_partitions": "2",
        }

    def prepare(self, scenario: Scenario) -> None:
        """Folders, three input files, the jobs folder and green's spec."""
        for folder in (self.root, self.events, self.airflow_home, self.base / "drivers"):
            folder.mkdir(parents=True, exist_ok=True)
        write_event_files(self.events, files=3, events_per_file=200)
        jobs = self.base / "jobs" / "keyed_totals"
        shutil.copytree(SAMPLE, jobs, ignore=shutil.ignore_patterns("__pycache__"))
        spec = jobs / "job.yaml"
        text = re.sub(r"(monitor|savepoint)_schedule: .*", r"\1_schedule: null", spec.read_text())
        # nor a monitor run on the health changes it causes (events mode's watcher)
        text = re.sub(r"(?m)^(\s*)monitor: .*", r"\1monitor: schedule", text)
        spec.write_text(text)
        green = self.green_spec.parent
        green.mkdir(parents=True, exist_ok=True)
        transform = BOMB if scenario.failing_green else SAMPLE / "versions" / "transform_v2.py"
        shutil.copy(transform, green / transform.name)
        v2 = (SAMPLE / "versions" / "v2.yaml").read_text()
        self.green_spec.write_text(v2.replace("transform_v2.py", transform.name))

    def process_environment(self) -> dict[str, str]:
        """For this process and, through it, every Airflow component: set before Airflow
        is imported (it reads its home then)."""
        paths = [str(REPO / "src"), str(REPO), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
        connection = {"conn_type": "streamkeeper", "extra": {"root": str(self.root)}}
        return {
            "PYTHONPATH": os.pathsep.join(dict.fromkeys(p for p in paths if p)),
            "AIRFLOW_HOME": str(self.airflow_home),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__STREAMKEEPER__JOBS_FOLDER": str(self.base / "jobs"),
            "AIRFLOW__STREAMKEEPER__WORKDIR": str(self.base / "drivers"),
            "AIRFLOW__STREAMKEEPER__TRIGGER_OVERRIDES": "source.path, checkpoint.dir",
            "AIRFLOW__STREAMKEEPER__SPEC_FOLDERS": str(self.green_spec.parent),
            "AIRFLOW__STREAMKEEPER__ALERT_SINK": str(self.base / "alerts.jsonl"),
            "AIRFLOW_CONN_STREAMKEEPER_DEFAULT": json.dumps(connection),
            # A dead triggerer's triggers move to a live one after this many seconds
            # without its heartbeat (default 30); a task whose supervisor died with the
            # scheduler is failed after this many (default 300), found by a check this
            # often (default 300: a crashed scheduler's task waited 5 minutes for it).
            "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "15",
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "60",
            "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "30",
            "STREAMKEEPER_SPARK_LOG_LEVEL": "ERROR",
        }

    def fault_environment(self, scenario: Scenario) -> dict[str, str]:
        """For the Airflow components only: the task processes and the drivers they launch
        inherit it (the harness's own process reaches no crash point)."""
        env = {}
        if scenario.crash_at:
            env.update(
                STREAMKEEPER_INJECT="tests.support.faults",
                STREAMKEEPER_CRASH_AT=scenario.crash_at,
                STREAMKEEPER_CRASH_ONCE=str(self.crash_marker),
            )
        if scenario.failing_green:
            env["STREAMKEEPER_TEST_BOMB"] = str(self.bomb)
        return env


class Feeder(threading.Thread):
    """A new input file every `period` seconds until halted: input arrives all along (the
    job keeps up with a file every 2 s, one file a batch)."""

    def __init__(self, directory: Path, period: float = 2.0) -> None:
        super().__init__(daemon=True, name="feeder")
        self.directory = directory
        self.period = period
        self.files = sorted(directory.glob("events-*.json"))
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(self.period):
            self.files += write_event_files(
                self.directory, files=1, events_per_file=200, first_file=len(self.files)
            )

    def stop(self) -> list[Path]:
        self.halt.set()
        if self.is_alive():
            self.join()
        return list(self.files)
