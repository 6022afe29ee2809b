"""The checkpoint coordinator: commits WAL manifests once their checkpoint completes.

Flink's notifyCheckpointComplete, on Spark: a driver thread watches the commit log
and, for each pending manifest in commit-sequence order whose batch completed, commits
every table, writes the commit marker and retires the manifest. The queue is bounded
(`checkpoint.max_concurrent`): a batch that would exceed it waits at its end until
earlier batches are committed (backpressure), so pending work never grows unbounded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from streamkeeper import injection
from streamkeeper.commit import crashpoints
from streamkeeper.commit.maintenance import TableMaintenance
from streamkeeper.commit.tables import TableCommitter, TableTarget
from streamkeeper.commit.wal import Manifest, WriteAheadLog
from streamkeeper.errors import CheckpointFailureLimitError, FencedError
from streamkeeper.lineage.control import Fence
from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.observability.health import CheckpointHealth
from streamkeeper.snapshots.spark_checkpoint import SparkCheckpoint
from streamkeeper.state.positions import batch_input
from streamkeeper.storage import ObjectStore

log = logging.getLogger(__name__)

POLL_SECONDS = 0.02
# A batch submits its manifest as its function returns; Spark writes `commits/N` a few
# ms later. The committer looks that often for the first second of a manifest's wait
# (each look is a stat), so noticing costs ~1 ms of the visibility delay, not ~10.
FAST_POLL_SECONDS = 0.002
FAST_POLL_WINDOW = 1.0
RETRY_SECONDS = 1.0
# What a long-lived driver keeps per batch: the facts the history flush reads (Spark
# reports the last 100 batches) and the visibility delays of the newest batches.
FACTS_KEPT = 1000
DELAYS_KEPT = 10_000


@dataclass
class CommitStats:
    """Where the lineage stands (its head) and what this coordinator did."""

    last_seq: int = -1
    last_batch: int = -1
    last_query: str | None = None  # the Spark query whose batch the head committed
    last_epoch: int = -1  # the epoch that committed the head
    last_commit_at: float | None = None
    committed: int = 0
    peak_pending: int = 0  # the most manifests that ever waited at once (<= max_pending)
    # The newest batches' (a driver runs for months): RunResult's figures of a bounded run.
    visibility_delays_ms: deque[float] = field(default_factory=lambda: deque(maxlen=DELAYS_KEPT))

    @classmethod
    def from_head(cls, head: dict[str, Any] | None) -> CommitStats:
        """Start from the lineage's latest commit marker, not from nothing."""
        if head is None:
            return cls()
        return cls(
            last_seq=int(head["seq"]),
            last_batch=int(head["batch_id"]),
            last_query=head.get("query_id"),
            last_epoch=int(head.get("epoch", -1)),
            last_commit_at=head.get("committed_at"),
        )


class CheckpointHook(Protocol):
    """Externalized checkpoints (snapshots.externalized.ExternalizedCheckpoints)."""

    def before_commit(self, manifest: Manifest) -> int | None:
        """Make the batch's checkpoint durable; returns the bytes uploaded."""

    def after_commit(self, manifest: Manifest) -> None:
        """Apply retention once the batch is visible."""


