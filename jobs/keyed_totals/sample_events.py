"""Deterministic event files for the sample job, and the result it must produce.

Used by the demo, the tests and the benchmarks. Each file gets a distinct
modification time, so with maxFilesPerTrigger=1 batch i reads file i.
"""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from pathlib import Path

Totals = dict[str, tuple[int, int]]


def write_event_files(
    directory: Path,
    *,
    files: int,
    events_per_file: int,
    keys: int = 100,
    seed: int = 7,
    first_file: int = 0,
) -> list[Path]:
    """Write `files` JSON-lines files of events; returns them in batch order."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(first_file, first_file + files):
        rng = random.Random(seed * 1_000_003 + index)
        path = directory / f"events-{index:05d}.json"
        tmp = directory / f".events-{index:05d}.json.tmp"
        with open(tmp, "w") as handle:
            for n in range(events_per_file):
                event = {
                    "event_id": index * events_per_file + n,
                    "key": f"k{rng.randrange(keys):04d}",
                    "value": rng.randrange(1000),
                }
                handle.write(json.dumps(event) + "\n")
        stamp = 1_700_000_000 + index * 10
        os.utime(tmp, (stamp, stamp))
        os.replace(tmp, path)  # the file source must never see a half-written file
        paths.append(path)
    return paths


def read_events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def expected_results(paths: list[Path]) -> tuple[Totals, list[tuple[str, int, int]]]:
    """The reference: final totals per key, and the changelog one batch per file."""
    counts: Counter[str] = Counter()
    sums: Counter[str] = Counter()
    changes: list[tuple[str, int, int]] = []
    for path in paths:
        touched = set()
        for event in read_events(path):
            counts[event["key"]] += 1
            sums[event["key"]] += event["value"]
            touched.add(event["key"])
        changes.extend((key, counts[key], sums[key]) for key in sorted(touched))
    return {k: (counts[k], sums[k]) for k in counts}, sorted(changes)
