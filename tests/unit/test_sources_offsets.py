"""The replayable sources' pure parts: offsets, batch ranges, append-only commits, rows."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxFiles, ReadMaxRows

from streamkeeper.errors import SourceError, SpecError
from streamkeeper.sources.delta import (
    Commit,
    DataFile,
    DeletionVectorError,
    DeltaConfig,
    DeltaStreamReader,
    NotAppendOnlyError,
    admit,
    appended_files,
    conform,
    group_files,
    location_options,
    parse_commit,
    parse_version,
    version_offset,
)
from streamkeeper.sources.nats import (
    NatsConfig,
    NatsPartition,
    NatsStreamReader,
    check_not_behind,
    check_replayable,
    next_end,
    parse_seq,
    seq_offset,
    split_range,
)
from streamkeeper.storage import Location, S3Settings
from tests.support.deletion_vectors import deletion_vector_actions

NATS = NatsConfig(url="nats://127.0.0.1:4222", stream="EVENTS")

# -- NATS ------------------------------------------------------------------------------


def test_nats_offsets_survive_the_checkpoint_json() -> None:
    # Spark stores the offset as JSON in offsets/N and hands it back after a restart.
    assert parse_seq(json.loads(json.dumps(seq_offset(42)))) == 42
    assert NatsStreamReader(NATS).initialOffset() == {"seq": 0}


@pytest.mark.parametrize("offset", [{"version": 3}, {"seq": -1}, {"seq": "3"}, {"seq": True}])
def test_foreign_offsets_are_refused_with_the_fix(offset: dict[str, Any]) -> None:
    with pytest.raises(SourceError, match="new directory") as caught:
        parse_seq(offset)
    assert repr(offset) in str(caught.value)


@pytest.mark.parametrize(
    ("start", "last", "target", "max_rows", "end"),
    [
        (10, 10, None, None, 10),  # nothing new
        (10, 90, None, None, 90),  # everything new
        (10, 90, 40, None, 40),  # Trigger.AvailableNow stops at the target
        (10, 90, None, 25, 35),  # maxMessagesPerTrigger
        (10, 90, 30, 25, 30),  # both: the lower wins
        (50, 90, 40, 25, 50),  # resumed past the target: nothing more
    ],
)
def test_next_batch_end(
    start: int, last: int, target: int | None, max_rows: int | None, end: int
) -> None:
    assert next_end(start, last, target=target, max_rows=max_rows) == end


def test_ranges_split_into_tasks_cover_each_sequence_once() -> None:
    assert split_range(0, 25, 10) == [(0, 10), (10, 20), (20, 25)]
    assert split_range(7, 7, 10) == []
    reader = NatsStreamReader(NatsConfig(url="nats://x:1", stream="S", messages_per_partition=4))
    parts = reader.partitions(seq_offset(10), seq_offset(19))
    assert [(p.start, p.end, p.batch_start) for p in parts] == [
        (10, 14, 10),
        (14, 18, 10),
        (18, 19, 10),
    ]


def test_nats_reader_and_partitions_pickle_to_executors() -> None:
    reader = NatsStreamReader(NatsConfig(url="nats://x:1", stream="S", max_messages=5))
    reader.target = 99
    copy = pickle.loads(pickle.dumps(reader))
    assert copy.config == reader.config and copy.target == 99
    assert copy.getDefaultReadLimit() == ReadMaxRows(5)
    assert NatsStreamReader(NATS).getDefaultReadLimit() == ReadAllAvailable()
    partition = pickle.loads(pickle.dumps(NatsPartition(3, 9, 3)))
    assert (partition.start, partition.end) == (3, 9)


def test_nats_options_are_case_insensitive_and_checked() -> None:
    config = NatsConfig.from_options(
        {
            "URL": "nats://h:1",
            "stream": "S",
            "maxmessagespertrigger": "7",
            "failOnDataLoss": "false",
        }
    )
    assert (config.max_messages, config.fail_on_data_loss, config.subject) == (7, False, None)
    with pytest.raises(SpecError, match="maxMessagePerTrigger"):
        NatsConfig.from_options({"url": "u", "stream": "S", "maxMessagePerTrigger": "7"})
    with pytest.raises(SpecError, match="maxMessagesPerTrigger='0'"):
        NatsConfig.from_options({"url": "u", "stream": "S", "maxMessagesPerTrigger": "0"})


def test_a_recreated_stream_is_refused() -> None:
    with pytest.raises(SourceError, match="below the checkpointed offset 500"):
        check_not_behind(NATS, last=12, offset=500)


def test_messages_lost_to_retention_stop_the_batch_unless_allowed() -> None:
    # Batch (100, 150]: the stream now starts at 120, so 101..119 are gone.
    with pytest.raises(SourceError, match=r"101\.\.119.*failOnDataLoss: false"):
        check_replayable(NATS, 100, 150, batch_start=100, first=120, last=200)
    # The first batch of a query may start below the stream's first sequence.
    check_replayable(NATS, 0, 150, batch_start=0, first=120, last=200)
    lenient = NatsConfig(url=NATS.url, stream=NATS.stream, fail_on_data_loss=False)
    check_replayable(lenient, 100, 150, batch_start=100, first=120, last=200)


# -- Delta -----------------------------------------------------------------------------


def _commit(version: int, *names: str, operation: str = "WRITE", **counts: int) -> Commit:
    added = tuple(DataFile(f"/t/{name}", 10) for name in sorted(names))
    return Commit(version=version, operation=operation, added=added, **counts)


def test_delta_offsets_survive_the_checkpoint_json() -> None:
    assert parse_version(json.loads(json.dumps(version_offset(-1)))) == -1
    with pytest.raises(SourceError, match="not a Delta offset"):
        parse_version({"seq": 4})


def test_a_commit_file_is_parsed_into_its_appended_files() -> None:
    # As delta-rs writes them: URL-encoded paths, partition values as strings.
    lines = [
        json.dumps({"commitInfo": {"operation": "WRITE", "operationParameters": {}}}),
        json.dumps({"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}),
        json.dumps(
            {
                "add": {
                    "path": "key=a%2520b/part-2.parquet",
                    "partitionValues": {"key": "a b", "day": None},
                    "size": 7,
                    "dataChange": True,
                }
            }
        ),
        "",
        json.dumps({"add": {"path": "key=c/part-1.parquet", "partitionValues": {}, "size": 5}}),
        json.dumps({"txn": {"appId": "x", "version": 3}}),
    ]
    commit = parse_commit("s3://lake/events", 4, lines)
    assert (commit.version, commit.operation, commit.removed, commit.deletion_vectors) == (
        4,
        "WRITE",
        0,
        0,
    )
    assert commit.added == (
        DataFile("s3://lake/events/key=a%20b/part-2.parquet", 7, (("day", None), ("key", "a b"))),
        DataFile("s3://lake/events/key=c/part-1.parquet", 5, ()),
    )


def test_deletion_vectors_and_removals_are_counted() -> None:
    add = {"path": "p.parquet", "size": 10, "partitionValues": {}, "stats": '{"numRecords":3}'}
    commit = parse_commit(
        "/t", 9, [json.dumps(a) for a in deletion_vector_actions(add, [1], "DELETE")]
    )
    assert (commit.operation, commit.removed, commit.deletion_vectors) == ("DELETE", 1, 1)


def test_an_append_yields_exactly_the_new_files_in_path_order() -> None:
    added = appended_files("/t", _commit(3, "c.parquet", "b.parquet"))
    assert [f.uri for f in added] == ["/t/b.parquet", "/t/c.parquet"]


def test_a_commit_that_removes_files_is_refused_naming_its_version() -> None:
    with pytest.raises(NotAppendOnlyError) as caught:
        appended_files("s3://lake/events", _commit(7, "b2", operation="DELETE", removed=1))
    message = str(caught.value)
    assert caught.value.version == 7
    assert "'s3://lake/events'" in message and "version 7 (DELETE)" in message
    assert "skipChangeCommits: true" in message and "startingVersion: 8" in message


def test_deletion_vectors_are_refused_naming_the_version() -> None:
    # A DELETE with deletion vectors removes and re-adds the same file: no file disappears.
    commit = _commit(12, "a", operation="DELETE", removed=1, deletion_vectors=1)
    with pytest.raises(DeletionVectorError) as caught:
        appended_files("s3://lake/events", commit)
    message = str(caught.value)
    assert caught.value.version == 12
    assert "'s3://lake/events' version 12 (DELETE)" in message and "deletion vectors" in message
    assert "delta.enableDeletionVectors=false" in message
    assert "skipChangeCommits: true" in message and "startingVersion: 13" in message
    # Even without a removal (an engine adding a file with a vector): never read it whole.
    with pytest.raises(DeletionVectorError):
        appended_files("/t", _commit(3, "a", operation="CLONE", deletion_vectors=1))
    assert appended_files("/t", commit, skip_change_commits=True) == []


def test_optimize_and_skipped_change_commits_yield_nothing() -> None:
    assert appended_files("/t", _commit(4, "ab", operation="OPTIMIZE", removed=2)) == []
    merge = _commit(4, "ab", operation="MERGE", removed=2)
    assert appended_files("/t", merge, skip_change_commits=True) == []


@pytest.mark.parametrize(
    ("start", "cap", "max_files", "end"),
    [
        (-1, 5, None, 5),  # no limit: everything
        (3, 3, 2, 3),  # nothing new
        (-1, 5, 3, 1),  # 2 + 2 files reach 3 at version 1
        (-1, 5, 1, 0),  # whole commits: version 0 alone has 2 files
        (1, 5, 100, 5),  # fewer files than the limit
        (2, 5, 1, 4),  # version 3 appended nothing (OPTIMIZE): go on to 4
    ],
)
def test_admission_takes_whole_commits(
    start: int, cap: int, max_files: int | None, end: int
) -> None:
    counts = {0: 2, 1: 2, 2: 1, 3: 0, 4: 1, 5: 3}
    walked = ((v, counts[v]) for v in range(start + 1, cap + 1))
    assert admit(start, cap, max_files, walked) == end


def test_files_group_into_tasks_by_size_in_order() -> None:
    files = [DataFile(f"/t/{i}", size) for i, size in enumerate([60, 50, 10, 200, 5])]
    groups = group_files(files, target_bytes=100)
    assert [[f.uri for f in g] for g in groups] == [["/t/0"], ["/t/1", "/t/2"], ["/t/3"], ["/t/4"]]


def test_rows_conform_to_the_table_schema() -> None:
    schema = pa.schema(
        [
            ("key", pa.string()),
            ("value", pa.int64()),
            ("day", pa.date32()),
            ("added_later", pa.float64()),
        ]
    )
    batch = pa.RecordBatch.from_pydict({"value": pa.array([1, 2], pa.int32())})
    conformed = conform(batch, schema, {"key": "a b", "day": "2024-05-01"})
    assert conformed.schema.equals(schema)
    assert conformed.to_pydict()["key"] == ["a b", "a b"]
    assert conformed.column("day").to_pylist()[0].isoformat() == "2024-05-01"
    assert conformed.to_pydict()["added_later"] == [None, None]
    null_partition = conform(batch, schema, {"key": None})
    assert null_partition.to_pydict()["key"] == [None, None]


def test_s3_settings_travel_as_options_and_readers_pickle() -> None:
    settings = S3Settings("http://127.0.0.1:8333", "eu-1", "ak", "sk", allow_http=True)
    options = location_options(Location("s3://lake/events", settings))
    assert set(options) == {
        "table",
        "s3.endpoint",
        "s3.region",
        "s3.allowHttp",
        "s3.accessKey",
        "s3.secretKey",
    }
    config = DeltaConfig.from_options(
        {**options, "startingVersion": "4", "maxFilesPerTrigger": "2"}
    )
    assert config.location == Location("s3://lake/events", settings)
    reader = pickle.loads(pickle.dumps(DeltaStreamReader(config, schema=None)))  # type: ignore[arg-type]
    assert reader.initialOffset() == {"version": 3}
    assert reader.getDefaultReadLimit() == ReadMaxFiles(2)
    assert DeltaConfig.from_options({"table": "/t"}).location == Location("/t")


def test_delta_options_are_checked() -> None:
    with pytest.raises(SpecError, match="maxFilePerTrigger"):
        DeltaConfig.from_options({"table": "/t", "maxFilePerTrigger": "2"})
    with pytest.raises(SpecError, match="skipChangeCommits='yes'"):
        DeltaConfig.from_options({"table": "/t", "skipChangeCommits": "yes"})


def test_partition_values_in_their_log_form_conform() -> None:
    schema = pa.schema(
        [
            ("at", pa.timestamp("us", tz="UTC")),
            ("local", pa.timestamp("us")),
            ("n", pa.int32()),
            ("ok", pa.bool_()),
            ("day", pa.date32()),
            ("x", pa.float64()),
        ]
    )
    batch = pa.RecordBatch.from_pydict({"x": [1.5]})
    values = {
        "at": "2024-05-01 12:30:01.123456",  # UTC, no offset: how delta-rs writes it
        "local": "2024-05-01 12:30:01",
        "n": "7",
        "ok": "true",
        "day": "2024-05-01",
    }
    row = conform(batch, schema, values).to_pylist()[0]
    assert row["at"].isoformat() == "2024-05-01T12:30:01.123456+00:00"
    assert row["local"].isoformat() == "2024-05-01T12:30:01"
    assert (row["n"], row["ok"], row["day"].isoformat()) == (7, True, "2024-05-01")
    iso = conform(batch, schema, {"at": "2024-05-01T12:30:01.5Z"}).to_pylist()[0]["at"]
    assert iso.isoformat() == "2024-05-01T12:30:01.500000+00:00"


# -- planning over a real table (delta-rs writes it; no Spark) ---------------------------


@pytest.fixture
def events(tmp_path: Path) -> Path:
    """A local table with three append commits (versions 0..2) of 1, 2 and 1 files."""
    from deltalake import write_deltalake

    path = tmp_path / "events"
    for keys in (["a"], ["b", "c"], ["d"]):
        data = pa.table({"key": keys, "value": list(range(len(keys)))})
        write_deltalake(str(path), data, mode="append", partition_by=["key"])
    return path


def _reader(path: Path, **options: str) -> DeltaStreamReader:
    return DeltaStreamReader(DeltaConfig.from_options({"table": str(path), **options}), None)  # type: ignore[arg-type]


def test_planning_reads_each_commit_once_and_never_the_whole_file_list(
    events: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deltalake import DeltaTable

    from streamkeeper.sources import delta

    reads: list[int] = []
    read_commit = delta.read_commit

    def counted(location: Location, version: int) -> Commit:
        reads.append(version)
        return read_commit(location, version)

    def full_file_list(*_: object, **__: object) -> None:
        raise AssertionError("the table's whole file list was built for a batch")

    monkeypatch.setattr(delta, "read_commit", counted)
    monkeypatch.setattr(DeltaTable, "get_add_actions", full_file_list)
    monkeypatch.setattr(DeltaTable, "file_uris", full_file_list)
    reader = _reader(events)
    limit = ReadMaxFiles(2)
    end = reader.latestOffset(version_offset(-1), limit)
    assert end == {"version": 1}  # 1 + 2 files reach the limit at version 1
    parts = reader.partitions(version_offset(-1), end)
    assert sorted(f.uri.rsplit("/", 2)[1] for p in parts for f in p.files) == [
        "key=a",
        "key=b",
        "key=c",
    ]
    # Planned back from the latest version (a later RESTORE may retract what lies before
    # it), reused by partitions and by the next batch: each commit read once.
    assert sorted(reads) == [0, 1, 2]
    reader.commit(end)
    assert reader.latestOffset(end, limit) == {"version": 2}
    assert reader.latestOffset(end, limit) == {"version": 2}  # nothing read again
    assert sorted(reads) == [0, 1, 2]
    copy = pickle.loads(pickle.dumps(reader))  # after use: holds a DeltaTable
    assert copy.config == reader.config and copy._table is None


def test_planning_refuses_a_deletion_vector_commit(events: Path) -> None:
    from tests.support.deletion_vectors import delete_rows_with_deletion_vector

    dv_version = delete_rows_with_deletion_vector(events, 1, [0])
    reader = _reader(events)
    assert reader.latestOffset(version_offset(-1), ReadAllAvailable()) == {"version": 3}
    with pytest.raises(DeletionVectorError, match=f"version {dv_version} \\(DELETE\\)"):
        reader.partitions(version_offset(-1), {"version": 3})
    skipping = _reader(events, skipChangeCommits="true")
    parts = skipping.partitions(version_offset(-1), {"version": 3})
    assert len([f for p in parts for f in p.files]) == 4  # the versions 0..2 appends only


def test_a_cleaned_up_commit_names_the_version_and_the_fix(events: Path) -> None:
    (events / "_delta_log" / f"{1:020d}.json").unlink()
    with pytest.raises(SourceError, match="cannot read version 1 .*startingVersion"):
        _reader(events).partitions(version_offset(0), {"version": 2})
