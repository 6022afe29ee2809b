"""A job's tables as Assets: the commit watcher's trigger and the assets it watches for.

The trigger runs against a control plane written by hand (no Spark); the scheduler test
(test_scheduler_runs.py) runs it in a real triggerer with a real job and a downstream
DAG scheduled on the table.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.serde import deserialize, serialize
from airflow.triggers.base import TriggerEvent

from streamkeeper_airflow.assets import asset_uri, committed_version, job_table_assets
from streamkeeper_airflow.triggers.commits import CommittedOutputTrigger
from tests.unit.test_client import JOB, write_control_plane

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def plane(conn_env: Any, local_root: Path) -> Path:
    conn_env("sk_commits", str(local_root))
    return local_root


class _Observed(CommittedOutputTrigger):
    """The trigger, telling the test when its first poll (its baseline) is done."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.first_poll = threading.Event()
        self.polls = 0
        self.errors: list[Exception] = []

    def _poll(self, hook: Any) -> Any:
        try:
            return super()._poll(hook)
        except Exception as error:
            self.errors.append(error)
            raise
        finally:
            self.polls += 1
            self.first_poll.set()


def _trigger() -> _Observed:
    return _Observed(conn_id="sk_commits", job=JOB, poll_interval=0.05)


async def _after_baseline(trigger: _Observed, then: Any) -> TriggerEvent:
    """The first event once the trigger took its baseline and `then()` changed storage."""
    events = trigger.run()
    first = asyncio.ensure_future(anext(events))
    assert await asyncio.to_thread(trigger.first_poll.wait, 30), "the trigger never polled"
    assert not first.done(), first.result()  # nothing fires for what was there before
    then()
    try:
        return await asyncio.wait_for(first, timeout=30)
    finally:
        await events.aclose()


def test_the_watcher_survives_the_triggerers_round_trip() -> None:
    trigger = CommittedOutputTrigger(conn_id="c", job=JOB, root="/r", poll_interval=3)
    classpath, kwargs = trigger.serialize()
    assert classpath == "streamkeeper_airflow.triggers.commits.CommittedOutputTrigger"
    rebuilt = CommittedOutputTrigger(**deserialize(serialize(kwargs)))
    assert rebuilt.serialize() == (classpath, kwargs)


def test_a_poll_interval_that_is_not_positive_is_refused() -> None:
    with pytest.raises(ValueError, match="poll_interval 0 is not positive"):
        CommittedOutputTrigger(conn_id="c", job=JOB, poll_interval=0)


def test_a_commit_after_the_baseline_is_one_event_with_its_versions(plane: Path) -> None:
    write_control_plane(plane, seqs=range(3))
    event = asyncio.run(
        _after_baseline(_trigger(), lambda: write_control_plane(plane, seqs=range(5)))
    )
    payload = event.payload
    assert (payload["job"], payload["seq"], payload["batch_id"]) == (JOB, 4, 4)
    assert payload["versions"] == {"totals": 6} and payload["rewound"] is False
    assert payload["tables"] == {"totals": f"{plane}/tables/totals"}
    assert committed_version({"payload": payload}, "totals") == 6


def test_a_job_that_never_ran_fires_on_its_first_commit(plane: Path) -> None:
    event = asyncio.run(
        _after_baseline(_trigger(), lambda: write_control_plane(plane, seqs=range(1)))
    )
    assert (event.payload["seq"], event.payload["versions"]) == (0, {"totals": 2})


def test_failed_polls_do_not_end_the_watch(conn_env: Any, local_root: Path) -> None:
    """An asset watcher never gives up: a poll that raises is logged and retried, and the
    commit after storage came back is an event."""
    conn_env("sk_commits", str(local_root))
    write_control_plane(local_root, seqs=range(2))
    record = local_root / "jobs" / JOB / "job.json"
    good = record.read_text()
    record.write_text("{not json")  # the job's record unreadable: every poll fails

    async def fails_then_fires() -> TriggerEvent:
        trigger = _trigger()
        events = trigger.run()
        first = asyncio.ensure_future(anext(events))
        while len(trigger.errors) < 3:
            assert not first.done(), first
            await asyncio.sleep(0.02)
        record.write_text(good)
        polls = trigger.polls
        while trigger.polls < polls + 2:  # a good poll took the baseline
            await asyncio.sleep(0.02)
        write_control_plane(local_root, seqs=range(4))
        try:
            return await asyncio.wait_for(first, timeout=30)
        finally:
            await events.aclose()

    event = asyncio.run(asyncio.wait_for(fails_then_fires(), timeout=60))
    assert event.payload["seq"] == 3


def test_an_event_names_no_version_of_a_sink_it_does_not_hold() -> None:
    with pytest.raises(KeyError, match="no version of sink 'changes'"):
        committed_version({"payload": {"versions": {"totals": 3}}}, "changes")


def test_each_sink_table_is_an_asset_watched_by_one_trigger(
    conn_env: Any, local_root: Path
) -> None:
    conn_env("sk_commits", str(local_root))
    assets = job_table_assets("keyed-totals", conn_id="sk_commits", jobs_folder=REPO / "jobs")
    assert sorted(assets) == ["changes", "totals"]
    totals = assets["totals"]
    assert totals.name == "keyed-totals.totals"
    assert totals.uri == (local_root / "tables" / "totals").as_uri()
    triggers = {id(a.watchers[0].trigger) for a in assets.values()}
    assert len(triggers) == 1  # one poll per job, every table's events from it
    assert asset_uri("s3://bucket/p/tables/t") == "s3://bucket/p/tables/t"


def test_an_unknown_job_names_the_jobs_there(conn_env: Any, local_root: Path) -> None:
    conn_env("sk_commits", str(local_root))
    with pytest.raises(ValueError, match=r"job 'nope' has no valid spec .*keyed-totals"):
        job_table_assets("nope", conn_id="sk_commits", jobs_folder=REPO / "jobs")


def test_green_on_probation_fires_nothing_until_it_is_promoted(
    conn_env: Any, tmp_path: Path
) -> None:
    """Asset events follow the stable point: what green commits on probation can still be
    retracted by a rollback, so no downstream DAG is scheduled on it before promotion."""
    from tests.support.producer import Producer

    producer = Producer(tmp_path / "data")
    producer.start()
    for first in range(0, 6, 2):
        producer.commit([(f"k{v % 3}", v, "blue") for v in range(first, first + 2)])
    conn_env("sk_commits", str(tmp_path / "data"))
    trigger = _Observed(conn_id="sk_commits", job=producer.job, poll_interval=0.05)

    async def probation_then_promotion() -> TriggerEvent:
        events = trigger.run()
        first = asyncio.ensure_future(anext(events))
        assert await asyncio.to_thread(trigger.first_poll.wait, 30)
        record, _ = producer.hand_over()
        producer.start()  # green goes live
        producer.commit([(f"k{v % 3}", v * 10, "green") for v in range(6, 8)])
        polls = trigger.polls
        while trigger.polls < polls + 3:
            await asyncio.sleep(0.02)
        assert not first.done(), first.result()  # provisional: no event
        producer.finish(record, "promoted")
        try:
            return await asyncio.wait_for(first, timeout=30)
        finally:
            await events.aclose()

    event = asyncio.run(asyncio.wait_for(probation_then_promotion(), timeout=90))
    assert event.payload["seq"] == producer.seq  # green's commit, now stable
    assert event.payload["reason"] == "head"
    from deltalake import DeltaTable

    latest = DeltaTable(producer.table).version()
    assert event.payload["versions"] == {producer.sink: latest}
