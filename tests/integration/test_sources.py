"""The NATS and Delta sources feeding a real job: exact totals, resume, refusal, SIGKILLs.

Every check compares the target tables with a reference computed from the input and
from the batch boundaries Spark checkpointed (offsets/N): the totals must equal the
input's, and the changelog must hold each batch's updates exactly once.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from streamkeeper.errors import SourceError
from streamkeeper.reader import read_table_rows
from streamkeeper.runtime.runner import RunOptions, resolve_paths, run_job
from streamkeeper.sources.delta import build_delta_source
from streamkeeper.sources.nats import build_nats_source
from streamkeeper.spec import JobSpec, SourceSpec, load_spec
from streamkeeper.storage import Location, S3Settings
from tests.support.deletion_vectors import delete_rows_with_deletion_vector
from tests.support.driver import driver_env
from tests.support.services import NatsServer, free_port

pytestmark = pytest.mark.integration

JOBS = Path(__file__).parent / "jobs"
NATS_SPEC = JOBS / "nats_totals.yaml"
DELTA_SPEC = JOBS / "delta_totals.yaml"
LOCAL_SPARK = {"spark.master": "local[2]", "spark.shuffle_partitions": 2}

Event = tuple[str, int]  # key, value
Positioned = list[tuple[int, Event]]  # (sequence or version, event)


# -- reference and table checks --------------------------------------------------------


def reference(batches: list[list[Event]]) -> tuple[dict[str, tuple[int, int]], list[tuple]]:
    """Totals after all batches, and the changelog: one row per batch and key it touched."""
    counts: dict[str, int] = {}
    sums: dict[str, int] = {}
    changes: list[tuple] = []
    for events in batches:
        for key, value in events:
            counts[key] = counts.get(key, 0) + 1
            sums[key] = sums.get(key, 0) + value
        changes += [(key, counts[key], sums[key]) for key in {k for k, _ in events}]
    return {k: (counts[k], sums[k]) for k in counts}, sorted(changes)


def batch_ends(checkpoint: Path, field_name: str) -> list[int]:
    """Where each completed batch ended, as Spark checkpointed its source offset."""
    done = sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    assert done == list(range(len(done))), f"commit log has gaps: {done}"
    offsets = [(checkpoint / "offsets" / str(batch)).read_text().splitlines() for batch in done]
    return [json.loads(lines[2])[field_name] for lines in offsets]


def assert_exact(spec: JobSpec, events: Positioned, field_name: str, before: int) -> int:
    """The tables equal the reference for the checkpointed batches; returns the batch count."""
    ends = batch_ends(Path(spec.checkpoint.dir or ""), field_name)
    assert ends and ends[-1] >= max(p for p, _ in events), f"input not fully read: {ends}"
    ranges = zip([before, *ends[:-1]], ends, strict=True)
    assert_tables_hold(spec, [[e for p, e in events if low < p <= high] for low, high in ranges])
    return len(ends)


def assert_tables_hold(spec: JobSpec, batches: list[list[Event]]) -> None:
    """The job's `totals` and `changes` tables equal the reference of these batches."""
    totals, changes = reference(batches)
    targets = resolve_paths(spec).targets

    def rows(sink: str) -> list[dict[str, Any]]:
        location = targets[sink].location
        return read_table_rows(location.uri, location=location)

    assert {r["key"]: (r["events"], r["total"]) for r in rows("totals")} == totals
    assert sorted((r["key"], r["events"], r["total"]) for r in rows("changes")) == changes


def _run(spec: JobSpec) -> Any:
    return run_job(spec, RunOptions(available_now=True, spec_dir=JOBS))


# -- NATS ------------------------------------------------------------------------------


