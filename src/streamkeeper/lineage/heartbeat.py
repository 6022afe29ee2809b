"""The runner's heartbeat: a daemon thread that publishes its state every few seconds.

The heartbeat record (`jobs/{job}/heartbeat.json`) is written by compare-and-swap and
carries the epoch: a runner whose write meets a newer epoch's heartbeat learns it is
fenced, stops beating and tells the runner (`on_fenced`), which stops its query. A
fenced runner never writes its final state either, so it can never make a newer,
running owner look stopped.

The periodic beats go through a store that gives up in seconds (`beats`): a beat sent
into a storage outage would otherwise wait out the patient store's 30 s read timeout and
its retries, so the heartbeat would stay silent for up to that long *after* storage came
back, and readers would presume the running driver dead (`heartbeat lost`). A missed beat
costs nothing: the next one follows an interval later. The first and the final beats go
through the patient store: they are written once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from streamkeeper.errors import FencedError
from streamkeeper.lineage.control import ControlPlane, Fence

log = logging.getLogger(__name__)


class Heartbeat:
    """Beats every `interval` seconds with facts from `facts()`."""

    def __init__(
        self,
        control: ControlPlane,
        fence: Fence,
        facts: Callable[[], dict[str, Any]],
        interval: float = 2.0,
        on_fenced: Callable[[FencedError], None] | None = None,
        beats: Callable[[], ControlPlane] | None = None,
    ) -> None:
        """
        Args:
            beats: builds the control plane the periodic beats go through (one over a
                fail-fast store), in the heartbeat's thread: a start does not wait for its
                client. Default: `control`.
        """
        self.control = control
        self._beats = beats
        self.fence = fence
        self.facts = facts
        self.interval = interval
        self.on_fenced = on_fenced
        self._missed_since: float | None = None  # when the current run of missed beats began
        self._version: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="streamkeeper-heartbeat", daemon=True
        )

    def beat(self, state: str, *, control: ControlPlane | None = None, **facts: Any) -> None:
        """Write one heartbeat now (through `control`, default the patient one).

        Raises:
            FencedError: a newer runner owns the lineage (checked before writing, and by
                the compare-and-swap).
        """
        lease = self.fence.lease
        record = {
            "job": self.control.layout.job,
            "lineage": self.control.layout.lineage,
            "pid": lease.pid,
            "host": lease.host,
            "process_started_at": lease.process_started_at,
            "pid_namespace": lease.pid_namespace,
            "state": state,
            "time": time.time(),
            **facts,
        }
        with self._lock:
            self.fence.check(through=control)
            try:
                self._version = (control or self.control).write_owned(
                    self.control.layout.heartbeat, lease, record, self._version
                )
            except FencedError as error:
                self.fence.mark_fenced(error)
                raise

    def start(self) -> None:
        self.beat("STARTING", **self.facts())
        self._thread.start()

    def _run(self) -> None:
        beats = self._beats_control()
        while not self._stop.wait(self.interval):
            try:
                self.beat("RUNNING", control=beats, **self.facts())
            except FencedError as error:
                log.error("%s", error)
                if self.on_fenced is not None:
                    self.on_fenced(error)
                return
            except Exception:  # noqa: BLE001 - a missed beat must not kill the job
                self._missed()
            else:
                self._written()

    def _beats_control(self) -> ControlPlane:
        if self._beats is None:
            return self.control
        try:
            return self._beats()
        except Exception:  # noqa: BLE001 - the patient store beats as well, only later
            log.warning("no fail-fast store for the heartbeat; beating through the patient one")
            return self.control

    def _missed(self) -> None:
        """Warn once per outage (with its cause); the beats go on every interval."""
        if self._missed_since is None:
            self._missed_since = time.monotonic()
            log.warning("heartbeat not written; retrying every %gs", self.interval, exc_info=True)
        else:
            log.debug("heartbeat still not written", exc_info=True)

    def _written(self) -> None:
        if self._missed_since is not None:
            log.warning(
                "heartbeat written again after %.1fs without", time.monotonic() - self._missed_since
            )
            self._missed_since = None

    def stop(self, final_state: str, **facts: Any) -> None:
        """Stop beating and record the final state, unless this runner is fenced."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval + 1)
        try:
            self.beat(final_state, **{**self.facts(), **facts})
        except FencedError:
            log.warning("fenced: final state %s not recorded (a newer runner owns it)", final_state)
