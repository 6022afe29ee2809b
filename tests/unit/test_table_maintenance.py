"""Table maintenance on real Delta tables (delta-rs, local directory, no Spark)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from deltalake import DeltaTable

from streamkeeper.commit.maintenance import (
    MaintenancePolicy,
    ProtectedVersions,
    TableMaintenance,
    expire_log,
    lineage_protected_seqs,
    log_version,
)
from streamkeeper.commit.tables import TableCommitter, TableTarget, ensure_table
from streamkeeper.errors import FencedError
from streamkeeper.lineage.layout import LineageLayout, seq_of
from streamkeeper.snapshots.index import CheckpointIndex, IndexEntry
from streamkeeper.snapshots.savepoints import Registry, SavepointEntry
from streamkeeper.storage import Location
from tests.unit.test_delta_commit import SCHEMA, append_part, contents


def grow(target: TableTarget, commits: int) -> TableCommitter:
    """`commits` appends of one row each (key k{n}); the table is at version `commits`."""
    committer = TableCommitter(target, epoch=1)
    for n in range(commits):
        committer.commit(append_part(target, f"f{n}.parquet", {"key": [f"k{n}"], "total": [n]}), n)
    return committer


def log_versions(target: TableTarget) -> list[int]:
    folder = Path(target.location.uri) / "_delta_log"
    return sorted({v for p in folder.iterdir() if (v := log_version(p.name)) is not None})


def checkpoints(target: TableTarget) -> list[int]:
    folder = Path(target.location.uri) / "_delta_log"
    return sorted(log_version(p.name) for p in folder.glob("*.checkpoint.parquet"))


def rows_at(target: TableTarget, version: int) -> int:
    return DeltaTable(target.location.uri, version=version).to_pyarrow_table().num_rows


@pytest.fixture(scope="module")
def aged_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A table at version 250, grown once per module (each test gets a copy)."""
    location = Location(str(tmp_path_factory.mktemp("aged") / "table"))
    template = TableTarget("totals", location, "data:lin:totals", "fence:lin")
    ensure_table(template, SCHEMA)
    grow(template, 250)
    return Path(location.uri)


@pytest.fixture
def aged(aged_template: Path, tmp_path: Path) -> TableTarget:
    copy = shutil.copytree(aged_template, tmp_path / "table")
    return TableTarget("totals", Location(str(copy)), "data:lin:totals", "fence:lin")


def test_expiry_cuts_at_the_newest_checkpoint_below_the_floor(aged: TableTarget) -> None:
    assert DeltaTable(aged.location.uri).version() == 250
    assert checkpoints(aged) == [99, 199]  # delta-rs checkpoints every 100 commits
    cut, deleted = expire_log(aged, floor=230, history_retention=0)

    assert cut == 199
    assert deleted == 199 + 1  # commits 0..198 and the checkpoint of 99
    assert min(log_versions(aged)) == 199
    assert len(contents(aged)) == 250  # the latest version is whole
    assert rows_at(aged, 230) == 230  # the floor is still readable (time travel, RESTORE)
    assert rows_at(aged, 199) == 199
    with pytest.raises(Exception, match="(?i)no files in log segment|not found"):
        rows_at(aged, 150)


def test_nothing_is_expired_while_history_is_younger_than_its_retention(
    aged: TableTarget,
) -> None:
    before = log_versions(aged)
    assert expire_log(aged, floor=250, history_retention=3600) == (None, 0)
    assert log_versions(aged) == before
    assert rows_at(aged, 1) == 1


def test_a_floor_below_the_first_checkpoint_keeps_everything(aged: TableTarget) -> None:
    before = log_versions(aged)
    assert expire_log(aged, floor=98, history_retention=0) == (None, 0)
    assert log_versions(aged) == before


class Lineage:
    """A lineage's control plane with markers mapping seq n to version n of `totals`."""

    def __init__(self, root: Path, target: TableTarget) -> None:
        self.store = Location(str(root)).store()
        self.layout = LineageLayout(Location(str(root)), "lin", "job")
        self.target = target

    def markers(self, seqs: range) -> None:
        for seq in seqs:
            marker = {"seq": seq, "batch_id": seq, "versions": {"totals": seq + 1}}
            self.store.write_json(self.layout.marker(seq), marker)

    def index(self, ids: list[int], pins: dict[str, int] | None = None) -> None:
        entries = [IndexEntry(id=i, batch_id=i, epoch=1) for i in ids]
        index = CheckpointIndex(owner_epoch=1, checkpoints=entries, pins=pins or {})
        self.store.write_json(self.layout.checkpoint_index, index.to_json())

    def savepoints(self, seqs: list[int]) -> None:
        entries = [
            SavepointEntry(
                id=f"sp-20270115T080000-{i:08x}",
                job="job",
                lineage="lin",
                format="native",
                storage="pinned",
                state="complete",
                seq=seq,
            )
            for i, seq in enumerate(seqs)
        ]
        registry = Registry(owner_epoch=1, savepoints=entries)
        self.store.write_json(self.layout.savepoint_registry, registry.to_json())

    def maintenance(
        self, shared: bool = False, every: int = 50, markers_kept: int = 1000
    ) -> TableMaintenance:
        store, layout = self.store, self.layout
        return TableMaintenance(
            targets={"totals": self.target},
            shared={"totals"} if shared else set(),
            protected=ProtectedVersions(
                store, layout, seqs=lambda: lineage_protected_seqs(store, layout)
            ),
            policy=MaintenancePolicy(every=every, history_retention=0, markers_kept=markers_kept),
        )


