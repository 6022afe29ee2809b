"""The stable (read-committed) view (`streamkeeper.stable`) over real Delta tables.

A producer lineage writes with the real commit path (`tests/support/producer.py`), an
upgrade moves its real record, and a rollback is the real `restore_tables`. Every check
compares what a reader gets with a reference built from the rows each side produced,
never with the lineage's own markers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from streamkeeper.errors import SpecError, UnknownJobError
from streamkeeper.reader import read_table_rows
from streamkeeper.stable import StableView, read_stable, stable_point
from streamkeeper.storage import LocalStore
from tests.support.producer import Producer, Row


def blue(values: range) -> list[Row]:
    return [(f"k{v % 3}", v, "blue") for v in values]


def green(values: range) -> list[Row]:
    return [(f"k{v % 3}", v * 10, "green") for v in values]  # green computes differently


def rows(found: list[dict]) -> list[Row]:
    return sorted((r["key"], r["value"], r["version"]) for r in found)


@pytest.fixture
def producer(tmp_path: Path) -> Producer:
    """Blue has committed inputs 0..5 in three batches."""
    producer = Producer(tmp_path / "data")
    producer.start()
    for first in range(0, 6, 2):
        producer.commit(blue(range(first, first + 2)))
    return producer


def stable(producer: Producer) -> list[Row]:
    return rows(read_stable(producer.location.uri, producer.job, producer.sink))


def latest(producer: Producer) -> list[Row]:
    return rows(read_table_rows(producer.table))


def test_without_an_upgrade_the_stable_view_is_the_head(producer: Producer) -> None:
    point = stable_point(producer.location.uri, producer.job)
    assert point is not None and point.reason == "head"
    assert stable(producer) == sorted(blue(range(6))) == latest(producer)


def test_green_on_probation_is_never_in_the_stable_view_and_a_rollback_keeps_it_so(
    producer: Producer,
) -> None:
    record, s1 = producer.hand_over()
    producer.start()  # green goes live
    producer.commit(green(range(6, 8)))
    producer.commit(green(range(8, 10)))
    assert latest(producer) == sorted(blue(range(6)) + green(range(6, 10)))  # batch: green's
    assert stable(producer) == sorted(blue(range(6)))
    point = stable_point(producer.location.uri, producer.job)
    assert point is not None and point.seq == s1.seq
    assert f"upgrade {record.id} is live" in point.reason

    producer.roll_back(record, s1)  # the real fence and RESTORE; phase rolling_back
    assert latest(producer) == stable(producer) == sorted(blue(range(6)))
    producer.restart_from(s1)  # blue again; no batch committed yet
    assert stable(producer) == sorted(blue(range(6)))
    producer.commit(blue(range(6, 8)))
    producer.finish(record, "rolled_back")
    producer.commit(blue(range(8, 10)))
    assert stable(producer) == sorted(blue(range(10))) == latest(producer)
    # Time travel still finds green's output: the RESTORE keeps the table's history.
    green_version = s1.tables[producer.sink].version + 3  # green's fence and two batches
    found = rows(read_table_rows(producer.table, version=green_version))
    assert found == sorted(blue(range(6)) + green(range(6, 10)))


def test_a_promoted_green_is_stable(producer: Producer) -> None:
    record, _ = producer.hand_over()
    producer.start()
    producer.commit(green(range(6, 8)))
    assert stable(producer) == sorted(blue(range(6)))
    producer.finish(record, "promoted")
    assert stable(producer) == sorted(blue(range(6)) + green(range(6, 8)))


def test_an_on_demand_rollback_holds_the_view_at_its_savepoint_until_the_restart_commits(
    producer: Producer,
) -> None:
    from streamkeeper.client import StreamkeeperClient
    from streamkeeper.upgrade.rollback import restore_tables

    savepoint = producer.savepoint()
    producer.commit(blue(range(6, 8)))
    producer.commit(blue(range(8, 10)))  # to be retracted on purpose
    restore_tables(StreamkeeperClient(producer.location.uri), producer.job, savepoint)
    point = stable_point(producer.location.uri, producer.job)
    assert point is not None and point.seq == savepoint.seq
    assert f"rollback to savepoint {savepoint.id} pending" in point.reason
    producer.restart_from(savepoint)  # rewind-pending cleared
    point = stable_point(producer.location.uri, producer.job)
    # The head is the rollback's own marker: the restored versions, naming the savepoint.
    assert point is not None and point.marker["rewound_to"]["seq"] == savepoint.seq, point
    assert stable(producer) == sorted(blue(range(6)))
    producer.commit(blue(range(6, 8)))  # what the restart processes again
    assert stable(producer) == sorted(blue(range(8))) == latest(producer)


def test_finding_the_stable_point_reads_little_of_a_long_lived_lineage(
    producer: Producer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for value in range(6, 60):
        producer.commit(blue(range(value, value + 1)))
        if value % 20 == 0:  # earlier upgrades, promoted
            producer.finish(producer.hand_over()[0], "promoted")
    record, s1 = producer.hand_over()
    producer.start()
    for value in range(60, 70):
        producer.commit(green(range(value, value + 1)))
    view = StableView(producer.location.uri, producer.job)
    view.point()
    reads: list[str] = []
    listings: list[tuple[str, str | None]] = []
    read_json, listing = LocalStore.read_json, LocalStore.list

    def counted_read(store: LocalStore, key: str):  # noqa: ANN202
        reads.append(key)
        return read_json(store, key)

    def counted_list(store: LocalStore, prefix: str, start_after: str | None = None):  # noqa: ANN202
        listings.append((prefix, start_after))
        return listing(store, prefix, start_after)

    monkeypatch.setattr(LocalStore, "read_json", counted_read)
    monkeypatch.setattr(LocalStore, "list", counted_list)
    point = view.point()
    assert point is not None and point.seq == s1.seq
    markers_read = [k for k in reads if "/markers/" in k]
    assert len(markers_read) <= 3, markers_read  # the head and S1's, not 60
    assert all(after is not None for prefix, after in listings if prefix.endswith("markers"))
    upgrades_read = [k for k in reads if "/upgrades/" in k]
    assert upgrades_read == [f"jobs/orders/upgrades/{record.id}.json"]  # finished: remembered
    assert record.id in point.reason


def test_unknown_jobs_and_sinks_are_named(producer: Producer) -> None:
    with pytest.raises(UnknownJobError, match="no job 'nope'.*jobs there: orders"):
        stable_point(producer.location.uri, "nope")
    with pytest.raises(SpecError, match="job 'orders' has no sink 'totals'; its sinks: events"):
        read_stable(producer.location.uri, producer.job, "totals")
    with pytest.raises(SpecError, match="is not one of job 'orders'.*events: "):
        StableView(producer.location.uri, producer.job).sink_of("/elsewhere/table")
