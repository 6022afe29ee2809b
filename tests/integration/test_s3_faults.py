"""The S3 path misbehaving, through a real fault-injection proxy in front of SeaweedFS:
transient errors at start-up, and a Delta commit whose response is lost after it landed."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamkeeper.commit.tables import TableTarget
from streamkeeper.lineage.control import ControlPlane, Fence
from streamkeeper.lineage.heartbeat import Heartbeat
from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.storage import Location, S3Settings, probe
from tests.conftest import S3_BUCKET
from tests.support.driver import driver_env
from tests.support.s3_proxy import Fault, FaultPlan, S3FaultProxy

pytestmark = [pytest.mark.integration, pytest.mark.s3]


@pytest.fixture
def proxy(seaweed: object, s3_env: dict[str, str]) -> Iterator[S3FaultProxy]:
    with S3FaultProxy(f"127.0.0.1:{seaweed.port}") as running:  # type: ignore[attr-defined]
        yield running


def _start_through(proxy: S3FaultProxy, script: str, *args: str) -> subprocess.Popen[str]:
    """Run `script` in its own process against the proxy, once it prints "ready".

    Its own process, as a driver is: delta-rs holds the GIL while it waits for S3, so a
    proxy thread in the same process could never answer. The script then waits for a
    line on stdin: the test installs its faults first.
    """
    env = {**driver_env(), "AWS_ENDPOINT_URL": proxy.endpoint_url}
    process = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stdin is not None
    assert process.stdout.readline().strip() == "ready"
    return process


def _through(proxy: S3FaultProxy, uri: str) -> Location:
    settings = S3Settings.from_env()
    return Location(
        uri,
        S3Settings(
            proxy.endpoint_url,
            settings.region,
            settings.access_key,
            settings.secret_key,
            allow_http=True,
        ),
    )


def test_the_start_up_probe_rides_out_transient_faults(proxy: S3FaultProxy) -> None:
    proxy.set_faults(FaultPlan([Fault("error_503", 0.5), Fault("error_500", 0.2)], seed=4))
    root = _through(proxy, f"s3://{S3_BUCKET}/probe-{uuid.uuid4().hex[:8]}")
    probe(root)  # head bucket, put, delete: each may take several attempts
    stats = proxy.stats()
    assert stats["error_503"] + stats["error_500"] > 0, stats  # the faults did fire


COMMIT_THROUGH_PROXY = """
import json, sys
import pyarrow as pa, pyarrow.parquet as pq
from streamkeeper.commit.tables import TableCommitter, TableTarget, ensure_table
from streamkeeper.commit.wal import DataFile, SinkBatch
from streamkeeper.storage import Location, S3Settings

uri, local = sys.argv[1], sys.argv[2]
table = Location(uri, S3Settings.from_env()).child("tables/t")
target = TableTarget("t", table, "streamkeeper:lin:t", "fence:lin")
ensure_table(target, pq.read_schema(local))
folder = table.child("sk-lin/00000000000000000007")
with open(local, "rb") as source, folder.arrow_filesystem().open_output_stream(
    folder.fs_path + "/e1-a.parquet"
) as sink:
    sink.write(source.read())