@dataclass
class NatsStream:
    """A JetStream stream the test writes; remembers what it holds on the data subject."""

    url: str
    name: str = field(default_factory=lambda: f"T{uuid.uuid4().hex[:10]}")
    held: dict[int, Event] = field(default_factory=dict)

    @property
    def data_subject(self) -> str:
        return f"{self.name}.data"

    def create(self) -> NatsStream:
        async def create() -> None:
            client = await self._connect()
            await client.jetstream().add_stream(name=self.name, subjects=[f"{self.name}.>"])
            await client.close()

        asyncio.run(create())
        return self

    async def _connect(self) -> Any:
        import nats

        return await nats.connect(self.url, connect_timeout=5, max_reconnect_attempts=0)

    def publish(self, values: range) -> None:
        """Events `k{v % 5}` = v; every 7th message is non-JSON noise on another subject."""

        async def publish() -> None:
            client = await self._connect()
            js = client.jetstream()
            for value in values:
                if value % 7 == 3:
                    await js.publish(f"{self.name}.noise", b"not json")
                    continue
                event = (f"k{value % 5}", value)
                payload = json.dumps({"key": event[0], "value": event[1]}).encode()
                ack = await js.publish(self.data_subject, payload)
                self.held[ack.seq] = event
            await client.close()

        asyncio.run(publish())

    def delete(self, seqs: list[int]) -> None:
        """Delete messages: the gaps every read, and every replay, must skip alike."""

        async def delete() -> None:
            client = await self._connect()
            for seq in seqs:
                await client.jetstream().delete_msg(self.name, seq)
                self.held.pop(seq, None)
            await client.close()

        asyncio.run(delete())

    def events(self) -> Positioned:
        return sorted(self.held.items())


def nats_overrides(stream: NatsStream) -> dict[str, Any]:
    return {
        **LOCAL_SPARK,
        "source.url": stream.url,
        "source.stream": stream.name,
        "source.subject": stream.data_subject,
        "source.options.maxMessagesPerTrigger": 50,
        "source.options.messagesPerPartition": 30,
    }


def _local_spec(path: Path, tmp_path: Path, overrides: dict[str, Any]) -> JobSpec:
    return load_spec(
        path,
        {
            "storage.root": str(tmp_path / "data"),
            "checkpoint.dir": str(tmp_path / "checkpoint"),
            **overrides,
        },
    )


