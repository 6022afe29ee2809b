"""WAL manifests on a local store, and the executor-side Parquet writer run without Spark."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamkeeper.commit.wal import DataFile, Manifest, SinkBatch, WriteAheadLog
from streamkeeper.commit.writer import SinkWritePlan, data_file_name, make_partition_writer
from streamkeeper.errors import CorruptManifestError, FencedError
from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.storage import LocalStore, Location


@pytest.fixture
def wal(tmp_path: Path) -> WriteAheadLog:
    # The layout's root says where merge files are staged (as URIs in the manifest).
    layout = LineageLayout(Location(ROOT), "lin", "job")
    return WriteAheadLog(LocalStore(tmp_path), layout)


ROOT = "/root"


def _staged(lineage: str, seq: int) -> str:
    return f"{ROOT}/lineages/{lineage}/wal/staging/{seq:020d}/totals/e3-{seq}.parquet"


def manifest(seq: int, lineage: str = "lin") -> Manifest:
    part = SinkBatch(
        table="/t/totals",
        output="merge",
        mode="exactly_once",
        key=["key"],
        files=[DataFile(path=_staged(lineage, seq), size=10, rows=2, stats="{}", writer="w")],
    )
    return Manifest(
        lineage=lineage,
        seq=seq,
        query_id="q",
        batch_id=seq + 100,
        checkpoint_dir="/ckpt",
        epoch=3,
        sinks={"totals": part, "changes": SinkBatch("/t/changes", "append", "idempotent")},
    )


def test_manifest_round_trip(wal: WriteAheadLog) -> None:
    written = manifest(4)
    wal.write(written)
    assert wal.read(4) == written
    assert wal.read(5) is None
    assert wal.read(4).sinks["totals"].rows == 2


def test_manifest_keeps_order_by_and_reads_older_manifests_without_it(
    wal: WriteAheadLog,
) -> None:
    written = manifest(4)
    written.sinks["totals"].order_by = "updated_at"
    wal.write(written)
    assert wal.read(4).sinks["totals"].order_by == "updated_at"
    older = manifest(5).to_json()
    for part in older["sinks"].values():
        del part["order_by"]
    wal.store.write_json(wal.layout.manifest(5), older)
    assert wal.read(5).sinks["totals"].order_by is None


def test_pending_is_in_seq_order(wal: WriteAheadLog) -> None:
    for seq in [10, 2, 7]:
        wal.write(manifest(seq))
    assert [m.seq for m in wal.pending()] == [2, 7, 10]
    assert wal.pending_seqs() == [2, 7, 10]


def test_retire_removes_manifest_and_its_staging_only(wal: WriteAheadLog, tmp_path: Path) -> None:
    for seq in (1, 2):
        wal.write(manifest(seq))
        staged = tmp_path / wal.layout.staging_prefix(seq) / "totals" / data_file_name(3)
        staged.parent.mkdir(parents=True)
        staged.write_bytes(b"parquet")
    wal.retire(1)
    assert wal.pending_seqs() == [2]
    store = wal.store
    assert store.list(wal.layout.staging_prefix(1)) == []
    assert len(store.list(wal.layout.staging_prefix(2))) == 1


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda d: d.pop("sinks"),
        lambda d: d.update(format=2),
        lambda d: d["sinks"]["totals"]["files"][0].update(unexpected=1),
        lambda d: d.pop("epoch"),
    ],
    ids=["missing-sinks", "wrong-format", "bad-file-entry", "missing-epoch"],
)
def test_corrupt_manifest_names_the_key(wal: WriteAheadLog, corrupt) -> None:  # noqa: ANN001
    data = manifest(3).to_json()
    corrupt(data)
    key = wal.layout.manifest(3)
    wal.store.write_json(key, data)
    with pytest.raises(CorruptManifestError, match="is corrupt") as caught:
        wal.read(3)
    assert key in str(caught.value)
    with pytest.raises(CorruptManifestError):
        wal.pending()


def test_manifest_of_other_lineage_is_refused(wal: WriteAheadLog) -> None:
    wal.write(manifest(5, lineage="someone-else"))
    with pytest.raises(CorruptManifestError, match="belongs to lineage 'someone-else'") as caught:
        wal.read(5)
    assert wal.layout.manifest(5) in str(caught.value)


@pytest.mark.parametrize("text", ['{"format": 1, "sink', "[1, 2]", '{"format": 1, "sinks": []}'])
def test_unparseable_manifest_is_corrupt(wal: WriteAheadLog, tmp_path: Path, text: str) -> None:
    path = tmp_path / wal.layout.manifest(6)
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(CorruptManifestError):
        wal.read(6)


def test_data_file_names_carry_the_epoch_and_are_fresh_per_attempt() -> None:
    name = data_file_name(42)
    assert name.startswith("e42-") and name.endswith(".parquet")
    assert data_file_name(42) != name


def test_a_seq_is_claimed_by_one_runner_only(wal: WriteAheadLog) -> None:
    mine, theirs = manifest(8), manifest(8)
    assert wal.claim(mine) is True
    assert wal.claim(theirs) is False  # put-if-absent: the seq is taken
    claimed = wal.read(8)
    assert claimed.state == "writing" and not claimed.complete
    wal.seal(mine)
    sealed = wal.read(8)
    assert sealed.complete and sealed.sinks["totals"].rows == 2 and sealed.token == mine.token


def test_a_claim_resolved_by_a_newer_runner_cannot_be_sealed(wal: WriteAheadLog) -> None:
    mine = manifest(9)
    wal.claim(mine)
    wal.retire(9)  # a newer owner's recovery swept it
    with pytest.raises(FencedError, match="resolved by a newer runner"):
        wal.seal(mine)
    assert wal.read(9) is None


# --- the executor-side writer, fed pyarrow batches directly -----------------------------

SCHEMA = pa.schema([("key", pa.string()), ("total", pa.int64()), ("keep", pa.bool_())])


def batch(keys: list, totals: list, keep: list) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"key": keys, "total": totals, "keep": keep}, schema=SCHEMA)


def plan(directory: Path, sink: str = "s", **overrides) -> SinkWritePlan:  # noqa: ANN003
    values = dict(
        sink=sink,
        directory=Location(str(directory)),
        columns=("key", "total"),
        mask_column=None,
        relative_to="sk-lin/00000000000000000009",
    )
    values.update(overrides)
    return SinkWritePlan(**values)


def run_writer(plans: list[SinkWritePlan], batches: list[pa.RecordBatch]) -> list[dict]:
    out = list(make_partition_writer(plans, epoch=9)(iter(batches)))
    assert len(out) == 1
    return out[0].to_pylist()


def test_writer_writes_parquet_with_stats(tmp_path: Path) -> None:
    rows = run_writer(
        [plan(tmp_path / "t")],
        [batch(["b", "a", None], [5, None, 7], [True] * 3), batch(["c"], [-1], [False])],
    )
    assert len(rows) == 1
    row = rows[0]
    assert row["sink"] == "s" and row["rows"] == 4
    # Relative to the table, inside the batch's folder, named by the epoch.
    assert row["path"].startswith("sk-lin/00000000000000000009/e9-")
    assert row["attempt"] == 0
    assert "stage?" in row["writer"]  # outside a Spark task there is no stage id
    assert row["writer"].endswith(f"pid{os.getpid()}")
    written = tmp_path / "t" / row["path"].rsplit("/", 1)[-1]
    assert row["size"] == written.stat().st_size
    table = pq.read_table(written)
    assert table.column_names == ["key", "total"]
    assert table.to_pydict() == {"key": ["b", "a", None, "c"], "total": [5, None, 7, -1]}
    assert json.loads(row["stats"]) == {
        "numRecords": 4,
        "minValues": {"key": "a", "total": -1},
        "maxValues": {"key": "c", "total": 7},
        "nullCount": {"key": 1, "total": 1},
    }


def test_writer_honours_mask_and_projection(tmp_path: Path) -> None:
    plans = [
        plan(tmp_path / "all", sink="all", columns=("total", "key")),
        plan(
            tmp_path / "kept",
            sink="kept",
            mask_column="keep",
            columns=("key",),
            relative_to=None,
        ),
    ]
    rows = run_writer(
        plans, [batch(["a", "b", "c"], [1, 2, 3], [True, None, False]), batch(["d"], [4], [True])]
    )
    by_sink = {r["sink"]: r for r in rows}
    assert by_sink["all"]["rows"] == 4 and by_sink["kept"]["rows"] == 2
    kept_path = by_sink["kept"]["path"]
    assert kept_path.startswith(str(tmp_path / "kept") + "/")  # absolute for staging
    assert pq.read_table(kept_path).to_pydict() == {"key": ["a", "d"]}
    all_table = pq.read_table(tmp_path / "all" / by_sink["all"]["path"].rsplit("/", 1)[-1])
    assert all_table.column_names == ["total", "key"]
    assert json.loads(by_sink["kept"]["stats"])["nullCount"] == {"key": 0}


def test_writer_writes_nothing_for_an_empty_partition(tmp_path: Path) -> None:
    assert run_writer([plan(tmp_path / "t")], []) == []
    assert (
        run_writer(
            [plan(tmp_path / "t", mask_column="keep")],
            [batch(["a"], [1], [False]), batch([], [], [])],
        )
        == []
    )
    assert not (tmp_path / "t").exists()