size = len(open(local, "rb").read())
files = [DataFile("sk-lin/00000000000000000007/e1-a.parquet", size, 2, '{"numRecords": 2}', "t")]
print("ready", flush=True)
sys.stdin.readline()  # the test installs its faults now
part = SinkBatch(table.uri, "append", "exactly_once", files=files)
print(json.dumps({"version": TableCommitter(target, epoch=1).commit(part, seq=7)}), flush=True)
"""


def test_a_commit_whose_response_is_lost_is_not_repeated(
    proxy: S3FaultProxy, tmp_path: Path
) -> None:
    uri = f"s3://{S3_BUCKET}/lost-{uuid.uuid4().hex[:8]}"
    local = tmp_path / "rows.parquet"
    schema = pa.schema([("key", pa.string()), ("n", pa.int64())])
    pq.write_table(pa.table({"key": ["a", "b"], "n": [1, 2]}, schema=schema), local)
    committer = _start_through(proxy, COMMIT_THROUGH_PROXY, uri, str(local))
    # Every write to the Delta log lands, and its answer is lost.
    proxy.set_faults(FaultPlan([Fault("reset_after_apply", 1.0, {"PUT"}, r"_delta_log/")]))
    out, _ = committer.communicate("go\n", timeout=120)
    assert committer.returncode == 0, out
    version = json.loads(out.strip().splitlines()[-1])["version"]
    assert proxy.stats()["reset_after_apply"] >= 1
    direct = Location(uri, S3Settings.from_env()).child("tables/t")
    target = TableTarget("t", direct, "streamkeeper:lin:t", "fence:lin")
    table = target.open()
    assert table.version() == version == 1  # one commit, not two
    assert target.committed_seq() == 7
    rows = table.to_pyarrow_dataset().to_table(use_threads=False).to_pylist()
    assert sorted(r["key"] for r in rows) == ["a", "b"]


def test_staged_rows_are_read_back_through_s3_errors(proxy: S3FaultProxy) -> None:
    """A batch reads its staged merge rows back (the key column only, to check one row per
    key): an S3 error on that small ranged read used to fail at once, unretried, because
    the AWS SDK wrote the error's body into the range's buffer ("Failed to flush response
    stream"); found by the fault run, where it failed batches and upgrade probations."""
    from streamkeeper.commit.tables import read_staged_files
    from streamkeeper.commit.wal import DataFile

    location = _through(proxy, f"s3://{S3_BUCKET}/staged-{uuid.uuid4().hex[:8]}")
    path = f"{location.fs_path}/e1-part.parquet"
    pq.write_table(
        pa.table({"key": ["a", "b", "c"], "n": [1, 2, 3]}),
        path,
        filesystem=location.arrow_filesystem(),
    )
    staged = [DataFile(f"{location.uri}/e1-part.parquet", 0, 3, "{}", "test")]
    proxy.set_faults(FaultPlan([Fault("error_503", 0.15, {"GET"})], seed=5))
    for _ in range(40):
        assert read_staged_files(staged, location, columns=["key"]).column("key").to_pylist() == [
            "a",
            "b",
            "c",
        ]
    stats = proxy.stats()
    assert stats["error_503"] > 5, stats


HISTORY_THROUGH_PROXY = """
import sys
from streamkeeper.observability.history import CheckpointHistory, CheckpointRecord
from streamkeeper.storage import Location, S3Settings

def record(seq):
    return CheckpointRecord(seq, seq, "q", "r", "2026-01-01T00:00:00Z", 1, 0, 0, 0, 0, 0, 1,
                            1.0, 1.0, "[]", 0, 0, "[]", seq)

history = CheckpointHistory(Location(sys.argv[1], S3Settings.from_env()))
history.append([record(0)])
print("ready", flush=True)
sys.stdin.readline()  # the test installs its faults now
try:
    history.append([record(1)])
except OSError as error:
    print("failed:", type(error).__name__, flush=True)
sys.stdin.readline()  # the test clears its faults now
print("kept", history.sweep_unreferenced(min_age=3600), flush=True)  # too young to go
print("kept", history.sweep_unreferenced(min_age=0), flush=True)
history.append([record(2)])
print("rows", [row["checkpoint_id"] for row in history.read()], flush=True)
"""


def test_a_failed_history_append_leaves_a_file_that_the_sweep_removes(
    proxy: S3FaultProxy,
) -> None:
    """delta-rs writes an append's file, then commits: a commit that fails leaves it."""
    from tests.support.delta_audit import known_files

    uri = f"s3://{S3_BUCKET}/history-{uuid.uuid4().hex[:8]}/lineages/lin/history"
    table = Location(uri, S3Settings.from_env())

    def unreferenced() -> set[str]:
        files = {k for k in table.store().list("") if not k.startswith("_delta_log/")}
        return files - known_files(table)

    writer = _start_through(proxy, HISTORY_THROUGH_PROXY, uri)
    assert writer.stdout is not None and writer.stdin is not None
    # Every write to the history's Delta log fails (not applied): the commit never lands.
    proxy.set_faults(FaultPlan([Fault("error_503", 1.0, {"PUT"}, r"history/_delta_log/")]))
    writer.stdin.write("\n")
    writer.stdin.flush()
    assert writer.stdout.readline().startswith("failed:")
    proxy.clear_faults()
    left = unreferenced()
    assert len(left) == 1, left  # the failed append's data file
    out, _ = writer.communicate("\n", timeout=300)
    assert writer.returncode == 0, out
    assert out.splitlines() == ["kept 1", "kept 0", "rows [0, 2]"], out
    assert unreferenced() == set()


def test_a_savepoints_state_file_is_read_through_s3_errors(proxy: S3FaultProxy) -> None:
    """A green restoring its handover savepoint read each canonical state file in ranged
    reads; an S3 error on one failed the task four times over and green never went live
    (found by the fault run in CI). Read whole, it is retried like any GET."""
    from streamkeeper.storage.parquet import open_parquet_whole

    location = _through(proxy, f"s3://{S3_BUCKET}/state-{uuid.uuid4().hex[:8]}")
    path = f"{location.fs_path}/part-0.parquet"
    # Small, as a part of a small job's state is: its column chunks are shorter than an
    # S3 error's body, which is what the SDK could not fit.
    keys = [{"key": f"k{i}"} for i in range(3)]
    rows = pa.table({"key": keys, "value": [{"events": i, "total": 10 * i} for i in range(3)]})
    pq.write_table(rows, path, filesystem=location.arrow_filesystem())
    proxy.set_faults(FaultPlan([Fault("error_503", 0.15, {"GET"})], seed=7))
    for _ in range(40):
        reader = open_parquet_whole(location.arrow_filesystem(), path)
        batches = list(reader.iter_batches(batch_size=300))
        assert [b.num_rows for b in batches] == [3]
        assert batches[0].column("value").to_pylist()[-1] == {"events": 2, "total": 20}
    assert proxy.stats()["error_503"] > 5


RESTORE_THROUGH_PROXY = """
import json, sys
import pyarrow as pa
from deltalake import write_deltalake
from streamkeeper.commit.tables import TableTarget, restore_table
from streamkeeper.storage import Location, S3Settings

table = Location(sys.argv[1], S3Settings.from_env()).child("tables/t")
for n in range(3):  # versions 0, 1, 2
    write_deltalake(table.uri, pa.table({"n": [n]}), mode="append",
                    storage_options=table.storage_options())
print("ready", flush=True)
sys.stdin.readline()  # the test installs its faults now
target = TableTarget("t", table, "streamkeeper:lin:t", "fence:lin")
print(json.dumps({"version": restore_table(target, 0, epoch=1)}), flush=True)
"""


def test_a_restore_whose_response_is_lost_is_recognised_not_made_again(proxy: S3FaultProxy) -> None:
    """A rollback restores each table to its savepoint version: the log entry of a RESTORE
    landed and its answer was lost, and the rollback failed halfway through its tables
    (found by the fault run). The restore is retried, and finds its own commit: it is not
    made twice."""
    uri = f"s3://{S3_BUCKET}/restore-{uuid.uuid4().hex[:8]}"
    restorer = _start_through(proxy, RESTORE_THROUGH_PROXY, uri)
    # The RESTORE's log entry (version 3) lands, and every answer to it is lost.
    proxy.set_faults(FaultPlan([Fault("reset_after_apply", 1.0, {"PUT"}, r"_delta_log/0+3\.json")]))
    out, _ = restorer.communicate("go\n", timeout=120)
    assert restorer.returncode == 0, out
    assert proxy.stats()["reset_after_apply"] >= 1
    version = json.loads(out.strip().splitlines()[-1])["version"]
    direct = TableTarget(
        "t",
        Location(uri, S3Settings.from_env()).child("tables/t"),
        "streamkeeper:lin:t",
        "fence:lin",
    )
    table = direct.open()
    assert table.version() == version == 3  # the landed restore, recognised by the retry
    assert table.history(1)[0]["streamkeeper.restore"] == "1:0"
    assert table.to_pyarrow_dataset().to_table().column("n").to_pylist() == [0]


def test_the_heartbeat_beats_again_soon_after_a_silent_outage(proxy: S3FaultProxy) -> None:
    """Every request hangs for OUTAGE_S (a partition: nothing answers, nothing refuses);
    then S3 answers again. The beats go through the fail-fast store, so a beat sent into
    the outage gives up in seconds and the next one lands soon after it ends. Through the
    patient store (30 s read timeout) the beat in flight would keep the heartbeat silent
    for about 30 s - OUTAGE_S after it: readers would presume the driver dead."""
    uri = f"s3://{S3_BUCKET}/beat-{uuid.uuid4().hex[:8]}"
    root = _through(proxy, uri)
    layout = LineageLayout(root, "lin", "job")
    control = ControlPlane(root.store(), layout)
    direct = ControlPlane(Location(uri, S3Settings.from_env()).store(), layout)
    lease = control.acquire()
    beat = Heartbeat(
        control,
        Fence(control, lease),
        facts=dict,
        interval=0.5,
        beats=lambda: ControlPlane(root.store(fail_fast=True), layout),
    )
    beat.start()
    try:
        _wait_for(lambda: (direct.heartbeat() or {}).get("state") == "RUNNING", 20)
        proxy.set_faults(FaultPlan([Fault("latency", 1.0, latency_ms=120_000)]))
        time.sleep(OUTAGE_S)
        proxy.clear_faults()
        healed = time.time()
        _wait_for(lambda: float(direct.heartbeat()["time"]) > healed, 30)
        silent_after = time.time() - healed
    finally:
        proxy.clear_faults()
        beat.stop("STOPPED")
    # Half the outage's length: far below the ~22 s the patient store's beat would take.
    assert silent_after < OUTAGE_S / 2 + 3, f"first beat {silent_after:.1f} s after the outage"
    assert direct.heartbeat()["state"] == "STOPPED"


OUTAGE_S = 8.0


def _wait_for(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout:g} s"
        time.sleep(0.1)
