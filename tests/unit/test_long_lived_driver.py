"""A driver runs for months: what it keeps per batch in memory stays bounded.

Each structure below used to grow by an entry per batch for the driver's whole life
(the soak's Python RSS crept up by tens of MiB an hour); each now holds a window.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from streamkeeper.commit import coordinator as coordinator_module
from streamkeeper.commit.coordinator import CommitCoordinator
from streamkeeper.commit.maintenance import ProtectedVersions
from streamkeeper.commit.wal import Manifest, WriteAheadLog
from streamkeeper.lineage.control import ControlPlane, Fence
from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.observability.history import CheckpointHistory
from streamkeeper.observability.progress import RunProgress
from streamkeeper.storage import LocalStore, Location
from tests.unit.test_history_upkeep import _Progress, _Query, _supervisor


def _coordinator(tmp_path: Path) -> CommitCoordinator:
    store = LocalStore(tmp_path)
    layout = LineageLayout(Location(str(tmp_path)), "lin", "job")
    control = ControlPlane(store, layout)
    return CommitCoordinator(
        store=store,
        layout=layout,
        wal=WriteAheadLog(store, layout),
        targets={},
        fence=Fence(control, control.acquire()),
    )


def _manifest(batch: int) -> Manifest:
    return Manifest("lin", batch + 100, "query", batch, "ckpt", 1, sinks={})


def test_the_coordinator_keeps_the_facts_and_delays_of_the_newest_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(coordinator_module, "FACTS_KEPT", 10)
    monkeypatch.setattr(coordinator_module, "DELAYS_KEPT", 20)
    coordinator = _coordinator(tmp_path)
    for batch in range(30):
        coordinator.commit_manifest(_manifest(batch), batch_end=0.0)

    assert [b for b in range(30) if coordinator.checkpoint_facts(b)] == list(range(20, 30))
    assert coordinator.checkpoint_facts(29)["commit_seq"] == 129
    assert len(coordinator.stats.visibility_delays_ms) == 20
    assert coordinator.stats.committed == 30  # counted, all of them


def test_the_supervisor_remembers_only_the_batches_spark_still_reports(tmp_path: Path) -> None:
    history = CheckpointHistory(Location(str(tmp_path)).child("history"))
    query = _Query()
    supervisor = _supervisor(history, query, kept=None, every=100)
    for batch in range(12):
        query.recentProgress = [_Progress(b) for b in range(max(0, batch - 3), batch + 1)]
        supervisor._flush_history()

    assert supervisor._recorded == {8, 9, 10, 11}  # Spark's window, not the driver's life
    assert sorted(r["batch_id"] for r in history.read()) == list(range(12))  # each once


def test_the_progress_display_counts_each_report_once_and_forgets_old_ones() -> None:
    progress = RunProgress()
    for batch in range(12):
        window = range(max(0, batch - 3), batch + 1)
        progress.query([{"batchId": b, "runId": "r", "numInputRows": 10} for b in window], 0)
        progress.query([], 0)  # no new report

    assert (progress.batches, progress.rows) == (12, 120)
    assert progress._seen == {("r", b) for b in range(8, 12)}


def test_protected_versions_keep_the_markers_of_the_seqs_protected_now(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    layout = LineageLayout(Location(str(tmp_path)), "lin", "job")
    for seq in range(20):
        store.write_json(layout.marker(seq), {"seq": seq, "versions": {"t": seq * 2}})
    protected = {"seqs": [0, 5]}
    versions = ProtectedVersions(store, layout, lambda: protected["seqs"])
    for head in range(5, 20):  # the head moves every batch; savepoint 0 stays
        protected["seqs"] = [0, 5, head]
        assert versions.floors() == {"t": 0}

    assert set(versions._versions) == {0, 5, 19}


def test_the_committer_looks_often_only_while_a_batch_has_just_ended(tmp_path: Path) -> None:
    """A submitted manifest's `commits/N` is due within ms: looked for every 2 ms for a
    second, then at the slow pace (a query that failed leaves its manifest queued)."""
    coordinator = _coordinator(tmp_path)
    assert coordinator._poll_wait() == coordinator_module.POLL_SECONDS  # nothing queued

    coordinator.submit(_manifest(0))
    assert coordinator._poll_wait() == coordinator_module.FAST_POLL_SECONDS

    coordinator._head_since -= coordinator_module.FAST_POLL_WINDOW + 0.1  # a second later
    assert coordinator._poll_wait() == coordinator_module.POLL_SECONDS
