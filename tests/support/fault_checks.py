"""The end-state checks of the fault run (tests/support/fault_run.py), and its dedup input.

- `check_keyed`: the sample job's tables against the reference. `totals` must equal the
  totals of every input file; `changes` must be the changelog of *some* cutting of the
  input into batches of consecutive files, each batch once: its pre-committed files are
  grouped by the commit seq in their path (`sk-{lineage}/{seq}/`), and the batches, in
  seq order, must each match the next run of input files exactly, until every file is
  consumed. A repeated batch, a lost one, a partial one or rows out of order fail.
  This follows the lineage across restores, upgrades and rollbacks (the checkpoint
  directory does not: an upgrade sets it aside, a rollback restores another).
- `check_dedup`: the dedup job's table holds every distinct input event exactly once.
- `find_orphans`: files in a table's folder that no readable version of its log ever
  referenced (a lineage's checkpoint history's files younger than its sweep's age
  apart: `history_awaiting_sweep`, no orphans), WAL
  manifests and staging left under any lineage, savepoints not `complete`, externalized
  checkpoint objects no indexed or pinned checkpoint references, and restore staging
  folders left beside the checkpoint directories.
"""

from __future__ import annotations

import json
import os
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs.keyed_totals.sample_events import expected_results, read_events
from streamkeeper.storage import Location
from tests.support.delta_audit import known_files

_SEQ_FOLDER = re.compile(r"(?:^|/)sk-[^/]+/0*(\d+)/[^/]+$")


@dataclass
class Verdict:
    """What one table check found."""

    rows_checked: int = 0
    lost: int = 0
    duplicated: int = 0
    problems: list[str] = field(default_factory=list)


# -- the dedup job's input -------------------------------------------------------------


def dedup_event(event_id: int) -> dict[str, Any]:
    """The one event with this id (a resend is the same row)."""
    return {"event_id": event_id, "key": f"u{event_id % 97:03d}", "value": event_id * 7919 % 1000}


def write_dedup_file(
    directory: Path, index: int, *, events: int, resends: int, seed: int = 11
) -> Path:
    """File `index`: its `events` new ids, plus `resends` ids drawn from it and the two
    files before it (in event time within 3 files: far inside the job's watermark)."""
    rng = random.Random(seed * 1_000_003 + index)
    ids = list(range(index * events, (index + 1) * events))
    earlier = range(max(0, index - 2) * events, (index + 1) * events)
    ids += [rng.choice(earlier) for _ in range(resends)]
    rng.shuffle(ids)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"dedup-{index:05d}.json"
    tmp = directory / f".dedup-{index:05d}.json.tmp"
    tmp.write_text("".join(json.dumps(dedup_event(i)) + "\n" for i in ids))
    stamp = 1_700_000_000 + index * 10  # distinct, increasing: the file source's order
    os.utime(tmp, (stamp, stamp))
    os.replace(tmp, path)
    return path


# -- reading tables ----------------------------------------------------------------------


def _fragments(location: Location) -> list[tuple[str, list[dict]]]:
    """(path relative to the table, rows) of every file of the current snapshot."""
    from deltalake import DeltaTable

    table = DeltaTable(location.uri, storage_options=location.storage_options())
    prefix = location.fs_path.rstrip("/") + "/"
    found = []
    for fragment in table.to_pyarrow_dataset().get_fragments():
        path = fragment.path.removeprefix(prefix).removeprefix(location.uri.rstrip("/") + "/")
        found.append((path, fragment.to_table(use_threads=False).to_pylist()))
    return found


def _rows(location: Location) -> list[dict]:
    return [row for _, rows in _fragments(location) for row in rows]


# -- the sample job ------------------------------------------------------------------------


def _changes_by_seq(location: Location, problems: list[str]) -> list[tuple[int, list[tuple]]]:
    batches: dict[int, list[tuple]] = {}
    for path, rows in _fragments(location):
        match = _SEQ_FOLDER.search(path)
        if match is None:
            problems.append(
                f"changes: file {path} is not in a seq folder (sk-{{lineage}}/{{seq}}/)"
            )
            continue
        batches.setdefault(int(match.group(1)), []).extend(
            (r["key"], r["events"], r["total"]) for r in rows
        )
    return sorted(batches.items())


