"""The faults of the lifecycle chaos runs: one per run (or a few, combined), by name.

A scenario says which process is killed where, and which outcome of the upgrade DAG is
right. Every run upgrades `keyed-totals` to v2 through the real Airflow components; the
upgrade must end `promoted` or `rolled_back` by the DAGs alone, then the output is exact.

- **green**: `STREAMKEEPER_CRASH_AT` in every component's environment, which the drivers
  launched by the DAGs inherit; only green's driver reaches a handover point, and the
  `@live` commit points count from green's live run only (tests/support/faults.py).
  Green dies before it asked blue to stop: the upgrade fails, blue runs on; after: the
  right outcome is a rollback to blue (blue restarted from its stop savepoint).
- **rollback**: green fails its probation (its transform negates totals once armed, the
  quality gate on the live tables says no), and the rollback task's process kills itself
  at a rollback point; Airflow retries the task and the retry must finish the rollback.
- **orchestrator**: a healthy green, and an Airflow component or task process dies
  mid-upgrade; the retry or the new component must carry the upgrade to its promotion.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["green", "rollback", "orchestrator", "combined"]
Action = Literal[
    "kill_handover_task", "kill_triggerer_in_probation", "restart_scheduler", "kill_scheduler"
]
ACTIONS: tuple[str, ...] = (
    "kill_handover_task",  # SIGKILL the process running the handover task, mid-handover
    "kill_triggerer_in_probation",  # SIGKILL the triggerer while probation is deferred; a new one
    "restart_scheduler",  # stop the scheduler (SIGTERM, then SIGKILL) while a task runs; a new one
    "kill_scheduler",  # SIGKILL the scheduler's group (its task processes too) mid-handover
)


@dataclass(frozen=True)
class Scenario:
    """One lifecycle chaos run's faults and what the upgrade must end as.

    Args:
        name: the point, as the benchmark's table shows it.
        kind: green | rollback | orchestrator | combined (module doc).
        crash_at: `STREAMKEEPER_CRASH_AT` for every process the DAGs start (once per run).
        failing_green: green fails its probation (a rollback follows).
        actions: orchestrator faults the harness makes (ACTIONS).
        outcome: the upgrade's phase that is right.
        probation_seconds: green's probation (longer where a fault must land inside it).
    """

    name: str
    kind: Kind
    crash_at: str | None = None
    failing_green: bool = False
    actions: tuple[Action, ...] = field(default_factory=tuple)
    # failed: the upgrade ended before blue was stopped, and blue runs on untouched
    outcome: Literal["promoted", "rolled_back", "failed"] = "promoted"
    probation_seconds: int = 8

    def __post_init__(self) -> None:
        unknown = [a for a in self.actions if a not in ACTIONS]
        if unknown:
            raise ValueError(f"scenario {self.name!r}: unknown actions {unknown}; one of {ACTIONS}")


HANDOVER_POINTS = (
    "handover_before_blue_stop",
    "handover_after_stop_result",
    "handover_after_move",
    "handover_after_live",
)
# Green's first live commit: before it (commits/N written, no table committed), half of it
# (one table committed), and after it (in green's second live batch).
LIVE_COMMIT_POINTS = (
    "before_delta_commit:1@live",
    "between_table_commits:1@live",
    "batch_before_manifest:2@live",
)
ROLLBACK_POINTS = ("rollback_after_fence", "rollback_between_restores", "rollback_before_restart")


def _all() -> dict[str, Scenario]:
    # Green dead before it asked blue to stop: the stop is never sent, the upgrade fails
    # and blue runs on; after: blue restarted from its stop savepoint (upgrade/UPGRADE.md).
    found = [
        Scenario(
            point,
            "green",
            crash_at=point,
            outcome="failed" if point == "handover_before_blue_stop" else "rolled_back",
        )
        for point in (*HANDOVER_POINTS, *LIVE_COMMIT_POINTS)
    ]
    found += [
        Scenario(point, "rollback", crash_at=point, failing_green=True, outcome="rolled_back")
        for point in ROLLBACK_POINTS
    ]
    found += [
        Scenario("kill_handover_task", "orchestrator", actions=("kill_handover_task",)),
        Scenario(
            "kill_triggerer_in_probation",
            "orchestrator",
            actions=("kill_triggerer_in_probation",),
            probation_seconds=30,
        ),
        Scenario("restart_scheduler", "orchestrator", actions=("restart_scheduler",)),
        Scenario("kill_scheduler", "orchestrator", actions=("kill_scheduler",)),
        # The CI's run: the handover's task killed, the triggerer killed in probation, green
        # failing it, and the rollback's task killed between two table restores.
        Scenario(
            "combined",
            "combined",
            crash_at="rollback_between_restores",
            failing_green=True,
            actions=("kill_handover_task", "kill_triggerer_in_probation"),
            outcome="rolled_back",
        ),
    ]
    return {scenario.name: scenario for scenario in found}


SCENARIOS: dict[str, Scenario] = _all()
MATRIX: tuple[str, ...] = tuple(name for name in SCENARIOS if name != "combined")


def scenario(name: str) -> Scenario:
    """The scenario `name`.

    Raises:
        KeyError: naming the known ones.
    """
    if name not in SCENARIOS:
        raise KeyError(f"no lifecycle chaos scenario {name!r}; one of {', '.join(SCENARIOS)}")
    return SCENARIOS[name]