@pytest.mark.nats
def test_nats_source_gives_exact_totals_and_resumes(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    stream = NatsStream(nats_server.url).create()
    stream.publish(range(0, 180))
    stream.delete([2, 51, 52, 100])  # gaps, one at a batch boundary (50 per batch)
    spec = _local_spec(NATS_SPEC, tmp_path, nats_overrides(stream))
    assert _run(spec).batches == 4  # sequences 1..180 at 50 per batch
    assert assert_exact(spec, stream.events(), "seq", before=0) == 4

    stream.publish(range(180, 240))
    assert _run(spec).batches == 2  # resumed from the checkpointed sequence 180
    assert assert_exact(spec, stream.events(), "seq", before=0) == 6


@pytest.mark.nats
def test_a_missing_stream_or_server_fails_before_spark_starts(nats_server: NatsServer) -> None:
    missing = SourceSpec(type="nats", url=nats_server.url, stream="NO_SUCH_STREAM")
    with pytest.raises(SourceError, match="'NO_SUCH_STREAM' does not exist.*fix source.stream"):
        build_nats_source(None, missing)  # type: ignore[arg-type] - never reached
    down = SourceSpec(type="nats", url=f"nats://127.0.0.1:{free_port()}", stream="S")
    with pytest.raises(SourceError, match="cannot connect to NATS.*check source.url"):
        build_nats_source(None, down)  # type: ignore[arg-type]


# -- Delta -----------------------------------------------------------------------------


@dataclass
class Upstream:
    """An upstream Delta table the test appends to, commit by commit."""

    location: Location
    partition_by: list[str] | None = None
    events: Positioned = field(default_factory=list)

    def append(self, values: range) -> int:
        """One commit of events `k{v % 3}` = v (key `a b` for v % 3 == 2: a URL-encoded path)."""
        rows = [("a b" if v % 3 == 2 else f"k{v % 3}", v) for v in values]
        data = pa.table(
            {"key": [k for k, _ in rows], "value": pa.array([v for _, v in rows], pa.int64())}
        )
        write_deltalake(
            self.location.uri,
            data,
            mode="append",
            partition_by=self.partition_by,
            storage_options=self.location.storage_options(),
        )
        version = self.table().version()
        self.events += [(version, row) for row in rows]
        return version

    def table(self) -> DeltaTable:
        return DeltaTable(self.location.uri, storage_options=self.location.storage_options())


def test_delta_source_gives_exact_totals_resumes_and_refuses_rewrites(tmp_path: Path) -> None:
    # Partitioned by key: the key column comes from the log's partition values.
    upstream = Upstream(Location(str(tmp_path / "upstream")), partition_by=["key"])
    for first in range(0, 30, 10):
        upstream.append(range(first, first + 10))  # 3 files per commit (one per key)
    overrides = {**LOCAL_SPARK, "source.table": upstream.location.uri}
    spec = _local_spec(DELTA_SPEC, tmp_path, {**overrides, "source.options.maxFilesPerTrigger": 3})
    assert _run(spec).batches == 3  # one commit per batch
    assert assert_exact(spec, upstream.events, "version", before=-1) == 3

    upstream.append(range(30, 40))
    upstream.table().optimize.compact()  # removes files, but only rearranges rows: skipped
    upstream.append(range(40, 50))
    assert _run(spec).batches == 2  # [append], [optimize (nothing), append]
    assert assert_exact(spec, upstream.events, "version", before=-1) == 5

    upstream.table().delete("value = 41")
    deleted_at = upstream.table().version()
    with pytest.raises(Exception, match=rf"version {deleted_at} \(DELETE\).*skipChangeCommits"):
        _run(spec)


def test_delta_source_refuses_deletion_vectors_naming_the_version(tmp_path: Path) -> None:
    location = Location(str(tmp_path / "upstream"))
    schema = pa.schema([("key", pa.string()), ("value", pa.int64())])
    # delta-rs enables the feature but never writes vectors; a DV engine's commit is made here.
    DeltaTable.create(
        location.uri, schema=schema, configuration={"delta.enableDeletionVectors": "true"}
    )
    upstream = Upstream(location)
    first = upstream.append(range(0, 10))
    upstream.append(range(10, 20))
    overrides = {**LOCAL_SPARK, "source.table": location.uri}
    spec = _local_spec(DELTA_SPEC, tmp_path, overrides)
    assert _run(spec).batches == 2  # one append per batch (the create adds no file)
    assert_exact(spec, upstream.events, "version", before=-1)

    vector_at = delete_rows_with_deletion_vector(tmp_path / "upstream", first, [0, 3])
    assert len(pa.table(upstream.table().deletion_vectors())) == 1  # delta-rs reads it
    upstream.append(range(20, 30))
    with pytest.raises(Exception, match=rf"DeletionVectorError.*version {vector_at} \(DELETE\)"):
        _run(spec)

    skipping = _local_spec(
        DELTA_SPEC, tmp_path, {**overrides, "source.options.skipChangeCommits": True}
    )
    assert _run(skipping).batches == 1  # the vector commit (skipped) and the append
    assert_exact(skipping, upstream.events, "version", before=-1)


def test_a_missing_table_fails_before_spark_starts(tmp_path: Path) -> None:
    missing = SourceSpec(type="delta", table=str(tmp_path / "nothing"))
    with pytest.raises(SourceError, match="is not a Delta table.*create it first"):
        build_delta_source(None, missing)  # type: ignore[arg-type] - never reached


@pytest.mark.s3
def test_delta_source_reads_a_table_on_s3(tmp_path: Path, s3_root: str) -> None:
    upstream = Upstream(Location(f"{s3_root}/upstream", S3Settings.from_env()))
    upstream.append(range(0, 20))
    upstream.append(range(20, 30))
    spec = _local_spec(DELTA_SPEC, tmp_path, {**LOCAL_SPARK, "source.table": upstream.location.uri})
    assert _run(spec).batches == 2
    assert_exact(spec, upstream.events, "version", before=-1)


# -- SIGKILL and resume ----------------------------------------------------------------


@dataclass
class Driver:
    """A job's driver as a real process (its own session), killed and restarted."""

    spec_path: Path
    workdir: Path
    overrides: dict[str, Any]
    history: list[str] = field(default_factory=list)

    @property
    def spec(self) -> JobSpec:
        return _local_spec(self.spec_path, self.workdir, self.overrides)

    def _command(self) -> list[str]:
        command = [sys.executable, "-m", "streamkeeper", "run", str(self.spec_path)]
        command += ["--available-now", "--root", str(self.workdir / "data")]
        command += ["--checkpoint-dir", str(self.workdir / "checkpoint")]
        for key, value in self.overrides.items():
            command += ["--set", f"{key}={value}"]
        return command

    def run(self, *, crash_at: str | None = None, kill_randomly: bool = False) -> str:
        """Run once: 'killed' or 'finished'; raises with the log if the driver failed."""
        env = driver_env(crash_at)
        log_path = self.workdir / f"run-{len(self.history) + 1}.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                self._command(),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                start_new_session=True,
            )
            try:
                note = self._kill_mid_run(process, log_path) if kill_randomly else ""
                code = process.wait(timeout=240)
            finally:
                _kill_group(process)
        outcome = {0: "finished", -signal.SIGKILL: "killed"}.get(code, f"failed ({code})")
        self.history.append(f"crash_at={crash_at} {note}-> {outcome}")
        if outcome.startswith("failed"):
            raise AssertionError(
                f"driver {outcome}: {self.history}\n{log_path.read_text()[-4000:]}"
            )
        return outcome

    def _kill_mid_run(self, process: subprocess.Popen, log_path: Path) -> str:
        """SIGKILL the process group at a random instant after this run's first pre-commit."""
        deadline = time.monotonic() + 180
        while process.poll() is None and time.monotonic() < deadline:
            if b"pre-committed" in log_path.read_bytes():
                break
            time.sleep(0.05)
        delay = random.uniform(0.0, 1.5)
        time.sleep(delay)
        _kill_group(process)
        return f"random kill {delay:.2f}s after a pre-commit "

    def finish(self) -> None:
        """Restart until done: in this process, whose Spark is warm (a cold start costs most)."""
        result = _run(self.spec)
        self.history.append(f"in-process restart: {result.batches} batches -> finished")


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)  # the driver, its JVM and Python workers
    except ProcessLookupError:
        pass
    process.wait()


