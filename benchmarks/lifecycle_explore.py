"""The lifecycle property test's deep profile: many more interleavings than CI runs.

Runs `tests/property/test_lifecycle_machine.py`'s state machine (real commit, recovery,
lineage, savepoint, upgrade and retention code; blue, green, takeovers, restores from a
lost machine, rollbacks, a second job on a shared table; crashes at every step and lost
answers) for `--examples` examples of up to `--steps` rules each, from `--seed`, and
prints what it explored: examples checked exact, distinct interleavings, steps and
crashes per point, the actors, and the violations (the run stops at the first one, with
Hypothesis's report of the moves that led to it).

    .venv/bin/python benchmarks/lifecycle_explore.py --examples 2000 --steps 80 --seed 1
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=500)
    parser.add_argument("--steps", type=int, default=80, help="rules per example, at most")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--shrink", action="store_true", help="shrink a failing example")
    args = parser.parse_args()
    os.environ["STREAMKEEPER_LIFECYCLE_SEED"] = str(args.seed)
    os.environ["STREAMKEEPER_LIFECYCLE_NUMBERED_IDS"] = "1"  # reports replay exactly

    import logging

    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.stateful import run_state_machine_as_test

    logging.disable(logging.WARNING)  # a run's expected refusals and fenced runners
    from tests.property.test_lifecycle_machine import LifecycleMachine
    from tests.support.lifecycle.explored import EXPLORED

    phases = list(Phase) if args.shrink else [Phase.generate]
    profile = settings(
        max_examples=args.examples,
        stateful_step_count=args.steps,
        deadline=None,
        derandomize=False,
        database=None,
        print_blob=True,  # a violation prints @reproduce_failure: replay it in seconds
        phases=phases,
        suppress_health_check=list(HealthCheck),
    )
    started = time.monotonic()
    violation = None
    import hypothesis.core

    hypothesis.core.global_force_seed = args.seed  # what pytest's --hypothesis-seed sets
    try:
        run_state_machine_as_test(LifecycleMachine, settings=profile)
    except BaseException as error:  # noqa: BLE001 - reported below
        violation = error
    elapsed = time.monotonic() - started
    print(f"lifecycle exploration, seed {args.seed}: {EXPLORED.summary()}; {elapsed:.0f} s")
    print("steps per point:")
    for point, count in EXPLORED.steps.most_common():
        print(f"  {point:40} {count:8d}   crashes {EXPLORED.crashes.get(point, 0):6d}")
    print(f"violations: {0 if violation is None else 1}")
    if violation is not None:
        print(f"{type(violation).__name__}: {violation}")
        for note in getattr(violation, "__notes__", []):  # Hypothesis's moves to it
            print(note)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
