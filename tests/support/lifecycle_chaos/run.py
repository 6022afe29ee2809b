"""One lifecycle chaos run: `keyed-totals` upgraded blue-green through the real Airflow
components, with one scenario's faults, then drained and checked exactly.

1. A fresh world (world.py): a SQLite metadata DB, the api-server, scheduler
   (LocalExecutor: each task in its own process), dag-processor and triggerer on
   127.0.0.1 (infra/components/airflow.py), the scenario's fault environment in
   theirs; input arriving every 2 s.
2. `keyed-totals.start` (blue), then `keyed-totals.upgrade` to green with a short
   probation; the orchestrator faults are made when their moment comes, and green is
   armed to fail its probation once the handover is requested (a failing green).
3. The upgrade run must end by itself (no manual step), the upgrade `promoted` or
   `rolled_back` as the scenario expects, and the fault must have fired.
4. The input stops; the job drains (if it runs) and is stopped by `keyed-totals.stop`;
   every table is checked exactly against the input (checks.py), every Delta log audited,
   and nothing may be left behind (orphans, a driver still running).

`LifecycleRun(scenario, base).run()` returns the `RunReport`; nothing raises out of it.
"""

from __future__ import annotations

import contextlib
import os
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tests.support.lifecycle_chaos.scenarios import Scenario
from tests.support.lifecycle_chaos.world import JOB, Feeder, World

FAST = {"probation_checkpoints": 2, "shadow_checkpoints": 2, "validation_timeout": 300}
HANDOVER_TIMEOUT = 240  # green's first live batch comes within a minute when all is well
UPGRADE_DEADLINE = 20 * 60.0  # the upgrade run must end by itself within this
DRAIN_TIMEOUT = 300.0


