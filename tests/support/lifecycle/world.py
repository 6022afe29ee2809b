"""The lifecycle property test's world: a storage root, a job, its input, and what must hold.

Real parts: the local object store, real Delta tables (delta-rs), the real commit,
recovery, lineage, savepoint, upgrade and retention code. Synthetic: Spark. A
`SyntheticQuery` plans batches into a checkpoint directory the way Spark does (`offsets/N`
before batch N, `commits/N` after its sink returned, a batch planned and not completed
is replayed with the same range), and a `SyntheticFrame` runs the real executor-side
writer (`mapInArrow`'s function) in-process.

The reference is computed from the input only: event `i` is `{id: i, key: k{i % 7},
value: i}`; the append table `ledger` must hold a prefix of the events, each once; the
merge table `last` must hold, per key, the greatest value of some prefix; a shared
append table holds a prefix of each lineage's events.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.reader import read_table_rows
from streamkeeper.runtime.job import JobPaths, resolve_paths
from streamkeeper.spec import JobSpec, parse_spec
from streamkeeper.storage import Location

JOB = "ledger"
OTHER_JOB = "other"
KEYS = 7
SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.string()), ("value", pa.int64())])


def event(i: int, lineage_offset: int = 0) -> dict[str, Any]:
    """Event i of a job's input (the other job's ids start at `lineage_offset`)."""
    n = lineage_offset + i
    return {"id": n, "key": f"k{n % KEYS}", "value": n}


@dataclass
class JobInput:
    """A job's input, appended to as the test goes (like files landing in a folder)."""

    offset: int = 0  # ids of this job's events start here
    count: int = 0

    def events(self, start: int, end: int) -> list[dict[str, Any]]:
        return [event(i, self.offset) for i in range(start, end)]


class ConcurrentQueryError(RuntimeError):
    """Spark's answer when another query wrote the log entry this one is about to write."""


class SyntheticQuery:
    """Spark's side of a checkpoint directory: plans, replays and completes batches.

    As Spark's MicroBatchExecution: at start it reads the logs once; a batch planned and
    not completed is run again with its range; every later `offsets/N` and `commits/N`
    is created, never overwritten, and finding one there already fails the query
    ("Concurrent update to the log. Multiple streaming jobs detected").
    """

    def __init__(self, directory: Path, source: JobInput, batch_size: int) -> None:
        self.directory = directory
        self.source = source
        self.batch_size = batch_size
        self._next: int | None = None
        self._replay: int | None = None

    def ensure_started(self) -> None:
        """A new query writes its id into `metadata`; a restored one keeps the copied id."""
        self.directory.mkdir(parents=True, exist_ok=True)
        metadata = self.directory / "metadata"
        if not metadata.exists():
            metadata.write_text(json.dumps({"id": str(uuid.uuid4())}) + "\n")
        committed, planned = self._ids("commits"), self._ids("offsets")
        self._next = committed[-1] + 1 if committed else 0
        if planned and planned[-1] >= self._next:
            self._replay = planned[-1]

    def _ids(self, folder: str) -> list[int]:
        path = self.directory / folder
        if not path.exists():
            return []
        return sorted(int(p.name) for p in path.iterdir() if p.name.isdigit())

    def _range(self, batch_id: int) -> tuple[int, int]:
        lines = (self.directory / "offsets" / str(batch_id)).read_text().splitlines()
        offset = json.loads(lines[2])
        return int(offset["start"]), int(offset["end"])

    def next_batch(self) -> tuple[int, list[dict[str, Any]]] | None:
        """The next batch: a planned one replayed, else a new range (None: no new input)."""
        assert self._next is not None, "ensure_started first"
        batch_id = self._next
        if self._replay == batch_id:
            start, end = self._range(batch_id)
        else:
            start = self._range(batch_id - 1)[1] if batch_id > 0 else 0
            end = min(start + self.batch_size, self.source.count)
            if end <= start:
                return None
            body = [
                "v1",
                json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": {}}),
                json.dumps({"start": start, "end": end}),
            ]
            _create(self.directory / "offsets" / str(batch_id), "\n".join(body))
        return batch_id, self.source.events(start, end)

    def complete(self, batch_id: int) -> None:
        _create(self.directory / "commits" / str(batch_id), 'v1\n{"nextBatchWatermarkMs":0}')
        self._next = batch_id + 1


