"""The Delta source across a RESTORE (sources/delta_log.py, the planner in sources/delta.py).

The walk is checked on commits made up here; the planner on real tables that a producer
lineage wrote with the real commit path and the real rollback (`restore_tables`), its
batches read by the source's own `read` (no Spark session: the Spark path is in
tests/integration/test_downstream_readers.py). Rows read are compared with the rows each
side produced.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxFiles

from streamkeeper.errors import SpecError
from streamkeeper.sources.delta import (
    DeltaConfig,
    DeltaStreamReader,
    NotAppendOnlyError,
    RestoredBelowReadError,
    table_schema,
    version_offset,
)
from streamkeeper.sources.delta_log import (
    Commit,
    DataFile,
    files_read_before,
    parse_commit,
    visible_commits,
)
from streamkeeper.storage import Location
from tests.support.producer import Producer, Row

# -- the walk --------------------------------------------------------------------------


def _log(*commits: Commit) -> dict[int, Commit]:
    return {c.version: c for c in commits}


def _append(version: int) -> Commit:
    return Commit(version, "WRITE", (DataFile(f"/t/{version}.parquet", 1),))


def _restore(version: int, target: int | None) -> Commit:
    return Commit(version, "RESTORE", removed=2, restored_to=target)


def test_a_restore_parsed_from_its_commit_file_names_its_target() -> None:
    info = '{"commitInfo":{"operation":"RESTORE","operationParameters":{"version":"4"}}}'
    removal = '{"remove":{"path":"a.parquet","dataChange":true}}'
    assert parse_commit("/t", 9, [info, removal]).restored_to == 4
    by_time = '{"commitInfo":{"operation":"RESTORE","operationParameters":{"datetime":1}}}'
    assert parse_commit("/t", 9, [by_time]).restored_to is None


def test_the_walk_skips_what_a_restore_retracted() -> None:
    log = _log(*(_append(v) for v in range(4)), _restore(4, 1), _append(5))
    assert [c.version for c in visible_commits(-1, 5, log.__getitem__)] == [0, 1, 4, 5]
    # From any version it returns, the walk is the same below it: a batch may end there.
    assert [c.version for c in visible_commits(-1, 4, log.__getitem__)] == [0, 1, 4]
    # A restore of a restore: the table at 7 is the table at 4, which is the table at 1.
    log |= _log(_append(6), _restore(7, 4))
    assert [c.version for c in visible_commits(0, 7, log.__getitem__)] == [1, 4, 7]


def test_a_restore_below_the_start_is_reported_and_ends_the_walk() -> None:
    log = _log(*(_append(v) for v in range(4)), _restore(4, 1), _append(5), _restore(6, None))
    below: list[int] = []
    visited = visible_commits(2, 5, log.__getitem__, lambda c: below.append(c.version))
    assert ([c.version for c in visited], below) == ([4, 5], [4])
    visited = visible_commits(5, 6, log.__getitem__, lambda c: below.append(c.version))
    assert ([c.version for c in visited], below) == ([6], [4, 6])  # target unknown


def test_only_versions_read_that_appended_rows_count_as_read() -> None:
    fence = Commit(3, "WRITE")  # an empty commit: a runner's epoch
    log = _log(*(_append(v) for v in range(3)), fence, _append(4), _restore(5, 2))
    restore = log[5]
    assert files_read_before("/t", restore, 3, 0, log.__getitem__) == (3, [])
    first, read = files_read_before("/t", restore, 4, 0, log.__getitem__)
    assert (first, [f.uri for f in read]) == (3, ["/t/4.parquet"])
    # A stream that began after the retracted versions read none of them.
    assert files_read_before("/t", restore, 4, 5, log.__getitem__) == (5, [])


# -- the planner over a real table -----------------------------------------------------


def blue(values: range) -> list[Row]:
    return [(f"k{v % 3}", v, "blue") for v in values]


def green(values: range) -> list[Row]:
    return [(f"k{v % 3}", v * 10, "green") for v in values]


@pytest.fixture
def producer(tmp_path: Path) -> Producer:
    producer = Producer(tmp_path / "data")
    producer.start()
    for first in range(0, 6, 2):
        producer.commit(blue(range(first, first + 2)))
    return producer


class Stream:
    """The source's planner and reader driven as Spark drives them, batch by batch."""

    def __init__(self, producer: Producer, **options: str) -> None:
        location = Location(producer.table)
        config = DeltaConfig.from_options({"table": producer.table, **options})
        self.reader = DeltaStreamReader(config, table_schema(location))
        self.offset = self.reader.initialOffset()
        self.rows: list[Row] = []
        self.batches = 0

    def run(self, limit: ReadLimit | None = None) -> list[Row]:
        """Every batch there is now; returns the rows they read."""
        limit = limit or self.reader.getDefaultReadLimit()
        before = len(self.rows)
        while (end := self.reader.latestOffset(self.offset, limit)) != self.offset:
            for partition in self.reader.partitions(self.offset, end):
                for batch in self.reader.read(partition):
                    self.rows += [(r["key"], r["value"], r["version"]) for r in batch.to_pylist()]
            self.reader.commit(end)
            self.offset, self.batches = end, self.batches + 1
        return sorted(self.rows[before:])


