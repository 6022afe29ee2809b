"""Savepoints of a running job with real Spark, local storage and SeaweedFS: taken under
steady traffic (the state, the source offsets and each table agree), a command sent
twice runs once, a restore into a fresh checkpoint directory is exact, stop-with-savepoint
at random instants keeps the output exact and the next start continues exactly, a
savepoint of another topology is refused, and a canonical stop-with-savepoint restores
into changed code on another partition count (4 -> 3, 4 -> 7), exactly."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jobs.keyed_totals.sample_events import expected_results, write_event_files
from streamkeeper import injection
from streamkeeper.cli import app
from streamkeeper.client import StreamkeeperClient
from streamkeeper.errors import IncompatibleSavepointError
from streamkeeper.reader import read_table_rows
from streamkeeper.runtime.runner import RunOptions, resolve_paths, run_job
from streamkeeper.snapshots.savepoint_state import read_state
from streamkeeper.spec import JobSpec, load_spec
from tests.conftest import SAMPLE_SPEC
from tests.support.traffic import (
    BackgroundRun,
    Feeder,
    check_changes,
    totals_prefix,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

JOB = "keyed-totals"
HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
STOPS = int(os.environ.get("STREAMKEEPER_SAVEPOINT_STOPS", "10"))


def _spec(tmp_path: Path, root: str, checkpoint: str, **overrides: object) -> JobSpec:
    return load_spec(
        SAMPLE_SPEC,
        {
            "source.path": str(tmp_path / "events"),
            "storage.root": root,
            "checkpoint.dir": str(tmp_path / checkpoint),
            "checkpoint.interval": "300ms",
            "checkpoint.externalized.enabled": True,
            "spark.master": "local[2]",
            "spark.shuffle_partitions": 2,
            "spark.conf.spark.sql.streaming.stateStore.providerClass": HDFS_PROVIDER,
            **overrides,
        },
    )


def _start(spec: JobSpec, **options: object) -> BackgroundRun:
    run = BackgroundRun(
        spec, RunOptions(spec_dir=SAMPLE_SPEC.parent, command_poll_interval=0.2, **options)
    )
    run.start()
    return run


def _head_seq(client: StreamkeeperClient) -> int:
    try:
        head = client.status(JOB).head
    except Exception:  # noqa: BLE001 - not started yet
        return -1
    return -1 if head is None else head.seq


def _rows(spec: JobSpec, sink: str, version: int | None = None) -> list[dict]:
    target = resolve_paths(spec).targets[sink]
    return read_table_rows(target.location.uri, version=version, location=target.location)


def _totals(rows: list[dict]) -> dict[str, tuple[int, int]]:
    return {r["key"]: (r["events"], r["total"]) for r in rows}


def _changes(spec: JobSpec) -> list[tuple[str, int, int]]:
    return [(r["key"], r["events"], r["total"]) for r in _rows(spec, "changes")]


def _source_files(checkpoint: Path, log_offset: int) -> set[str]:
    """Names of the files the file source logged up to `log_offset` (compacted or not)."""
    names = set()
    for entry_file in (checkpoint / "sources" / "0").glob("[0-9]*"):
        for line in entry_file.read_text().splitlines()[1:]:
            entry = json.loads(line) if line.strip() else None
            if entry is not None and entry["batchId"] <= log_offset:
                names.add(Path(entry["path"]).name)
    return names


def _check_agrees(
    client: StreamkeeperClient, spec: JobSpec, savepoint_id: str, files: list[Path]
) -> int:
    """The savepoint's state, its source offsets and each table at its seq agree.

    Returns:
        How many input files the savepoint covers.
    """
    manifest = client.describe_savepoint(savepoint_id).manifest
    assert manifest is not None
    (found,) = read_state(client.location, savepoint_id, uid=None, key=None, limit=10**6)
    state = {r["key"]["key"]: (r["value"]["count"], r["value"]["sum"]) for r in found.rows}
    covered = totals_prefix(state, files)
    table = _totals(_rows(spec, "totals", manifest.tables["totals"].version))
    assert table == state, "the totals table at the savepoint's seq is not its state"
    marker = client.store.read_json(resolve_paths(spec).layout.marker(manifest.seq))
    assert marker is not None and marker["batch_id"] == manifest.batch_id
    assert {n: t.version for n, t in manifest.tables.items()} == marker["versions"]
    log_offset = manifest.source_offsets[0]["logOffset"]
    assert _source_files(spec_checkpoint(spec), log_offset) == {f.name for f in files[:covered]}
    return covered


def spec_checkpoint(spec: JobSpec) -> Path:
    return resolve_paths(spec).checkpoint_dir


@pytest.mark.parametrize(
    ("storage", "restore"),
    [("local", "pinned"), pytest.param("seaweedfs", "self_contained", marks=pytest.mark.s3)],
)
def test_a_savepoint_under_steady_traffic_then_a_restore_into_a_fresh_directory(
    tmp_path: Path, request: pytest.FixtureRequest, storage: str, restore: str
) -> None:
    root = str(tmp_path / "data") if storage == "local" else request.getfixturevalue("s3_root")
    feeder = Feeder(tmp_path / "events")
    first = _spec(tmp_path, root, "ck-1")
    client = StreamkeeperClient(root)
    run = _start(first)
    feeder.start()
    try:
        wait_for(lambda: _head_seq(client) >= 2, 300, "three committed batches")
        # The same command twice (a retried sender) runs once.
        pinned = client.send_command(JOB, "savepoint", command_id="steady-1")
        assert client.send_command(JOB, "savepoint", command_id="steady-1") == pinned
        copied = client.send_command(JOB, "savepoint", self_contained=True)
        results = {c.id: client.wait_for_result(JOB, c.id, timeout=300) for c in (pinned, copied)}
        assert all(r.ok for r in results.values()), results
        taken = [e for e in client.savepoints(JOB) if e.command_id == "steady-1"]
        assert len(taken) == 1 and taken[0].storage == "pinned"
        chosen = results[pinned.id if restore == "pinned" else copied.id].savepoint_id
        assert chosen is not None
        before = _head_seq(client)
        wait_for(lambda: _head_seq(client) >= before + 2, 300, "the job to keep running")
    finally:
        client.send_command(JOB, "cancel")  # the machine is lost right after
        run.finish()
    covered = _check_agrees(client, first, chosen, feeder.files)
    assert covered >= 3

    shutil.rmtree(tmp_path / "ck-1")
    # The backlog the feeder left is caught up with in larger batches.
    second = _spec(tmp_path, root, "ck-2", **{"source.options.maxFilesPerTrigger": 20})
    run = _start(second, from_savepoint=chosen, allow_rewind=True)
    files = feeder.stop()
    try:
        wait_for(
            lambda: _totals(_rows(second, "totals")) == expected_results(files)[0],
            300,
            "the restored job to process every file",
        )
    finally:
        stop = client.send_command(JOB, "stop")
        stopped = client.wait_for_result(JOB, stop.id, timeout=300)
        run.finish()
    assert stopped.ok and stopped.savepoint_id is not None
    check_changes_after_rewind(_changes(second), files, covered)
    assert client.status(JOB).runner.state == "STOPPED"  # type: ignore[union-attr]
    record = client.store.read_json(f"jobs/{JOB}/job.json") or {}
    assert record["restored_from_savepoint"]["id"] == chosen


def check_changes_after_rewind(
    changes: list[tuple[str, int, int]], files: list[Path], covered: int
) -> None:
    """Exact up to the savepoint; after it, the rewound batches may have committed twice."""
    _, upto_savepoint = expected_results(files[:covered])
    once = [row for row in changes if row in set(upto_savepoint)]
    assert sorted(once) == upto_savepoint, "output up to the savepoint is not exactly once"
    check_changes(sorted(set(changes)), files)
    latest: dict[str, tuple[int, int]] = {}
    for key, events, total in changes:
        latest[key] = max(latest.get(key, (0, 0)), (events, total))
    assert latest == expected_results(files)[0]


def test_stop_with_savepoint_at_random_instants_keeps_the_output_exact(tmp_path: Path) -> None:
    """Each stop drains the batch in flight; the next start restores the savepoint into a
    fresh directory and goes on exactly where it stopped."""
    root = str(tmp_path / "data")
    client = StreamkeeperClient(root)
    rng = random.Random(11)
    # Batches take a while, so that most stops arrive while one is in flight.
    injection.register("batch_start", lambda **_: __import__("time").sleep(0.4))
    feeder = Feeder(tmp_path / "events", period=0.5)
    feeder.start()
    savepoint, in_flight, spec = None, 0, _spec(tmp_path, root, "ck-0")
    try:
        for index in range(STOPS):
            spec = _spec(tmp_path, root, f"ck-{index}")
            run = _start(spec, from_savepoint=savepoint)
            start_seq = _head_seq(client)
            wait_for(lambda s=start_seq: _head_seq(client) > s, 300, "a batch of the new run")
            __import__("time").sleep(rng.uniform(0.0, 1.5))
            stop = client.send_command(JOB, "stop")
            result = client.wait_for_result(JOB, stop.id, timeout=300)
            run.finish()
            assert result.ok, result
            in_flight += _check_stop(client, spec, result, feeder.files)
            savepoint = result.savepoint_id
        assert in_flight >= STOPS // 3, f"only {in_flight} stops arrived during a batch"
        files = feeder.stop()
        final = _spec(tmp_path, root, "ck-final")
        run_job(
            final,
            RunOptions(spec_dir=SAMPLE_SPEC.parent, available_now=True, from_savepoint=savepoint),
        )
    finally:
        feeder.stop()
        injection.clear()
    assert _totals(_rows(final, "totals")) == expected_results(files)[0]
    changes = _changes(final)
    check_changes(changes, files)
    latest: dict[str, tuple[int, int]] = {}
    for key, events, total in changes:
        latest[key] = max(latest.get(key, (0, 0)), (events, total))
    assert latest == expected_results(files)[0]
    _refuses_another_topology(tmp_path, root, savepoint)  # type: ignore[arg-type]


def _check_stop(client: StreamkeeperClient, spec: JobSpec, result, files: list[Path]) -> int:  # noqa: ANN001
    """After a stop: STOPPED with the savepoint at the head, the output a prefix, once."""
    status = client.status(JOB)
    assert status.runner is not None and status.runner.state == "STOPPED"
    beat = client.store.read_json(f"jobs/{JOB}/heartbeat.json") or {}
    assert beat["savepoint_id"] == result.savepoint_id
    manifest = client.describe_savepoint(result.savepoint_id).manifest
    assert manifest is not None and status.head is not None
    assert manifest.seq == status.head.seq  # nothing committed after the savepoint
    totals_prefix(_totals(_rows(spec, "totals")), files)
    check_changes(_changes(spec), files)
    drained = result.details.get("in_flight_batch")
    if drained is None:
        return 0
    assert drained <= manifest.batch_id  # the batch in flight finished and is in it
    return 1


def _refuses_another_topology(tmp_path: Path, root: str, savepoint_id: str) -> None:
    """Another partition count, or other keys: refused before anything changes."""
    epochs = sorted((tmp_path / "data" / "lineages" / JOB / "epochs").iterdir())
    for overrides, message in [
        ({"spark.shuffle_partitions": 3}, "in 2 partitions; the spec asks for 3"),
        ({"transform": "tests.integration.jobs.by_value:build"}, "keyed by ['key']"),
    ]:
        spec = _spec(tmp_path, root, "ck-other", **overrides)
        with pytest.raises(IncompatibleSavepointError, match=re.escape(message)):
            options = RunOptions(
                spec_dir=SAMPLE_SPEC.parent, from_savepoint=savepoint_id, allow_rewind=True
            )
            run_job(spec, options)
    assert sorted((tmp_path / "data" / "lineages" / JOB / "epochs").iterdir()) == epochs
    assert not (tmp_path / "ck-other").exists()


def test_state_cli_prints_a_native_savepoints_rows(tmp_path: Path) -> None:
    write_event_files(tmp_path / "events", files=2, events_per_file=200)
    root = str(tmp_path / "data")
    spec = _spec(tmp_path, root, "ck")
    client = StreamkeeperClient(root)
    run = _start(spec)
    wait_for(lambda: _head_seq(client) >= 1, 300, "two committed batches")
    stop = client.send_command(JOB, "stop")
    result = client.wait_for_result(JOB, stop.id, timeout=300)
    run.finish()
    totals = _totals(_rows(spec, "totals"))
    key = sorted(totals)[0]
    command = ["state", result.savepoint_id, "--root", root, "--key", key, "--json"]
    shown = CliRunner().invoke(app, command)  # type: ignore[list-item]
    assert shown.exit_code == 0, shown.output
    (operator,) = json.loads(shown.output)
    assert operator["uid"] == "op-0"
    (row,) = operator["rows"]
    assert (row["value"]["count"], row["value"]["sum"]) == totals[key]
    listed = CliRunner().invoke(app, ["savepoints", JOB, "--root", root, "--json"])
    assert json.loads(listed.output)["savepoints"][0]["id"] == result.savepoint_id


ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


@pytest.mark.parametrize(("backend", "partitions"), [("hdfs", 3), ("rocksdb", 7)])
def test_a_canonical_stop_savepoint_restores_into_changed_code_on_other_partitions(
    tmp_path: Path, backend: str, partitions: int
) -> None:
    """Stop with a canonical savepoint on 4 partitions; the job comes back with an added
    output column, on 3 or 7 partitions, into new tables: the state carried over exactly."""
    files = write_event_files(tmp_path / "events", files=3, events_per_file=300)
    root = str(tmp_path / "data")
    client = StreamkeeperClient(root)
    store = {
        "state_backend.type": backend,
        "spark.conf.spark.sql.streaming.stateStore.providerClass": (
            HDFS_PROVIDER if backend == "hdfs" else ROCKSDB_PROVIDER
        ),
    }
    old = _spec(tmp_path, root, "ck-old", **{"spark.shuffle_partitions": 4, **store})
    run = _start(old)
    wait_for(lambda: _head_seq(client) >= 2, 300, "the three files committed")
    stop = client.send_command(JOB, "stop", format="canonical")
    result = client.wait_for_result(JOB, stop.id, timeout=300)
    run.finish()
    assert result.ok and result.savepoint_id is not None, result
    manifest = client.describe_savepoint(result.savepoint_id).manifest
    assert manifest is not None and manifest.format == "canonical"
    assert [(op.uid, op.partitions) for op in manifest.operators] == [("op-0", 4)]

    files += write_event_files(tmp_path / "events", files=3, events_per_file=300, first_file=3)
    new = _spec(
        tmp_path,
        root,
        "ck-new",
        **{
            "spark.shuffle_partitions": partitions,
            "transform": "tests.integration.jobs.totals_with_mean:build",
            "sinks.0.table": "tables/totals_with_mean",
            "sinks.1.table": "tables/changes_with_mean",
            **store,
        },
    )
    options = RunOptions(
        spec_dir=SAMPLE_SPEC.parent, available_now=True, from_savepoint=result.savepoint_id
    )
    assert run_job(new, options).batches == 3

    totals, all_changes = expected_results(files)
    _, old_changes = expected_results(files[:3])
    touched = {key for key, *_ in expected_results(files[3:])[1]}
    rows = _rows(new, "totals")
    assert {r["key"] for r in rows} == touched
    assert {r["key"]: (r["events"], r["total"]) for r in rows} == {k: totals[k] for k in touched}
    assert all(r["mean"] == r["total"] / r["events"] for r in rows)
    new_changes = Counter(all_changes) - Counter(old_changes)
    assert sorted(_changes(new)) == sorted(new_changes.elements())
