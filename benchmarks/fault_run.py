"""The long fault run: the sample job and a dedup job on SeaweedFS behind the S3 fault
proxy, SIGKILLed every 10-40 s and restarted, savepointed, upgraded blue-green and rolled
back through the Airflow DAGs; then exact output, a clean Delta log audit of every
table, and no orphaned file, WAL entry or staging folder.

Run:  source infra/driver_jvm.sh   # faster driver starts (optional)
      /work/main/.venv/bin/python benchmarks/fault_run.py [--minutes 30] [--seed 1]
          [--workdir DIR] [--keep]

What runs, and which path each action takes (the start or monitor DAG, or directly),
is in tests/support/fault_run.py. Prints the figures every minute and at the end one
JSON line: kills, faults by kind, savepoints, upgrades, rollbacks, rows_checked, lost,
duplicated, audit_problems, orphans. Exit 1 on any violation (the working directory
is then kept for a look; with --keep always).

The CI's short form of the same code: tests/reliability/test_fault_run.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO)]

from tests.support.fault_run import FaultRun, FaultRunConfig  # noqa: E402


def parse(argv: list[str] | None = None) -> FaultRunConfig:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="of chaos (default 30)")
    parser.add_argument("--seed", type=int, default=1, help="kills, savepoints, faults")
    parser.add_argument("--workdir", type=Path, default=None, help="default: ./.fault-run-*")
    parser.add_argument("--keep", action="store_true", help="keep the working directory")
    parser.add_argument(
        "--short",
        action="store_true",
        help="the CI profile: savepoint, upgrade and rollback early and close together",
    )
    args = parser.parse_args(argv)
    config = FaultRunConfig(
        minutes=args.minutes, seed=args.seed, workdir=args.workdir, keep=args.keep
    )
    if args.short:
        short_profile(config)
    return config


def short_profile(config: FaultRunConfig) -> None:
    """A few minutes: every action once, kills between them."""
    config.first_savepoint_at = 0.05
    config.savepoint_every = 1e9  # one
    config.upgrade_at = 0.0  # at once; the chaos goes on until the rollback is done
    config.rollback_at = 0.0  # as soon as the upgrade is promoted
    config.upgrade_attempts = 1  # no time for another: a rollback by probation counts
    config.min_kills = 2  # the kills may not wait for the DAG runs to leave a job alone
    config.probation_seconds = 6
    config.monitor_every = 3
    config.report_every = 30.0
    config.drain_timeout = 420.0
    # The upgrade waits for keyed-totals to be quiet after its last kill, then runs the
    # shadow, the gate and probation: 227 s once under CI's load, which ended the default
    # 240 s of overtime before the rollback could be asked. A run that finishes sooner
    # still ends as soon as the rollback is done.
    config.overtime = 420.0


def main(argv: list[str] | None = None) -> int:
    config = parse(argv)
    report = FaultRun(config).run()
    figures = report.to_json()
    print(
        f"fault run: {figures['kills']} kills survived, faults {figures['faults']}, "
        f"{figures['savepoints']} savepoints, {figures['upgrades']} upgrade(s) promoted of "
        f"{len(figures['upgrade_attempts'])}, {figures['rollbacks']} rollback(s) by the "
        f"rollback DAG and {figures['auto_rollbacks']} by the upgrade DAG, "
        f"{figures['rows_checked']} rows checked: "
        f"{figures['lost']} lost, {figures['duplicated']} duplicated; "
        f"{figures['tables_audited']} Delta tables audited, "
        f"{len(figures['audit_problems'])} problem(s); {figures['orphan_count']} orphan(s); "
        f"{'OK' if report.ok else 'FAILED: ' + '; '.join(figures['problems'][:5])}",
        flush=True,
    )
    print(json.dumps(figures), flush=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
