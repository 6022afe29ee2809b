"""Replay a lifecycle violation from the report the deep profile printed.

    .venv/bin/python benchmarks/lifecycle_replay.py report.txt [--verbose]

The report is `benchmarks/lifecycle_explore.py`'s output (or pytest's "Falsifying
example"); every draw in it is labelled, so the moves replay without a seed or blob.
Prints whether the violation happened again and where the world went another way.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--verbose", action="store_true", help="print each move")
    args = parser.parse_args()
    if not args.verbose:
        logging.disable(logging.WARNING)
    from tests.support.lifecycle.replay import replay

    try:
        diverged = replay(args.report.read_text(), verbose=args.verbose)
    except AssertionError as violation:
        print(f"violation again: {violation}")
        return 1
    print("no violation: the moves ran to the end exact")
    for line in diverged:
        print(f"  diverged: {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
