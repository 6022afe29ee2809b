"""The control plane on object storage: runner registry, heartbeats and fencing epochs.

Any process that can read the storage root (an Airflow worker, a CLI) can see which
runner holds a lineage, whether it is alive, and what it last committed.

Fencing: every runner start takes the next epoch with a put-if-absent. A runner is
fenced as soon as a higher epoch exists; it checks before each commit, and every
Delta commit also carries its epoch (see delta_tables.py), so a runner that raced
past the check still loses on the table.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil

from streamkeeper.errors import AlreadyRunningError, FencedError
from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.storage import ObjectStore

STALE_AFTER_SECONDS = 30.0


@dataclass(frozen=True)
class Lease:
    """This runner's hold on a lineage."""

    epoch: int
    pid: int
    host: str
    started_at: float


def _holder_alive(heartbeat: dict[str, Any] | None, now: float) -> bool:
    if not heartbeat or heartbeat.get("state") in ("STOPPED", "FAILED", "FINISHED"):
        return False
    if heartbeat.get("host") == socket.gethostname():
        return psutil.pid_exists(int(heartbeat.get("pid", -1)))
    return now - float(heartbeat.get("time", 0)) < STALE_AFTER_SECONDS


class ControlPlane:
    """Reads and writes one job lineage's control-plane objects."""

    def __init__(self, store: ObjectStore, layout: LineageLayout) -> None:
        self.store = store
        self.layout = layout

    def latest_epoch(self) -> int:
        keys = self.store.list(self.layout.epochs)
        return int(keys[-1].rsplit("/", 1)[-1].split(".")[0]) if keys else 0

    def acquire(self, *, takeover: bool = False) -> Lease:
        """Take the next epoch, fencing every earlier runner of the lineage.

        Raises:
            AlreadyRunningError: a live runner holds the lineage and `takeover` is False.
        """
        heartbeat = self.store.read_json(self.layout.heartbeat)
        if not takeover and _holder_alive(heartbeat, time.time()):
            assert heartbeat is not None
            raise AlreadyRunningError(
                f"job lineage {self.layout.lineage!r} is held by a live runner (pid "
                f"{heartbeat.get('pid')} on {heartbeat.get('host')}, epoch "
                f"{heartbeat.get('epoch')}); stop it first, or pass --takeover to fence it"
            )
        while True:
            epoch = self.latest_epoch() + 1
            lease = Lease(epoch, os.getpid(), socket.gethostname(), time.time())
            if self.store.create_json(self.layout.epoch(epoch), lease.__dict__):
                self.store.write_json(
                    self.layout.runner, {**lease.__dict__, "job": self.layout.job}
                )
                return lease

    def check_not_fenced(self, lease: Lease) -> None:
        """Raise FencedError if a newer runner took the lineage (one HEAD request)."""
        if self.store.exists(self.layout.epoch(lease.epoch + 1)):
            newer = self.store.read_json(self.layout.epoch(lease.epoch + 1)) or {}
            raise FencedError(
                f"runner epoch {lease.epoch} of lineage {self.layout.lineage!r} is fenced by "
                f"epoch {lease.epoch + 1} (pid {newer.get('pid')} on {newer.get('host')}); "
                "this runner stops without committing"
            )

    def beat(self, lease: Lease, state: str, **facts: Any) -> None:
        self.store.write_json(
            self.layout.heartbeat,
            {
                "job": self.layout.job,
                "lineage": self.layout.lineage,
                "epoch": lease.epoch,
                "pid": lease.pid,
                "host": lease.host,
                "state": state,
                "time": time.time(),
                **facts,
            },
        )

    def heartbeat(self) -> dict[str, Any] | None:
        return self.store.read_json(self.layout.heartbeat)


class Heartbeat:
    """A daemon thread that beats every `interval` seconds with facts from `facts()`."""

    def __init__(
        self,
        control: ControlPlane,
        lease: Lease,
        facts: Callable[[], dict[str, Any]],
        interval: float = 2.0,
    ) -> None:
        self.control = control
        self.lease = lease
        self.facts = facts
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="streamkeeper-heartbeat", daemon=True
        )

    def start(self) -> None:
        self.control.beat(self.lease, "STARTING", **self.facts())
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.control.beat(self.lease, "RUNNING", **self.facts())
            except Exception:  # noqa: BLE001 - a missed beat must not kill the job
                continue

    def stop(self, final_state: str, **facts: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval + 1)
        self.control.beat(self.lease, final_state, **{**self.facts(), **facts})