def probation_then_rollback(producer: Producer) -> None:
    """Green commits inputs 6..9 on probation; the real rollback restores S1."""
    record, s1 = producer.hand_over()
    producer.start()
    producer.commit(green(range(6, 8)))
    producer.commit(green(range(8, 10)))
    producer.roll_back(record, s1)


def test_a_stream_behind_the_rollback_never_reads_green_even_one_commit_at_a_time(
    producer: Producer,
) -> None:
    stream = Stream(producer, maxFilesPerTrigger="1")
    assert stream.run() == sorted(blue(range(6)))
    probation_then_rollback(producer)
    producer.restart_from(producer.savepoint())
    producer.commit(blue(range(6, 8)))
    producer.commit(blue(range(8, 10)))
    assert stream.run() == sorted(blue(range(6, 10)))  # green's two commits never read
    assert sorted(stream.rows) == sorted(blue(range(10)))
    fresh = Stream(producer, maxFilesPerTrigger="1")  # from version 0, after it all
    assert fresh.run() == sorted(blue(range(10)))


def test_a_stream_that_read_green_stops_naming_the_restore_and_the_fix(
    producer: Producer,
) -> None:
    streams = {
        "default": Stream(producer),
        "skipping": Stream(producer, skipChangeCommits="true"),  # a RESTORE is never skipped
        "accepting": Stream(producer, acceptRestores="true"),
    }
    record, s1 = producer.hand_over()
    producer.start()
    producer.commit(green(range(6, 8)))
    for stream in streams.values():
        assert stream.run() == sorted(blue(range(6)) + green(range(6, 8)))
    restored_at = producer.roll_back(record, s1)["tables"]["events"]["now"]
    producer.restart_from(s1)
    producer.commit(blue(range(6, 8)))
    target = s1.tables["events"].version
    for name in ("default", "skipping"):
        with pytest.raises(RestoredBelowReadError) as caught:
            streams[name].run()
        message = str(caught.value)
        assert repr(producer.table) in message
        assert f"restored at version {restored_at} to version {target}" in message
        read_to = streams[name].offset["version"]  # green's batch, the last version it read
        assert f"versions {target + 1}..{read_to} appended" in message
        assert "Roll this job back too" in message and "acceptRestores: true" in message
        assert (caught.value.version, caught.value.target) == (restored_at, target)
    # Accepted: what it read stays read; the restarted blue's output comes on top.
    assert streams["accepting"].run() == sorted(blue(range(6, 8)))


def test_a_change_commit_the_table_still_holds_stops_the_stream_as_before(
    producer: Producer,
) -> None:
    from deltalake import DeltaTable

    DeltaTable(producer.table).delete("value = 1")
    with pytest.raises(NotAppendOnlyError, match=r"\(DELETE\)"):
        Stream(producer).run(ReadAllAvailable())


def test_a_stream_that_follows_the_stable_point_holds_at_s1(producer: Producer) -> None:
    stream = Stream(producer, stablePointOf=producer.job, stablePointRoot=producer.location.uri)
    record, s1 = producer.hand_over()
    producer.start()
    producer.commit(green(range(6, 8)))
    assert stream.run(ReadMaxFiles(1)) == sorted(blue(range(6)))
    assert stream.reader.latestOffset(stream.offset, ReadAllAvailable()) == version_offset(
        s1.tables[producer.sink].version
    )
    producer.finish(record, "promoted")
    assert stream.run() == sorted(green(range(6, 8)))


def test_stable_point_options_are_checked() -> None:
    with pytest.raises(SpecError, match="stablePointOf and stablePointRoot go together"):
        DeltaConfig.from_options({"table": "/t", "stablePointOf": "orders"})
    with pytest.raises(SpecError, match="stablePointOf='../x' is not a job name"):
        DeltaConfig.from_options({"table": "/t", "stablePointOf": "../x", "stablePointRoot": "/r"})
    with pytest.raises(SpecError, match="acceptRestores='yes' must be true or false"):
        DeltaConfig.from_options({"table": "/t", "acceptRestores": "yes"})
