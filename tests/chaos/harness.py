"""Crash harness: run the sample job as a real driver process and SIGKILL it.

Kills come two ways: at named protocol points (`STREAMKEEPER_CRASH_AT`, the driver
kills itself) and at random instants (the harness kills the driver's process group).
After every kill the tables are checked against the reference: each must equal the
result of some prefix of the input that the checkpoint has completed, so nothing is
duplicated, nothing is partial, and output is never ahead of state.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from deltalake.exceptions import TableNotFoundError

from streamkeeper.commit.tables import TableTarget
from streamkeeper.reader import read_table_rows
from streamkeeper.snapshots.spark_checkpoint import SparkCheckpoint
from streamkeeper.storage import Location, S3Settings
from tests.support.driver import driver_env, run_command

REPO = Path(__file__).resolve().parents[2]
SAMPLE_SPEC = REPO / "jobs" / "keyed_totals" / "job.yaml"


class InvariantViolation(AssertionError):
    """A table holds something no completed checkpoint can explain."""


@dataclass
class ChaosJob:
    """One sample job under test: its files, its root and its checkpoint."""

    workdir: Path
    root: str
    event_files: list[Path]
    sink_mode: str = "exactly_once"
    env: dict[str, str] = field(default_factory=dict)
    name: str = "keyed-totals"  # the job, and its lineage
    tables: dict[str, str] = field(
        default_factory=lambda: {"totals": "tables/totals", "changes": "tables/changes"}
    )
    settings: list[str] = field(default_factory=list)  # more `--set` overrides
    master: str = "local[2]"
    kills: int = 0
    runs: int = 0
    log: list[str] = field(default_factory=list)

    @property
    def checkpoint_dir(self) -> Path:
        return self.workdir / "checkpoint"

    def _command(self) -> list[str]:
        settings = [
            f"source.path={self.event_files[0].parent}",
            f"spark.master={self.master}",
            "spark.shuffle_partitions=2",
            f"name={self.name}",
            f"sinks.0.table={self.tables['totals']}",
            f"sinks.1.table={self.tables['changes']}",
            # Table maintenance on every other commit, expiring all the log it may: the
            # kills then land in and around it, and every check reads maintained tables.
            "maintenance.every=2",
            "maintenance.history_retention=0s",
            # The reference reads every batch's `offsets/N` (batch_files): Spark keeps 100,
            # and a run whose drivers outpace the random kills goes past that.
            "spark.conf.spark.sql.streaming.minBatchesToRetain=100000",
        ]
        if self.sink_mode != "exactly_once":
            settings.append(f"checkpoint.mode={self.sink_mode}")
        settings += self.settings
        return run_command(self.root, self.checkpoint_dir, settings, "--available-now")

    def _environment(self, crash_at: str | None) -> dict[str, str]:
        return driver_env(crash_at, **self.env)

    def run(
        self,
        *,
        crash_at: str | None = None,
        kill_after: float | None = None,
        timeout: float = 300.0,
    ) -> str:
        """Run the driver once. Returns 'killed' or 'finished'; raises if it failed."""
        self.runs += 1
        log_path = self.workdir / f"run-{self.runs:03d}.log"
        with open(log_path, "wb") as log_file:
            process = subprocess.Popen(
                self._command(),
                env=self._environment(crash_at),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.workdir,
            )
            try:
                code = process.wait(timeout=kill_after if kill_after is not None else timeout)
            except subprocess.TimeoutExpired:
                code = None
            finally:
                # The driver's JVM lives in the same new session: end the whole group we made.
                _kill_group(process)
        if code is None:
            code = -signal.SIGKILL
        outcome = "killed" if code == -signal.SIGKILL else ("finished" if code == 0 else "failed")
        self.log.append(
            f"run {self.runs}: crash_at={crash_at} kill_after={kill_after} -> {outcome}"
        )
        if outcome == "failed":
            raise RuntimeError(
                f"driver failed with exit {code}; log:\n{log_path.read_text()[-4000:]}"
            )
        if outcome == "killed":
            self.kills += 1
        return outcome

    # -- checks ------------------------------------------------------------------------

    def _location(self, sink: str) -> Location:
        root = Location(self.root, S3Settings.from_env() if self.root.startswith("s3://") else None)
        return root.child(self.tables[sink])

    def table_rows(self, sink: str) -> list[dict]:
        from deltalake.exceptions import TableNotFoundError

        location = self._location(sink)
        try:
            return read_table_rows(location.uri, location=location)
        except TableNotFoundError:  # killed before the runner created its tables
            return []

    def completed_batches(self) -> int:
        latest = SparkCheckpoint(self.checkpoint_dir).latest_complete()
        return 0 if latest is None else latest + 1

    def batch_files(self) -> list[list[Path]]:
        """The input files of each completed batch, as the checkpoint recorded them.

        A batch can hold more than one file after a restart (the file source had logged
        a file before the kill), so the reference follows the recorded batching.
        """
        checkpoint = self.checkpoint_dir
        by_log_offset: dict[int, list[str]] = {}
        for entry_file in sorted((checkpoint / "sources" / "0").glob("[0-9]*")):
            for line in entry_file.read_text().splitlines()[1:]:
                if line.strip():
                    entry = json.loads(line)
                    by_log_offset.setdefault(entry["batchId"], []).append(entry["path"])
        batches, previous = [], -1
        for batch in range(self.completed_batches()):
            lines = (checkpoint / "offsets" / str(batch)).read_text().splitlines()
            log_offset = json.loads(lines[2])["logOffset"]
            names = sorted(
                {
                    Path(p).name
                    for o in range(previous + 1, log_offset + 1)
                    for p in by_log_offset[o]
                }
            )
            batches.append([self.event_files[0].parent / name for name in names])
            previous = log_offset
        return batches

    def reference_after(self, batches: list[list[Path]]) -> tuple[dict, list]:
        """Totals and the changelog after the given batches, one update per batch and key."""
        *_, (totals, changes) = self.references(batches)
        return totals, sorted(changes.elements())

    @staticmethod
    def references(batches: list[list[Path]]) -> Iterator[tuple[dict, Counter]]:
        """The reference after each prefix of `batches` (the empty one first): totals per
        key and the changelog as a multiset. One pass: each file is read once, and each
        step costs its batch (a check after every kill compares every prefix). The
        changelog yielded is one Counter, updated in place: copy it to keep it."""
        from jobs.keyed_totals.sample_events import read_events

        counts: dict[str, int] = {}
        sums: dict[str, int] = {}
        changes: Counter = Counter()
        yield {}, Counter()
        for files in batches:
            touched = set()
            for path in files:
                for event in read_events(path):
                    counts[event["key"]] = counts.get(event["key"], 0) + 1
                    sums[event["key"]] = sums.get(event["key"], 0) + event["value"]
                    touched.add(event["key"])
            changes.update((k, counts[k], sums[k]) for k in touched)
            yield {k: (counts[k], sums[k]) for k in counts}, changes

    def check_invariants(self, changes: list[tuple] | None = None) -> tuple[int, int]:
        """Each table equals the reference after some prefix of the completed batches.

        Args:
            changes: this job's rows of the changes table, if not all of them are its own.

        Returns:
            How many batches the totals and changes tables reflect.
        """
        batches = self.batch_files()
        totals = {r["key"]: (r["events"], r["total"]) for r in self.table_rows("totals")}
        if changes is None:
            changes = [(r["key"], r["events"], r["total"]) for r in self.table_rows("changes")]
        written = Counter(changes)
        totals_at = changes_at = None
        for prefix, (expected_totals, expected_changes) in enumerate(self.references(batches)):
            if totals_at is None and totals == expected_totals:
                totals_at = prefix
            if changes_at is None and written == expected_changes:
                changes_at = prefix
            if totals_at is not None and changes_at is not None:
                break  # the first match is the answer: later prefixes only cost
        if totals_at is None or changes_at is None:
            raise InvariantViolation(
                f"tables match no prefix of the {len(batches)} completed batches (totals at "
                f"{totals_at}, changes at {changes_at}; {len(changes)} change rows): either "
                f"duplicated, partial, or ahead of the checkpoint; history: {self.log}"
            )
        return totals_at, changes_at

    def check_protected_versions(self) -> int:
        """Every table version the lineage protects (its head, retained checkpoints,
        savepoints) is still readable after maintenance expired the log below them.

        Returns:
            The lowest version left in the tables' logs (above 0 once the log was expired).
        """
        from deltalake import DeltaTable

        from streamkeeper.commit.maintenance import lineage_protected_seqs, log_version
        from streamkeeper.lineage.layout import LineageLayout
        from streamkeeper.lineage.markers import latest_marker

        root = Location(self.root, S3Settings.from_env() if self.root.startswith("s3://") else None)
        store, layout = root.store(), LineageLayout(root, self.name, self.name)
        head = latest_marker(store, layout)
        seqs = lineage_protected_seqs(store, layout) | ({head["seq"]} if head else set())
        lowest = []
        for sink in ("totals", "changes"):
            location = self._location(sink)
            for seq in sorted(seqs):
                marker = store.read_json(layout.marker(seq))
                assert marker is not None, f"the marker of protected seq {seq} is gone"
                version = marker["versions"][sink]
                options = location.storage_options()
                DeltaTable(location.uri, version=version, storage_options=options)
            keys = location.store().list("_delta_log/")
            lowest.append(min(v for k in keys if (v := log_version(k)) is not None))
        return min(lowest)

    def unreferenced_files(self) -> list[str]:
        """Pre-committed files of the lineage no table references, and WAL leftovers."""
        lineage = self.name
        leftovers = []
        for sink in ("totals", "changes"):
            location = self._location(sink)
            target = TableTarget(sink, location, "", "")
            try:
                referenced = {f.split(f"{location.uri}/", 1)[-1] for f in target.open().file_uris()}
            except TableNotFoundError:
                referenced = set()
            folder = location.child(f"sk-{lineage}").store()
            leftovers += [
                f"{sink}/sk-{lineage}/{key}"
                for key in folder.list("")
                if f"sk-{lineage}/{key}" not in referenced
            ]
        root = Location(self.root, S3Settings.from_env() if self.root.startswith("s3://") else None)
        leftovers += root.store().list(f"lineages/{lineage}/wal")
        return leftovers

    def missing_files(self) -> list[str]:
        """Files the tables reference that do not exist (must always be none)."""
        missing = []
        for sink in self.tables:
            location = self._location(sink)
            try:
                uris = TableTarget(sink, location, "", "").open().file_uris()
            except TableNotFoundError:
                continue
            filesystem = location.arrow_filesystem()
            for uri in uris:
                path = uri.removeprefix("s3://") if location.is_s3 else uri
                if filesystem.get_file_info(path).type.name == "NotFound":
                    missing.append(uri)
        return missing


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()
    # Give the JVM a moment to release its files before the next driver starts.
    time.sleep(0.2)


def crash_schedule(points: list[str], repeats: int, random_kills: int, seed: int) -> list[tuple]:
    """A shuffled list of ('point', 'name:n') and ('random', seconds) kills."""
    rng = random.Random(seed)
    schedule: list[tuple] = [
        ("point", f"{point}:{rng.randint(1, 2)}") for point in points for _ in range(repeats)
    ]
    schedule += [("random", rng.uniform(4.0, 12.0)) for _ in range(random_kills)]
    rng.shuffle(schedule)
    return schedule