@dataclass
class RunReport:
    scenario: str
    kind: str
    expected: str
    outcome: str | None = None  # the upgrade's phase when its DAG run ended
    dag_state: str | None = None
    tasks: dict[str, str] = field(default_factory=dict)  # task -> "state (try n)"
    errors: dict[str, list[str]] = field(default_factory=dict)  # task -> each try's exception
    reason: str | None = None
    probation: str | None = None
    fault: dict[str, Any] = field(default_factory=dict)  # what fired, where
    job_state: str | None = None  # after the upgrade run
    drained: bool = False
    tables: list[dict[str, Any]] = field(default_factory=list)
    tables_audited: int = 0
    audit_problems: list[str] = field(default_factory=list)
    orphans: dict[str, list[str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0
    workdir: str = ""

    @property
    def exact(self) -> bool:
        return bool(self.tables) and all(t["exact"] for t in self.tables)

    @property
    def ok(self) -> bool:
        return (
            not self.problems
            and self.outcome == self.expected
            and self.exact
            and not self.audit_problems
            and not self.orphans
        )

    def failures(self) -> list[str]:
        """What failed, each naming the point, the task or the table."""
        found = list(self.problems)
        if self.outcome != self.expected:
            tasks = ", ".join(f"{t} {s}" for t, s in self.tasks.items())
            errors = "; ".join(f"{t} {e[-1]}" for t, e in self.errors.items() if e)
            found.append(
                f"the upgrade ended {self.outcome} ({self.reason}), expected {self.expected}; "
                f"tasks: {tasks}" + (f"; errors: {errors}" if errors else "")
            )
        from tests.support.lifecycle_chaos.checks import TableCheck

        found += [TableCheck(**t).summary() for t in self.tables if not t["exact"]]
        found += [f"audit: {p}" for p in self.audit_problems[:5]]
        found += [f"left behind ({kind}): {v[:3]}" for kind, v in self.orphans.items()]
        return found

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "exact": self.exact, "ok": self.ok, "failures": self.failures()}


class LifecycleRun:
    def __init__(self, scenario: Scenario, base: Path) -> None:
        self.scenario = scenario
        self.world = World(base.resolve())
        self.report = RunReport(scenario.name, scenario.kind, scenario.outcome)
        self.report.workdir = str(self.world.base)
        self.started = time.monotonic()
        self.services: Any = None
        self.feeder: Feeder | None = None

    def say(self, message: str) -> None:
        elapsed = time.monotonic() - self.started
        print(f"[lifecycle {self.scenario.name} {elapsed:6.1f}s] {message}", flush=True)

    @property
    def client(self) -> Any:
        from streamkeeper.client import StreamkeeperClient

        return StreamkeeperClient(str(self.world.root))

    # -- the run ---------------------------------------------------------------------------

    def run(self) -> RunReport:
        try:
            self.setup()
            self.start_blue()
            run_id = self.upgrade()
            self.conclude(run_id)
            self.drain_and_stop()
            self.check()
        except Exception as error:  # noqa: BLE001 - reported, the run ends with its report
            self.report.problems.append(f"the run stopped: {error!r}")
            traceback.print_exc()
        finally:
            self.teardown()
        self.report.seconds = round(time.monotonic() - self.started, 1)
        return self.report

    def setup(self) -> None:
        from infra.components.airflow import start_airflow
        from tests.support.airflow_runs import migrate_metadata_db

        self.world.prepare(self.scenario)
        os.environ.update(self.world.process_environment())
        seconds = migrate_metadata_db()
        self.services = start_airflow(
            self.world.airflow_home, self.world.fault_environment(self.scenario)
        )
        self.feeder = Feeder(self.world.events)
        self.feeder.start()
        self.say(f"metadata DB in {seconds:.0f} s; Airflow on port {self.services.port}")

    def _dag(self, dag_id: str, conf: dict[str, Any], timeout: float) -> tuple[str, str]:
        from tests.support.lifecycle_chaos.airflow_control import trigger_dag, wait_finished

        run_id = trigger_dag(self.world.airflow_home, self.services.port, dag_id, conf)
        state = wait_finished(dag_id, run_id, timeout)
        self.say(f"DAG {dag_id}: {state}")
        return run_id, state

    def start_blue(self) -> None:
        conf = {"overrides": self.world.overrides, "new_checkpoints": 2}
        run_id, state = self._dag(f"{JOB}.start", conf, 600)
        if state != "success":
            raise RuntimeError(f"blue did not start: {self._tasks(f'{JOB}.start', run_id)}")

    def upgrade(self) -> str:
        """Trigger the upgrade and make the faults until its run ends by itself."""
        from tests.support.lifecycle_chaos.airflow_control import (
            run_state,
            task_states,
            trigger_dag,
        )
        from tests.support.lifecycle_chaos.orchestrator import OrchestratorFaults

        conf = {
            "green_spec_path": str(self.world.green_spec),
            "probation_seconds": self.scenario.probation_seconds,
            "handover_timeout": HANDOVER_TIMEOUT,
            **FAST,
        }
        dag_id = f"{JOB}.upgrade"
        run_id = trigger_dag(self.world.airflow_home, self.services.port, dag_id, conf)
        self.say(f"upgrade {run_id} triggered")
        faults = OrchestratorFaults(self.scenario.actions, self.services, self.say)
        deadline = time.monotonic() + UPGRADE_DEADLINE
        while (state := run_state(dag_id, run_id)) not in ("success", "failed"):
            if time.monotonic() > deadline:
                self.report.problems.append(
                    f"the upgrade run was still {state} after {UPGRADE_DEADLINE:.0f} s: "
                    f"{self._tasks(dag_id, run_id)}"
                )
                break
            phase = self._phase()
            if self.scenario.failing_green and phase not in (None, "shadow", "rejected"):
                self.world.bomb.touch()  # green's live batches go wrong from here
            faults.tick(task_states(dag_id, run_id), phase)
            time.sleep(0.5)
        self.report.dag_state = state
        self.report.fault.update(faults.done)
        for action in faults.pending:
            self.report.problems.append(f"fault {action} was never made: its moment never came")
        return run_id

    def _phase(self) -> str | None:
        from streamkeeper.upgrade.record import UpgradeRecords

        with contextlib.suppress(Exception):  # mid-write: the next tick reads it
            records = UpgradeRecords(self.client.store, JOB).list()
            return records[-1].phase if records else None
        return None

    def _tasks(self, dag_id: str, run_id: str) -> dict[str, str]:
        from tests.support.lifecycle_chaos.airflow_control import task_states

        return {
            t: f"{s.state} (try {s.try_number})" for t, s in task_states(dag_id, run_id).items()
        }

    def conclude(self, run_id: str) -> None:
        """What the upgrade run ended as, and whether the scenario's crash fired."""
        from streamkeeper.upgrade.record import UpgradeRecords
        from tests.support.lifecycle_chaos.airflow_control import task_errors

        self.report.tasks = self._tasks(f"{JOB}.upgrade", run_id)
        self.report.errors = task_errors(self.world.airflow_home, f"{JOB}.upgrade", run_id)
        records = UpgradeRecords(self.client.store, JOB).list()
        if records:
            record = records[-1]
            self.report.outcome = record.phase
            self.report.reason = record.reason
            self.report.probation = (record.probation or {}).get("reason")
        if self.scenario.crash_at:
            marker = self.world.crash_marker
            fired = marker.read_text().strip() if marker.exists() else None
            self.report.fault["crash"] = fired
            if fired is None:
                self.report.problems.append(
                    f"crash point {self.scenario.crash_at} was never reached (no fault fired)"
                )
        self.report.job_state = self.client.status(JOB).state
        self.say(
            f"upgrade ended {self.report.outcome} ({self.report.reason}); job "
            f"{self.report.job_state}; tasks {self.report.tasks}; faults {self.report.fault}"
        )

    def drain_and_stop(self) -> None:
        """Stop the input; a running job must catch up with it; then the stop DAG."""
        from jobs.keyed_totals.sample_events import expected_results
        from tests.support.lifecycle_chaos.checks import _rows

        assert self.feeder is not None
        files = self.feeder.stop()
        if self.report.job_state not in ("RUNNING", "DEGRADED"):
            self.report.problems.append(
                f"the job is {self.report.job_state} after the upgrade run: not drained"
            )
            return
        totals, _ = expected_results(files)
        deadline = time.monotonic() + DRAIN_TIMEOUT
        table = self.world.root / "tables" / "totals"
        while time.monotonic() < deadline:
            found = {r["key"]: (r["events"], r["total"]) for r in _rows(table)}
            if found == totals:
                self.report.drained = True
                break
            time.sleep(3)
        if not self.report.drained:
            state = self.client.status(JOB).state
            self.report.problems.append(
                f"the job ({state}) did not catch up with the input within {DRAIN_TIMEOUT:.0f} s"
            )
        _, stopped = self._dag(f"{JOB}.stop", {"mode": "stop", "savepoint": False}, 600)
        if stopped != "success":
            self.report.problems.append(f"the stop DAG ended {stopped}")

    def check(self) -> None:
        from tests.support.lifecycle_chaos.checks import audit_and_leftovers, check_tables

        assert self.feeder is not None
        self._stop_drivers(report=True)
        checks = check_tables(
            self.world.root, self.feeder.files, promoted=self.report.outcome == "promoted"
        )
        self.report.tables = [c.to_json() for c in checks]
        audited, problems, orphans = audit_and_leftovers(self.world.root, self.world.checkpoint)
        self.report.tables_audited = audited
        self.report.audit_problems = problems
        self.report.orphans = orphans
        for check in checks:
            self.say(check.summary())

    def _stop_drivers(self, *, report: bool) -> None:
        """Every driver a launch record or heartbeat names (the job's, green's shadow
        job's): one still running a minute after the stop DAG is reported as left behind."""
        import psutil

        from tests.support.airflow_runs import stop_driver

        drivers = self._drivers()
        if report:
            _, alive = psutil.wait_procs(list(drivers), timeout=60)
            for process in alive:
                self.report.problems.append(
                    f"driver {process.pid} of {drivers[process]} still ran after the stop DAG"
                )
        for process in drivers:
            stop_driver(process.pid, grace=30)

    def _drivers(self) -> dict[Any, str]:
        """Live driver processes named by any job's launch record or heartbeat -> job."""
        import psutil

        found = {}
        jobs = self.world.root / "jobs"
        for folder in sorted(jobs.iterdir()) if jobs.is_dir() else []:
            for name in ("launch.json", "heartbeat.json"):
                record = self.client.store.read_json(f"jobs/{folder.name}/{name}") or {}
                with contextlib.suppress(psutil.Error, KeyError, TypeError, ValueError):
                    process = psutil.Process(int(record["pid"]))
                    if "streamkeeper" in " ".join(process.cmdline()):  # not a reused pid
                        found[process] = folder.name
        return found

    def teardown(self) -> None:
        if self.feeder is not None:
            self.feeder.stop()
        with contextlib.suppress(Exception):
            self._stop_drivers(report=False)
        if self.services is not None:
            self.services.stop()