@pytest.mark.nats
def test_nats_source_survives_sigkills(tmp_path: Path, nats_server: NatsServer) -> None:
    stream = NatsStream(nats_server.url).create()
    stream.publish(range(0, 300))
    stream.delete([10, 149, 150])
    driver = Driver(NATS_SPEC, tmp_path, nats_overrides(stream))
    # Killed with batch 1's manifest written but no commits/1: Spark replays batch 1.
    assert driver.run(crash_at="batch_after_manifest:2") == "killed", driver.history
    stream.publish(range(300, 400))  # the stream grows while the job is down
    driver.run(kill_randomly=True)
    driver.finish()
    assert assert_exact(driver.spec, stream.events(), "seq", before=0) == 8, driver.history


def test_delta_source_survives_sigkills(tmp_path: Path) -> None:
    upstream = Upstream(Location(str(tmp_path / "upstream")))
    for first in range(0, 60, 10):
        upstream.append(range(first, first + 10))
    driver = Driver(DELTA_SPEC, tmp_path, {**LOCAL_SPARK, "source.table": upstream.location.uri})
    # Killed with commits/0 written and no table committed: recovery commits the manifest.
    assert driver.run(crash_at="before_delta_commit:1") == "killed", driver.history
    for first in range(60, 80, 10):
        upstream.append(range(first, first + 10))  # the table grows while the job is down
    driver.run(kill_randomly=True)
    driver.finish()
    assert assert_exact(driver.spec, upstream.events, "version", before=-1) == 8, driver.history