def _match_batch(
    rows: list[tuple], files: list[list[dict]], start: int, counts: Counter, sums: Counter
) -> tuple[int, Counter, Counter] | None:
    """The end of the run of files from `start` whose changelog is exactly `rows`."""
    wanted = {}
    for key, events, total in rows:
        if key in wanted:
            return None  # one key twice in one batch
        wanted[key] = (events, total)
    counts, sums, touched = Counter(counts), Counter(sums), set()
    for end in range(start, len(files)):
        for event in files[end]:
            counts[event["key"]] += 1
            sums[event["key"]] += event["value"]
            touched.add(event["key"])
        expected = {k: (counts[k], sums[k]) for k in touched}
        if expected == wanted:
            return end + 1, counts, sums
        if any(counts[k] > wanted.get(k, (counts[k],))[0] for k in touched):
            return None  # past the batch: no longer run of files can match
    return None


def check_keyed(totals: Location, changes: Location, files: list[Path]) -> Verdict:
    """The sample job's `totals` and `changes` against the input files (module doc)."""
    verdict = Verdict()
    expected_totals, _ = expected_results(files)
    table = {r["key"]: (r["events"], r["total"]) for r in _rows(totals)}
    verdict.rows_checked += len(table)
    for key in sorted(set(expected_totals) | set(table)):
        want, got = expected_totals.get(key, (0, 0))[0], table.get(key, (0, 0))[0]
        verdict.lost += max(0, want - got)
        verdict.duplicated += max(0, got - want)
        if table.get(key) != expected_totals.get(key):
            verdict.problems.append(
                f"totals[{key}] = {table.get(key)}, expected {expected_totals.get(key)}"
            )
    events = [read_events(path) for path in files]
    counts: Counter = Counter()
    sums: Counter = Counter()
    position = 0
    batches = _changes_by_seq(changes, verdict.problems)
    for seq, rows in batches:
        verdict.rows_checked += len(rows)
        matched = _match_batch(rows, events, position, counts, sums)
        if matched is None:
            verdict.problems.append(
                f"changes: the batch of seq {seq} ({len(rows)} rows) is the changelog of no "
                f"run of input files from file {position} (repeated, lost, partial or "
                f"reordered output)"
            )
            break
        position, counts, sums = matched
    else:
        if position < len(files):
            lost = sum(len(e) for e in events[position:])
            verdict.lost += lost
            verdict.problems.append(
                f"changes: files {position}..{len(files) - 1} ({lost} events) reached no batch"
            )
    return verdict


# -- the dedup job ----------------------------------------------------------------------------


def check_dedup(unique: Location, files: list[Path]) -> Verdict:
    """Every distinct input event once in `unique`, as it was sent."""
    verdict = Verdict()
    expected = {e["event_id"] for path in files for e in read_events(path)}
    rows = _rows(unique)
    verdict.rows_checked = len(rows)
    seen = Counter(r["event_id"] for r in rows)
    lost = sorted(expected - set(seen))
    extra = {i: n - 1 for i, n in seen.items() if n > 1}
    strays = sorted(set(seen) - expected)
    wrong = [r for r in rows if r["event_id"] in expected and r != dedup_event(r["event_id"])]
    verdict.lost = len(lost)
    verdict.duplicated = sum(extra.values()) + len(strays)
    if lost:
        verdict.problems.append(f"dedup: {len(lost)} event(s) missing, e.g. {lost[:5]}")
    if extra:
        verdict.problems.append(
            f"dedup: {len(extra)} event(s) more than once, e.g. {sorted(extra)[:5]}"
        )
    if strays:
        verdict.problems.append(f"dedup: {len(strays)} event id(s) never sent: {strays[:5]}")
    if wrong:
        verdict.problems.append(
            f"dedup: {len(wrong)} row(s) differ from the event sent: {wrong[:2]}"
        )
    return verdict


# -- leftovers ----------------------------------------------------------------------------------