def test_savepoints_and_retained_checkpoints_set_the_floor(
    aged: TableTarget, tmp_path: Path
) -> None:
    lineage = Lineage(tmp_path / "root", aged)
    lineage.markers(range(250))
    lineage.index([246, 247, 248], pins={"sp-20270115T080000-0000000a": 120})
    lineage.savepoints([160])
    assert lineage_protected_seqs(lineage.store, lineage.layout) == {246, 247, 248, 120, 160}

    reports = lineage.maintenance().after_commit({"totals": 300})

    assert [(r.floor, r.cut) for r in reports] == [(121, 99)]
    assert min(log_versions(aged)) == 99
    assert rows_at(aged, 121) == 121  # the pinned checkpoint's version
    assert rows_at(aged, 161) == 161  # the savepoint's version


def test_a_pass_retires_the_markers_nothing_protects_and_keeps_the_floor(
    aged: TableTarget, tmp_path: Path
) -> None:
    lineage = Lineage(tmp_path / "root", aged)
    lineage.markers(range(250))
    lineage.index([246, 247, 248], pins={"sp-20270115T080000-0000000a": 120})
    lineage.savepoints([160])
    maintenance = lineage.maintenance(markers_kept=50)

    reports = maintenance.after_commit({"totals": 300}, head_seq=249)

    seqs = [seq_of(k) for k in lineage.store.list(lineage.layout.markers)]
    assert seqs == [120, 160, *range(200, 250)]
    assert [(r.floor, r.cut) for r in reports] == [(121, 99)]
    # The next pass reads the floor from the protected markers, which stayed.
    assert maintenance.protected.floors() == {"totals": 121}
    assert ProtectedVersions(lineage.store, lineage.layout, seqs=lambda: [120, 160]).floors() == {
        "totals": 121
    }


def test_without_protected_seqs_the_log_is_cut_at_the_head(
    aged: TableTarget, tmp_path: Path
) -> None:
    lineage = Lineage(tmp_path / "root", aged)
    [report] = lineage.maintenance().after_commit({"totals": 250})
    assert report.floor == 250
    assert report.cut == 250  # the pass wrote a checkpoint of version 250 first
    assert log_versions(aged) == [250]
    assert len(contents(aged)) == 250


def test_a_missing_marker_expires_nothing(aged: TableTarget, tmp_path: Path) -> None:
    lineage = Lineage(tmp_path / "root", aged)
    lineage.markers(range(200, 250))
    lineage.savepoints([150])  # its marker is gone: the floor is unknown
    before = log_versions(aged)

    [report] = lineage.maintenance().after_commit({"totals": 250})

    assert (report.floor, report.cut, report.log_entries_deleted) == (None, None, 0)
    assert log_versions(aged)[:-1] == before[:-1]  # only a checkpoint was added


def test_a_shared_table_is_checkpointed_but_keeps_its_log(
    aged: TableTarget, tmp_path: Path
) -> None:
    lineage = Lineage(tmp_path / "root", aged)
    [report] = lineage.maintenance(shared=True).after_commit({"totals": 250})
    assert report.cut is None
    assert min(log_versions(aged)) == 0
    assert (Path(aged.location.uri) / "_delta_log" / f"{250:020d}.checkpoint.parquet").exists()


def test_a_fenced_runner_deletes_nothing(aged: TableTarget, tmp_path: Path) -> None:
    lineage = Lineage(tmp_path / "root", aged)
    before = log_versions(aged)

    def fenced() -> None:
        raise FencedError("epoch 1 is fenced by epoch 2")

    with pytest.raises(FencedError):
        lineage.maintenance().after_commit({"totals": 250}, guard=fenced)
    assert log_versions(aged) == before


def test_a_pass_runs_each_time_a_table_crosses_a_multiple_of_every(
    aged: TableTarget, tmp_path: Path
) -> None:
    maintenance = Lineage(tmp_path / "root", aged).maintenance(every=10)
    assert maintenance.due({"totals": 9}) == []
    assert maintenance.due({"totals": 10}) == ["totals"]  # also right after a restart
    maintenance._last_pass["totals"] = 10
    assert maintenance.due({"totals": 19}) == []
    assert maintenance.due({"totals": 23}) == ["totals"]  # versions may jump (fences)
