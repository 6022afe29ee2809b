"""A producing job's lineage without Spark, written by the real commit path.

Each batch is pre-written as Parquet into the table's `sk-{lineage}/{seq}/` folder and
committed by `TableCommitter` (data and fence app transactions), then its commit marker
is written as the coordinator writes it; each start takes the lineage's next epoch,
writes the job record and fences every table; savepoint manifests and upgrade records
are the real dataclasses in their real places. So the readers downstream of it see the
tables, markers and records a running job leaves, and a rollback is the real
`upgrade.rollback.restore_tables`.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from streamkeeper.client import StreamkeeperClient
from streamkeeper.commit.tables import TableCommitter, TableTarget, ensure_table, fence_table
from streamkeeper.commit.wal import DataFile, SinkBatch
from streamkeeper.lineage.control import ControlPlane, Lease
from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.snapshots.savepoint_manifest import SavepointManifest, SavepointPlace, TableSeq
from streamkeeper.snapshots.savepoints import new_savepoint_id
from streamkeeper.storage import Location
from streamkeeper.upgrade.handover import handover_facts
from streamkeeper.upgrade.record import UpgradeRecord, UpgradeRecords
from streamkeeper.upgrade.rollback import restore_tables
from streamkeeper.upgrade.shadow import new_upgrade_id

SCHEMA = pa.schema([("key", pa.string()), ("value", pa.int64()), ("version", pa.string())])
Row = tuple[str, int, str]  # key, value, the producing version ("blue" / "green")


class Producer:
    """One job lineage writing one append table (`events`) batch by batch."""

    def __init__(self, root: Path, job: str = "orders", sink: str = "events") -> None:
        self.location = Location(str(root))
        self.store = self.location.store()
        self.job, self.sink = job, sink
        self.layout = LineageLayout(self.location, job, job)
        self.control = ControlPlane(self.store, self.layout)
        self.target = TableTarget(
            sink,
            self.location.child(f"tables/{sink}"),
            self.layout.data_app_id(sink),
            self.layout.fence_app_id(),
        )
        self.records = UpgradeRecords(self.store, job)
        self.seq = 0
        self.batch = -1
        self.lease: Lease | None = None
        self.committer: TableCommitter | None = None

    @property
    def table(self) -> str:
        return self.target.location.uri

    def start(self) -> int:
        """A runner start (blue, green, blue again): next epoch, job record, tables fenced."""
        self.lease = lease = self.control.acquire(takeover=True)
        record = {
            "job": self.job,
            "lineage": self.job,
            "root": self.location.uri,
            "tables": {self.sink: {"table": self.table, "output": "append", "mode": None}},
        }
        self.control.write_owned(self.layout.job_record, lease, record)
        ensure_table(self.target, SCHEMA)
        fence_table(self.target, lease.epoch)
        self.committer = TableCommitter(self.target, lease.epoch)
        self.batch = -1  # a start from a savepoint or a fresh checkpoint: batch ids restart
        return lease.epoch

    def commit(self, rows: list[Row]) -> int:
        """One batch: its rows committed as the lineage's next seq, then its marker."""
        assert self.lease is not None and self.committer is not None, "start() first"
        self.seq += 1
        self.batch += 1
        folder = self.layout.precommit_dir(self.seq)
        name = f"{folder}/e{self.lease.epoch}-{uuid.uuid4().hex}.parquet"
        data = pa.table(
            {
                "key": [r[0] for r in rows],
                "value": pa.array([r[1] for r in rows], pa.int64()),
                "version": [r[2] for r in rows],
            },
            schema=SCHEMA,
        )
        path = Path(self.table) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(data, path)
        stats = json.dumps({"numRecords": len(rows)})
        part = DataFile(name, path.stat().st_size, len(rows), stats, "test/1")
        batch = SinkBatch(self.table, "append", "exactly_once", files=[part])
        version = self.committer.commit(batch, self.seq)
        marker = {
            "seq": self.seq,
            "query_id": "test",
            "batch_id": self.batch,
            "epoch": self.lease.epoch,
            "versions": {self.sink: version},
            "rows": {self.sink: len(rows)},
            "committed_at": time.time(),
        }
        self.store.write_json(self.layout.marker(self.seq), marker)
        beat = {"state": "RUNNING", "lineage": self.job, "last_committed_seq": self.seq}
        self.control.write_owned(self.layout.heartbeat, self.lease, beat)
        return version

    def savepoint(self) -> SavepointManifest:
        """A savepoint at the head: its manifest records each table's seq and version."""
        head = self.store.read_json(self.layout.marker(self.seq)) or {}
        manifest = SavepointManifest(
            id=new_savepoint_id(),
            job=self.job,
            lineage=self.job,
            format="native",
            storage="pinned",
            seq=self.seq,
            batch_id=self.batch,
            query_id="test",
            spark_version="4.2.0",
            spec_hash="",
            code_version="",
            state_backend="hdfs",
            partitions=1,
            operators=[],
            source_offsets=[],
            tables={self.sink: TableSeq(self.table, self.seq, head["versions"][self.sink])},
            files=[],
        )
        place = SavepointPlace(self.store, self.layout.savepoint(manifest.id))
        self.store.write_json(place.manifest_key, manifest.to_json())
        return manifest

    # -- an upgrade, as its steps move the record ----------------------------------------

    def hand_over(self) -> tuple[UpgradeRecord, SavepointManifest]:
        """Blue stops with savepoint S1; the upgrade goes live (green starts next)."""
        s0 = self.savepoint()
        record = self.records.create(
            UpgradeRecord(
                id=new_upgrade_id(),
                job=self.job,
                lineage=self.job,
                phase="shadow",
                blue={"savepoint": s0.id, "seq": s0.seq},
                green={"shadow_job": f"{self.job}-shadow"},
            )
        )
        self.records.advance(record.id, ("shadow",), "handover_requested")
        self.records.advance(record.id, ("handover_requested",), "handing_over")
        s1 = self.savepoint()
        handover = handover_facts(s1)
        record = self.records.advance(record.id, ("handing_over",), "live", handover=handover)
        return record, s1

    def roll_back(self, record: UpgradeRecord, s1: SavepointManifest) -> dict[str, Any]:
        """Green failed its probation: the real fence and RESTORE to S1, as the task runs it."""
        client = StreamkeeperClient(self.location.uri)
        restored = restore_tables(client, self.job, s1).to_json()
        self.records.advance(record.id, ("live",), "rolling_back", rollback=restored)
        return restored

    def restart_from(self, savepoint: SavepointManifest) -> None:
        """Blue starts from the savepoint: takes the lineage, clears the pending rewind."""
        self.start()
        pending = self.store.read_json(self.layout.rewind_pending)
        if pending is not None and pending.get("savepoint") == savepoint.id:
            self.store.delete([self.layout.rewind_pending])  # as runner._clear_rewind_pending

    def finish(self, record: UpgradeRecord, phase: str) -> None:
        expected = ("rolling_back",) if phase == "rolled_back" else ("live",)
        self.records.advance(record.id, expected, phase)  # type: ignore[arg-type]