_CONTROL = ("_delta_log/", "_streamkeeper/")
# A failed checkpoint-history append's file, too young for the runner's sweep to take
# (observability/history.py): the run ended before its sweep. Not an orphan.
AWAITING_SWEEP = "history_awaiting_sweep"


# From a job's last stop to this check (the stop DAGs, the audit): a file that came of
# sweeping age in that time, or in the last sweep period before it, had no runner to sweep it.
STOP_TO_CHECK_SECONDS = 180.0


def _young_files(table: Location) -> set[str]:
    """The table folder's files the runner's sweep could not have taken yet: younger than
    its minimum age, plus the period between sweeps and the time since the jobs stopped."""
    import time

    import pyarrow.fs as pafs

    from streamkeeper.observability.history import UNREFERENCED_MIN_AGE
    from streamkeeper.runtime.supervisor import HISTORY_SWEEP_SECONDS

    cutoff = time.time() - (UNREFERENCED_MIN_AGE + HISTORY_SWEEP_SECONDS + STOP_TO_CHECK_SECONDS)
    found = table.arrow_filesystem().get_file_info(
        pafs.FileSelector(table.fs_path, allow_not_found=True)
    )
    return {
        info.base_name
        for info in found
        if info.type == pafs.FileType.File and info.mtime and info.mtime.timestamp() >= cutoff
    }


def _unfinished_savepoints(store: Any, lineage: str) -> list[str]:
    """Registry entries not `complete`, and savepoint folders no entry names."""
    found = []
    registry = store.read_json(f"lineages/{lineage}/savepoints/registry.json") or {}
    ids = set()
    for entry in registry.get("savepoints", []):
        ids.add(entry.get("id"))
        if entry.get("state") != "complete":
            found.append(f"{lineage}: {entry.get('id')} is {entry.get('state')}")
    for folder in store.children(f"lineages/{lineage}/savepoints"):
        if folder not in ids:
            found.append(f"{lineage}: folder {folder} is in no registry entry")
    return found


def _unreferenced_checkpoint_objects(store: Any, lineage: str) -> list[str]:
    """Externalized checkpoint files and manifests no retained or pinned checkpoint of the
    index references (a savepoint pins its checkpoint's files there)."""
    base = f"lineages/{lineage}/checkpoints"
    index = store.read_json(f"{base}/index.json")
    if index is None:
        return [f"{base}/{key}" for key in store.list(base)]
    ids = {int(e["id"]) for e in index.get("checkpoints", [])} | {
        int(i) for i in index.get("pins", {}).values()
    }
    manifests = {f"{base}/manifests/{i:020d}.json" for i in ids}
    referenced = set()
    for key in manifests:
        manifest = store.read_json(key) or {}
        referenced |= {f["key"] for f in manifest.get("files", [])}
    left = [k for k in store.list(f"{base}/files") if k not in referenced]
    left += [k for k in store.list(f"{base}/manifests") if k not in manifests]
    return left


def find_orphans(
    root: Location, tables: list[Location], checkpoint_dirs: list[Path]
) -> dict[str, list[str]]:
    """Everything the run left behind that nothing references (module doc), by kind."""
    store = root.store()
    orphans: dict[str, list[str]] = {
        "files": [],
        AWAITING_SWEEP: [],
        "wal": [],
        "savepoints": [],
        "checkpoints": [],
        "staging": [],
    }
    for table in tables:
        known = known_files(table)
        is_history = re.search(r"/lineages/[^/]+/history$", table.uri) is not None
        young = _young_files(table) if is_history else set()
        for key in table.store().list(""):
            if not key.startswith(_CONTROL) and key not in known:
                kind = AWAITING_SWEEP if key in young else "files"
                orphans[kind].append(f"{table.uri}/{key}")
    for lineage in store.children("lineages"):
        orphans["wal"] += store.list(f"lineages/{lineage}/wal")
        orphans["savepoints"] += _unfinished_savepoints(store, lineage)
        orphans["checkpoints"] += _unreferenced_checkpoint_objects(store, lineage)
    for directory in checkpoint_dirs:
        for leftover in directory.parent.glob(f".{directory.name}*.restore-*"):
            orphans["staging"].append(str(leftover))
    return orphans