class CommitCoordinator:
    """Commits manifests to their tables exactly once and records commit markers."""

    def __init__(
        self,
        *,
        store: ObjectStore,
        layout: LineageLayout,
        wal: WriteAheadLog,
        targets: dict[str, TableTarget],
        fence: Fence,
        head: dict[str, Any] | None = None,
        max_pending: int = 2,
        health: CheckpointHealth | None = None,
        checkpoints: CheckpointHook | None = None,
        maintenance: TableMaintenance | None = None,
    ) -> None:
        self.store = store
        self.checkpoints = checkpoints
        self.maintenance = maintenance
        self.layout = layout
        self.wal = wal
        self.targets = targets
        self.fence = fence
        self.max_pending = max_pending
        self.stats = CommitStats.from_head(head)
        self.health = health
        self._facts: dict[int, dict[str, Any]] = {}
        self._timed_out: set[int] = set()
        self._table_ms: dict[str, float] = {}  # the current commit's, per table
        self._committers = {name: TableCommitter(t, fence.epoch) for name, t in targets.items()}
        self._queue: deque[Manifest] = deque()
        self._head_since = 0.0  # when the queue's head became the head (monotonic)
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._checkpoint: SparkCheckpoint | None = None

    # -- the commit itself -------------------------------------------------------------

    def commit_sinks(self, manifest: Manifest, sinks: list[str]) -> dict[str, int]:
        """Commit the named sinks of a manifest; returns each table's version holding it."""
        versions: dict[str, int] = {}
        # One control-plane check per batch; every table commit also carries the epoch.
        self.fence.check()
        for index, name in enumerate(sorted(sinks)):
            if index > 0:
                crashpoints.reached("between_table_commits")
            injection.reached("before_table_commit", seq=manifest.seq, sink=name)
            started = time.monotonic()
            try:
                versions[name] = self._committers[name].commit(manifest.sinks[name], manifest.seq)
            except FencedError as error:
                self.fence.mark_fenced(error)
                raise
            self._table_ms[name] = _ms(time.monotonic() - started)
        manifest.versions.update(versions)
        return versions

    def commit_manifest(self, manifest: Manifest, batch_end: float | None) -> None:
        """Commit every table of a completed batch, then the marker, then retire it."""
        picked_up = time.time()
        uploaded = None
        if self.checkpoints is not None:
            # Flink's order: checkpoint N is durable before the output it covers is visible,
            # so a restore from the latest externalized checkpoint never replays that output.
            uploaded = self.checkpoints.before_commit(manifest)
        externalized = time.time()
        crashpoints.reached("before_delta_commit")
        # In-batch sinks (idempotent, at_least_once) were committed before the batch returned.
        pending = [n for n in manifest.sinks if n not in manifest.versions]
        deferred = [n for n in pending if manifest.sinks[n].mode == "exactly_once"]
        self._table_ms = {}
        versions = {**manifest.versions, **self.commit_sinks(manifest, deferred)}
        for name in manifest.sinks:
            if name not in versions:  # committed inside the batch before a crash
                versions[name] = self._committers[name].version_holding(manifest.seq)
        crashpoints.reached("before_commit_marker")
        committed_at = time.time()
        delay_ms = None if batch_end is None else max(0.0, (committed_at - batch_end) * 1000)
        marker = self._marker(manifest, versions, committed_at, delay_ms)
        # Where the delay went (the commit-latency benchmark reads it): noticing the
        # completed batch, externalizing its checkpoint, each table's commit.
        marker["visibility_phases_ms"] = {
            "noticed": None if batch_end is None else _ms(max(0.0, picked_up - batch_end)),
            "checkpoint": _ms(externalized - picked_up),
            "tables": dict(self._table_ms),
        }
        self.store.write_json(self.layout.marker(manifest.seq), marker)
        self.wal.retire(manifest.seq)
        self._sweep_retried_tasks(manifest)
        if self.checkpoints is not None:
            self.checkpoints.after_commit(manifest)  # retention, off the visibility path
        self._maintain(versions, manifest.seq)
        self._refresh(deferred)
        log.info(
            "batch %d committed as seq %d: versions %s", manifest.batch_id, manifest.seq, versions
        )
        self._facts[manifest.batch_id] = {
            "commit_seq": manifest.seq,
            "visibility_delay_ms": delay_ms,
            "bytes_uploaded": uploaded,
        }
        while len(self._facts) > FACTS_KEPT:  # the oldest first (insertion order)
            del self._facts[next(iter(self._facts))]
        if self.health is not None and manifest.batch_id not in self._timed_out:
            self.health.completed()
        self.stats.last_seq = manifest.seq
        self.stats.last_batch = manifest.batch_id
        self.stats.last_query = manifest.query_id
        self.stats.last_epoch = self.fence.epoch
        self.stats.last_commit_at = committed_at
        self.stats.committed += 1
        if delay_ms is not None:
            self.stats.visibility_delays_ms.append(delay_ms)

    def _marker(
        self, manifest: Manifest, versions: dict[str, int], at: float, delay_ms: float | None
    ) -> dict[str, Any]:
        return {
            "seq": manifest.seq,
            "query_id": manifest.query_id,
            "batch_id": manifest.batch_id,
            "checkpoint_dir": manifest.checkpoint_dir,
            "epoch": self.fence.epoch,
            "versions": versions,
            "rows": {name: part.rows for name, part in manifest.sinks.items()},
            "writers": sorted({f.writer for part in manifest.sinks.values() for f in part.files}),
            "committed_at": at,
            "visibility_delay_ms": delay_ms,
            "input": _batch_input(manifest),
        }

    def _maintain(self, versions: dict[str, int], seq: int) -> None:
        """Table maintenance and marker retention, off the visibility path; a failed pass
        is retried next time."""
        if self.maintenance is None:
            return
        try:
            self.maintenance.after_commit(
                versions,
                guard=self.fence.check,
                snapshot=lambda sink: self._committers[sink].snapshot(),
                head_seq=seq,
            )
        except FencedError:
            raise
        except Exception as error:  # noqa: BLE001 - the output is committed; only upkeep failed
            log.warning("table maintenance failed (retried after the next commits): %s", error)

    def _refresh(self, sinks: list[str]) -> None:
        """Read the tables just committed back now, between batches; a failure only means
        the next commit reads them itself."""
        for name in sinks:
            try:
                self._committers[name].refresh()
            except Exception as error:  # noqa: BLE001 - the output is committed
                log.debug("could not read table %s back after its commit: %s", name, error)

    def _sweep_retried_tasks(self, manifest: Manifest) -> None:
        """A failed task or stage attempt may have left files in the batch's folder.

        One listing of that folder per append table: it holds one batch's files only.
        """
        from streamkeeper.commit.disposal import sweep_precommit_folder

        for name, part in manifest.sinks.items():
            if part.output == "append" and part.files:
                keep = {f.path.rsplit("/", 1)[-1] for f in part.files}
                sweep_precommit_folder(self.targets[name], self.layout, manifest.seq, keep)

    # -- the background committer ------------------------------------------------------

    def submit(self, manifest: Manifest) -> None:
        """Queue a manifest; it is committed once its batch completes.

        Blocks while `max_pending` manifests wait (backpressure on the next batch).
        """
        with self._changed:
            while len(self._queue) >= self.max_pending:
                self._raise_if_failed()
                if self._stop.is_set():
                    break
                self._changed.wait(0.5)
            self._raise_if_failed()
            if not self._queue:
                self._head_since = time.monotonic()
            self._queue.append(manifest)
            self.stats.peak_pending = max(self.stats.peak_pending, len(self._queue))
            self._changed.notify_all()

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
                    with self._changed:
                        self._changed.wait(self._poll_wait())
        except BaseException as error:  # noqa: BLE001 - surfaced to the driver thread
            log.exception("commit coordinator failed")
            self._error = error
        finally:
            with self._changed:
                self._changed.notify_all()

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
        assert self._checkpoint is not None
        batch_end = self._checkpoint.completed_at(head.batch_id)
        if batch_end is None:
            return False
        self.commit_manifest(head, batch_end)
        with self._changed:
            self._queue.popleft()
            self._head_since = time.monotonic()
            self._changed.notify_all()
        return True

    def _poll_wait(self) -> float:
        """How long to wait before looking for the head's `commits/N` again (submit and
        stop wake the committer at once)."""
        waiting = time.monotonic() - self._head_since
        return FAST_POLL_SECONDS if self._queue and waiting < FAST_POLL_WINDOW else POLL_SECONDS

    def drain(self, timeout: float = 120.0) -> None:
        """Wait until every queued manifest whose checkpoint completed is committed."""
        deadline = time.monotonic() + timeout
        assert self._checkpoint is not None
        while time.monotonic() < deadline:
            self._raise_if_failed()
            # A copy: the committer thread pops from the queue while we look.
            ready = [m for m in list(self._queue) if self._checkpoint.is_complete(m.batch_id)]
            if not ready:
                return
            with self._changed:
                self._changed.notify_all()
            time.sleep(POLL_SECONDS)
        raise TimeoutError(
            f"commits still pending after {timeout}s: {[m.seq for m in self._queue]}"
        )

    def stop(self) -> None:
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
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
            "last_commit_at": self.stats.last_commit_at,
            "pending_commits": len(self._queue),
            "peak_pending_commits": self.stats.peak_pending,
        }


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def _batch_input(manifest: Manifest) -> list[str | None] | None:
    """Where the input stood after the batch (upgrades compare two lineages by it).

    Never fails a commit: a checkpoint whose entries are gone records None.
    """
    try:
        return batch_input(Path(manifest.checkpoint_dir), manifest.batch_id)
    except Exception as error:  # noqa: BLE001 - a fingerprint, not part of the commit
        log.warning("input position of batch %d unknown: %s", manifest.batch_id, error)
        return None
