"""The checkpoint coordinator: commits WAL manifests once their checkpoint completes.

Flink's notifyCheckpointComplete, on Spark: a driver thread watches the commit log
and, for each pending manifest in commit-sequence order whose `commits/N` exists,
commits every table, writes the commit marker and retires the manifest.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from streamkeeper.commit import crashpoints
from streamkeeper.commit.tables import TableCommitter, TableTarget
from streamkeeper.commit.wal import Manifest, WriteAheadLog
from streamkeeper.errors import FencedError
from streamkeeper.lineage.control import ControlPlane, Lease
from streamkeeper.lineage.layout import LineageLayout, seq_of
from streamkeeper.observability.health import CheckpointFailureLimitError, CheckpointHealth
from streamkeeper.snapshots.spark_checkpoint import SparkCheckpoint
from streamkeeper.storage import ObjectStore

log = logging.getLogger(__name__)

POLL_SECONDS = 0.02
RETRY_SECONDS = 1.0


@dataclass
class CommitStats:
    """What the coordinator did, for heartbeats and benchmarks."""

    last_seq: int = -1
    last_batch: int = -1
    committed: int = 0
    visibility_delays_ms: list[float] = field(default_factory=list)


class CheckpointHook(Protocol):
    """Externalized checkpoints (checkpoint_store.ExternalizedCheckpoints)."""

    def before_commit(self, manifest: Manifest) -> int | None:
        """Make the batch's checkpoint durable; returns the bytes uploaded."""

    def after_commit(self, manifest: Manifest) -> None:
        """Apply retention once the batch is visible."""


class CommitSequence:
    """The lineage's monotonic commit sequence (the Delta app transaction version).

    It never goes back, not even when a restore starts a fresh checkpoint whose batch ids
    restart at 0: it starts above everything any table, manifest or marker has seen.
    """

    def __init__(self, start: int) -> None:
        self._next = start
        self._reserved: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()

    def reserve_existing(self, query_id: str, batch_id: int, seq: int) -> None:
        """A manifest kept across a crash: its batch must be replayed under the same seq."""
        self._reserved[(query_id, batch_id)] = seq

    def is_reserved(self, query_id: str, batch_id: int) -> bool:
        return (query_id, batch_id) in self._reserved

    def for_batch(self, query_id: str, batch_id: int) -> int:
        with self._lock:
            if (query_id, batch_id) in self._reserved:
                return self._reserved[(query_id, batch_id)]
            seq = self._next
            self._next += 1
            return seq


def initial_sequence(
    store: ObjectStore, layout: LineageLayout, targets: dict[str, TableTarget]
) -> int:
    """One above the highest seq any table, pending manifest or marker has seen."""
    seen = [t.committed_seq() for t in targets.values()]
    seen += [seq_of(k) for k in store.list(layout.manifests)]
    markers = store.list(layout.markers)
    if markers:
        seen.append(seq_of(markers[-1]))
    return max(seen, default=-1) + 1


