"""The control plane on object storage: fencing epochs and the job's registry records.

Any process that can read the storage root (an Airflow worker, the CLI) can see which
runner holds a lineage, whether it is alive, and what it last committed.

Fencing: every runner start takes the next epoch with a put-if-absent. A runner is
fenced as soon as a higher epoch exists; it checks before every side effect (`Fence`),
every Delta commit carries its epoch (see commit/tables.py), and every shared record
(heartbeat, job record, checkpoint index) is written by compare-and-swap that refuses a
lower epoch, so a runner that raced past a check still loses.
"""

from __future__ import annotations

import functools
import os
import socket
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from streamkeeper.errors import AlreadyRunningError, FencedError
from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.storage import ObjectStore

STALE_AFTER_SECONDS = 30.0
TERMINAL_STATES = ("STOPPED", "FAILED", "FINISHED")


def _process_started_at(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


@functools.cache
def pid_namespace() -> str | None:
    """Where a pid names a process: this kernel's boot and this process's pid namespace.

    A hostname does not say it: network namespaces share one, containers repeat one, and
    another host may carry the same. A recorded pid is checked only by a process of the
    same pid namespace (`pid_meaningful`); anywhere else only the record's age counts.
    """
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None  # not Linux: no pid is ever checked, only heartbeats' ages
    return f"{boot}/{namespace}"


def pid_meaningful(record: dict[str, Any]) -> bool:
    """Does the record's pid name a process this process can see (same pid namespace)?"""
    here = pid_namespace()
    return here is not None and record.get("pid_namespace") == here


@dataclass(frozen=True)
class Lease:
    """This runner's hold on a lineage: the epoch it took and who it is."""

    epoch: int
    pid: int
    host: str
    started_at: float
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    process_started_at: float | None = None
    pid_namespace: str | None = None  # where `pid` means something (see pid_namespace)

    @classmethod
    def for_this_process(cls, epoch: int) -> Lease:
        pid = os.getpid()
        return cls(
            epoch,
            pid,
            socket.gethostname(),
            time.time(),
            uuid.uuid4().hex,
            _process_started_at(pid),
            pid_namespace(),
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _pid_alive(record: dict[str, Any]) -> bool:
    """Is the process a record names still the same running process (not a reused pid)?"""
    pid = int(record.get("pid", -1))
    if pid <= 0 or not psutil.pid_exists(pid):
        return False
    recorded = record.get("process_started_at")
    actual = _process_started_at(pid)
    if recorded is None or actual is None:
        return actual is not None
    return abs(float(recorded) - actual) < 1.0


def process_alive_here(record: dict[str, Any]) -> bool:
    """Is the process an epoch or heartbeat record names (of this pid namespace) still
    running?"""
    return _pid_alive(record)


def runner_alive(
    heartbeat: dict[str, Any] | None,
    epoch_record: dict[str, Any] | None,
    latest_epoch: int,
    now: float,
) -> bool:
    """Whether the runner of the latest epoch may still be running.

    Only the latest epoch's own heartbeat can say it stopped: a fenced runner never
    writes one, and an older one cannot overwrite a newer (compare-and-swap).
    """
    if latest_epoch == 0:
        return False
    if heartbeat and int(heartbeat.get("epoch", -1)) == latest_epoch:
        if heartbeat.get("state") in TERMINAL_STATES:
            return False
        if pid_meaningful(heartbeat):
            return _pid_alive(heartbeat)
        return now - float(heartbeat.get("time", 0)) < STALE_AFTER_SECONDS
    # The latest runner has not beaten yet (starting, or it died before its first beat).
    record = epoch_record or {}
    if pid_meaningful(record):
        return _pid_alive(record)
    return now - float(record.get("started_at", 0)) < STALE_AFTER_SECONDS


class ControlPlane:
    """Reads and writes one job lineage's control-plane objects."""

    def __init__(self, store: ObjectStore, layout: LineageLayout) -> None:
        self.store = store
        self.layout = layout

    # -- epochs ------------------------------------------------------------------------

    def latest_epoch(self) -> int:
        """The highest epoch taken, without listing every epoch of a long-lived lineage.

        The heartbeat's epoch is a lower bound; the epochs after it are probed one HEAD
        at a time (usually none or one). Only a lineage without a heartbeat is listed.
        """
        beat = self.store.read_json(self.layout.heartbeat) or {}
        hint = int(beat.get("epoch", 0) or 0)
        if hint == 0 or not self.store.exists(self.layout.epoch(hint)):
            keys = self.store.list(self.layout.epochs)
            return int(keys[-1].rsplit("/", 1)[-1].split(".")[0]) if keys else 0
        while self.store.exists(self.layout.epoch(hint + 1)):
            hint += 1
        return hint

    def epoch_record(self, epoch: int) -> dict[str, Any] | None:
        return self.store.read_json(self.layout.epoch(epoch)) if epoch > 0 else None

    def acquire(self, *, takeover: bool = False) -> Lease:
        """Take the next epoch, fencing every earlier runner of the lineage.

        Raises:
            AlreadyRunningError: a live runner holds the lineage and `takeover` is False.
        """
        latest = self.latest_epoch()
        if not takeover:
            heartbeat = self.heartbeat()
            holder = self.epoch_record(latest)
            if runner_alive(heartbeat, holder, latest, time.time()):
                who = heartbeat if heartbeat and heartbeat.get("epoch") == latest else holder
                who = who or {}
                raise AlreadyRunningError(
                    f"job lineage {self.layout.lineage!r} is held by a live runner (pid "
                    f"{who.get('pid')} on {who.get('host')}, epoch {latest}); stop it first, "
                    "or pass --takeover to fence it"
                )
        epoch = latest + 1
        while True:
            lease = Lease.for_this_process(epoch)
            if self.store.create_json(self.layout.epoch(epoch), lease.to_json()):
                return lease
            taken = self.store.read_json(self.layout.epoch(epoch)) or {}
            if taken.get("token") == lease.token:
                return lease  # our own write, whose response was lost
            epoch += 1

    def check_not_fenced(self, lease: Lease) -> None:
        """Raise FencedError if a newer runner took the lineage (one HEAD request)."""
        if self.store.exists(self.layout.epoch(lease.epoch + 1)):
            newer = self.store.read_json(self.layout.epoch(lease.epoch + 1)) or {}
            raise FencedError(
                f"runner epoch {lease.epoch} of lineage {self.layout.lineage!r} is fenced by "
                f"epoch {lease.epoch + 1} (pid {newer.get('pid')} on {newer.get('host')}); "
                "this runner stops without committing"
            )

    # -- records a newer epoch owns ----------------------------------------------------

    def write_owned(
        self, key: str, lease: Lease, value: dict[str, Any], version: str | None = None
    ) -> str:
        """Write `value` (stamped with our epoch) unless the record belongs to a newer epoch.

        Compare-and-swap: an older runner can never overwrite what a newer one wrote.

        Args:
            version: the version we last wrote, if known (saves a read).

        Returns:
            The new version, for the next write.

        Raises:
            FencedError: the record holds a newer epoch.
        """
        value = {**value, "epoch": lease.epoch}
        while True:
            if version is None:
                current, version = self.store.read_versioned(key)
                self._refuse_newer(key, current, lease)
            written = self.store.write_if(key, value, version)
            if written is not None:
                return written
            version = None  # someone wrote in between: look again

    def _refuse_newer(self, key: str, current: dict[str, Any] | None, lease: Lease) -> None:
        holder = int((current or {}).get("epoch", 0) or 0)
        if holder > lease.epoch:
            raise FencedError(
                f"runner epoch {lease.epoch} of lineage {self.layout.lineage!r} is fenced: "
                f"{key} belongs to epoch {holder}; this runner stops without writing"
            )

    def heartbeat(self) -> dict[str, Any] | None:
        return self.store.read_json(self.layout.heartbeat)

    def job_record(self) -> dict[str, Any] | None:
        return self.store.read_json(self.layout.job_record)


class Fence:
    """The guard every side effect passes: raises FencedError once a newer epoch exists.

    Fencing is permanent, so once seen it is remembered and costs no more requests.
    """

    def __init__(self, control: ControlPlane, lease: Lease) -> None:
        self.control = control
        self.lease = lease
        self._fenced: FencedError | None = None

    @property
    def epoch(self) -> int:
        return self.lease.epoch

    @property
    def fenced(self) -> bool:
        return self._fenced is not None

    def check(self, through: ControlPlane | None = None) -> None:
        """Raise FencedError if this runner no longer owns the lineage.

        Args:
            through: the control plane asked (default the fence's own), e.g. one over a
                fail-fast store for a heartbeat's beat.
        """
        if self._fenced is not None:
            raise self._fenced
        try:
            (through or self.control).check_not_fenced(self.lease)
        except FencedError as error:
            self._fenced = error
            raise

    def mark_fenced(self, error: FencedError) -> None:
        """Another check (a table, a compare-and-swap) proved that we are fenced."""
        if self._fenced is None:
            self._fenced = error