def _create(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(path, "x") as handle:
            handle.write(body)
    except FileExistsError:
        raise ConcurrentQueryError(
            f"Concurrent update to the log: {path} exists. Multiple streaming jobs detected"
        ) from None


class _Collected:
    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def collect(self) -> list[dict[str, Any]]:
        return self.rows


class SyntheticFrame:
    """A micro-batch: the real executor-side writer runs over it in two partitions."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.table = pa.Table.from_pylist(rows, schema=SCHEMA)
        self.columns = list(SCHEMA.names)

    def mapInArrow(self, function: Any, _schema: str) -> _Collected:  # noqa: N802 - Spark's
        half = (self.table.num_rows + 1) // 2
        results: list[dict[str, Any]] = []
        for part in (self.table.slice(0, half), self.table.slice(half)):
            if part.num_rows:
                for batch in function(iter(part.to_batches())):
                    results.extend(batch.to_pylist())
        return _Collected(results)


@dataclass
class World:
    """One example's storage root, jobs and inputs."""

    base: Path
    shared_table: bool = False
    batch_size: int = 3
    inputs: dict[str, JobInput] = field(default_factory=dict)

    def __post_init__(self) -> None:
        (self.base / "transform.py").write_text("def build(frame):\n    return frame\n")
        self.inputs = {JOB: JobInput(0), OTHER_JOB: JobInput(1_000_000)}

    @property
    def root(self) -> Path:
        return self.base / "root"

    @property
    def live_dir(self) -> Path:
        return self.base / "checkpoints" / JOB

    def spec(self, job: str = JOB) -> JobSpec:
        sinks: list[dict[str, Any]] = []
        if job == JOB:
            sinks += [
                {"name": "ledger", "output": "append"},
                {"name": "last", "output": "merge", "key": ["key"], "order_by": "value"},
            ]
        if self.shared_table or job == OTHER_JOB:
            sinks.append(
                {"name": "shared", "output": "append", "table": "tables/shared", "shared": True}
            )
        return parse_spec(
            {
                "name": job,
                "source": {
                    "type": "file",
                    "path": str(self.base / "events"),
                    "format": "json",
                    "schema": "id BIGINT, key STRING, value BIGINT",
                },
                "transform": "transform.py:build",
                "sinks": sinks,
                "checkpoint": {
                    "dir": str(self.base / "checkpoints" / job),
                    "max_concurrent": 16,
                    "externalized": {"enabled": True, "retained": 2},
                },
                "savepoints": {"retained": 2},
                # Log expiry (below the protected floor) every few commits, with no extra
                # history kept: rollbacks and restores run against expired logs too.
                "maintenance": {"every": 3, "history_retention": "0s"},
                "storage": {"root": str(self.root)},
            }
        )

    def paths(self, job: str = JOB) -> JobPaths:
        return resolve_paths(self.spec(job))

    def layout(self, job: str = JOB) -> LineageLayout:
        return LineageLayout(Location(str(self.root)), job, job)

    def schemas(self, job: str = JOB) -> dict[str, pa.Schema]:
        return {sink.name: SCHEMA for sink in self.spec(job).sinks}

    def table_path(self, sink: str) -> Path:
        return self.root / "tables" / sink

    # -- the reference -----------------------------------------------------------------

    def rows(self, sink: str) -> list[dict[str, Any]]:
        path = self.table_path(sink)
        if not (path / "_delta_log").exists():
            return []
        return read_table_rows(str(path))


def prefix_length(ids: list[int], offset: int = 0) -> int | None:
    """p if `ids` are exactly offset..offset+p-1, each once; None otherwise."""
    counts = Counter(ids)
    p = len(ids)
    if any(c != 1 for c in counts.values()):
        return None
    return p if set(counts) == set(range(offset, offset + p)) else None


def last_of_prefix(p: int) -> dict[str, int]:
    """The merge table `last` after the first p events: per key, the greatest value."""
    result: dict[str, int] = {}
    for i in range(p):
        result[f"k{i % KEYS}"] = i
    return result


def describe_ids(ids: list[int], offset: int = 0) -> str:
    """What is wrong with a table that should hold a prefix (for assertion messages)."""
    counts = Counter(ids)
    twice = sorted(i for i, c in counts.items() if c > 1)
    top = max(counts, default=offset - 1)
    missing = sorted(set(range(offset, top + 1)) - set(counts))
    return (
        f"{len(ids)} rows; repeated {len(twice)} ids {twice[:10]}; missing {len(missing)} ids "
        f"{missing[:10]} below the highest id {top}"
    )
