"""`python -m tests.support.lifecycle_chaos SCENARIO --workdir DIR [--keep]`: one lifecycle chaos
run in this process; its report is the last line printed (JSON). Exit 1 if it failed."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from tests.support.lifecycle_chaos.run import LifecycleRun
from tests.support.lifecycle_chaos.scenarios import SCENARIOS, scenario


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--workdir", type=Path, required=True, help="a new folder for the run")
    parser.add_argument("--keep", action="store_true", help="keep the folder when it passed")
    args = parser.parse_args(argv)
    if args.workdir.exists() and any(args.workdir.iterdir()):
        parser.error(f"--workdir {args.workdir} is not empty; give a new folder")
    report = LifecycleRun(scenario(args.scenario), args.workdir).run()
    for failure in report.failures():
        print(f"[lifecycle {args.scenario}] FAILED: {failure}", flush=True)
    if report.ok and not args.keep:
        shutil.rmtree(args.workdir, ignore_errors=True)
    print(json.dumps(report.to_json()), flush=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