class CommitCoordinator:
    """Commits manifests to their tables exactly once and records commit markers."""

    def __init__(
        self,
        *,
        store: ObjectStore,
        layout: LineageLayout,
        wal: WriteAheadLog,
        targets: dict[str, TableTarget],
        control: ControlPlane,
        lease: Lease,
        health: CheckpointHealth | None = None,
        checkpoints: CheckpointHook | None = None,
    ) -> None:
        self.store = store
        self.checkpoints = checkpoints
        self.layout = layout
        self.wal = wal
        self.targets = targets
        self.control = control
        self.lease = lease
        self.stats = CommitStats()
        self.health = health
        self._facts: dict[int, dict[str, Any]] = {}
        self._timed_out: set[int] = set()
        self._committers = {name: TableCommitter(t, lease.epoch) for name, t in targets.items()}
        self._queue: deque[Manifest] = deque()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._idle = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    # -- the commit itself -------------------------------------------------------------

    def commit_sinks(self, manifest: Manifest, sinks: list[str]) -> dict[str, int]:
        """Commit the named sinks of a manifest; returns each table's version."""
        versions: dict[str, int] = {}
        # One control-plane check per batch; every table commit also carries the epoch.
        self.control.check_not_fenced(self.lease)
        for index, name in enumerate(sorted(sinks)):
            if index > 0:
                crashpoints.reached("between_table_commits")
            versions[name] = self._committers[name].commit(manifest.sinks[name], manifest.seq)
        return versions

    def commit_manifest(self, manifest: Manifest, batch_end: float | None) -> None:
        """Commit every table of a completed batch, then the marker, then retire it."""
        uploaded = None
        if self.checkpoints is not None:
            # Flink's order: checkpoint N is durable before the output it covers is visible,
            # so a restore from the latest externalized checkpoint never replays that output.
            uploaded = self.checkpoints.before_commit(manifest)
        crashpoints.reached("before_delta_commit")
        # In-batch sinks (idempotent, at_least_once) were committed before the batch returned.
        deferred = [n for n, part in manifest.sinks.items() if part.mode == "exactly_once"]
        versions = self.commit_sinks(manifest, deferred)
        for name in manifest.sinks:
            if name not in versions:
                versions[name] = self._committers[name].snapshot().version()
        crashpoints.reached("before_commit_marker")
        committed_at = time.time()
        delay_ms = None if batch_end is None else max(0.0, (committed_at - batch_end) * 1000)
        self.store.write_json(
            self.layout.marker(manifest.seq),
            {
                "seq": manifest.seq,
                "query_id": manifest.query_id,
                "batch_id": manifest.batch_id,
                "checkpoint_dir": manifest.checkpoint_dir,
                "epoch": self.lease.epoch,
                "versions": versions,
                "rows": {name: part.rows for name, part in manifest.sinks.items()},
                "writers": sorted(
                    {f.writer for part in manifest.sinks.values() for f in part.files}
                ),
                "committed_at": committed_at,
                "visibility_delay_ms": delay_ms,
            },
        )
        self.wal.retire(manifest.seq)
        if self.checkpoints is not None:
            self.checkpoints.after_commit(manifest)  # retention, off the visibility path
        log.info(
            "batch %d committed as seq %d: versions %s", manifest.batch_id, manifest.seq, versions
        )
        self._facts[manifest.batch_id] = {
            "commit_seq": manifest.seq,
            "visibility_delay_ms": delay_ms,
            "bytes_uploaded": uploaded,
        }
        if self.health is not None and manifest.batch_id not in self._timed_out:
            self.health.completed()
        self.stats.last_seq = manifest.seq
        self.stats.last_batch = manifest.batch_id
        self.stats.committed += 1
        if delay_ms is not None:
            self.stats.visibility_delays_ms.append(delay_ms)

    # -- the background committer ------------------------------------------------------

    def submit(self, manifest: Manifest) -> None:
        """Queue a manifest; it is committed once `commits/N` of its batch exists."""
        self._raise_if_failed()
        self._idle.clear()
        self._queue.append(manifest)
        self._wake.set()

    def start(self, checkpoint: SparkCheckpoint) -> None:
        self._checkpoint = checkpoint
        self._thread = threading.Thread(
            target=self._run, name="streamkeeper-committer", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if not self._commit_ready_or_tolerate():
                    self._idle.set()
                    self._wake.wait(POLL_SECONDS)
                    self._wake.clear()
        except BaseException as error:  # noqa: BLE001 - surfaced to the driver thread
            log.exception("commit coordinator failed")
            self._error = error
            self._idle.set()

    def _commit_ready_or_tolerate(self) -> bool:
        """A failed commit is a failed checkpoint: counted, then retried, unless fatal."""
        try:
            return self._commit_ready()
        except (FencedError, CheckpointFailureLimitError):
            raise
        except Exception as error:
            if self.health is None:
                raise
            head = self._queue[0]
            self.health.failed(f"commit of checkpoint {head.batch_id} failed: {error}")
            log.warning("commit of checkpoint %d failed, retrying: %s", head.batch_id, error)
            self._stop.wait(RETRY_SECONDS)
            return False

    def _commit_ready(self) -> bool:
        """Commit the head of the queue if its checkpoint is complete."""
        if not self._queue:
            return False
        head = self._queue[0]
        batch_end = self._checkpoint.completed_at(head.batch_id)
        if batch_end is None:
            return False
        self.commit_manifest(head, batch_end)
        self._queue.popleft()
        return True

    def drain(self, timeout: float = 120.0) -> None:
        """Wait until every queued manifest whose checkpoint completed is committed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._raise_if_failed()
            # A copy: the committer thread pops from the queue while we look (list() of a
            # deque is one C call under the GIL).
            ready = [m for m in list(self._queue) if self._checkpoint.is_complete(m.batch_id)]
            if not ready:
                return
            self._wake.set()
            time.sleep(POLL_SECONDS)
        raise TimeoutError(
            f"commits still pending after {timeout}s: {[m.seq for m in self._queue]}"
        )

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    @property
    def failure(self) -> BaseException | None:
        return self._error

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def mark_timed_out(self, batch_id: int) -> None:
        """A batch past its timeout is a failed checkpoint even if it completes later."""
        self._timed_out.add(batch_id)

    def checkpoint_facts(self, batch_id: int) -> dict[str, Any] | None:
        """Commit seq and visibility delay of a committed batch, for the history table."""
        return self._facts.get(batch_id)

    def facts(self) -> dict[str, Any]:
        return {
            "last_committed_seq": self.stats.last_seq,
            "last_committed_batch": self.stats.last_batch,
            "pending_commits": len(self._queue),
        }
