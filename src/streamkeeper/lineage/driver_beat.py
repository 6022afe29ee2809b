"""A launched driver's own beat, from its first instant until its runner's heartbeat.

A starter (an Airflow task, on any host) must know whether the driver it launched is
alive before the driver beats as the job: Spark's session, the plan and a savepoint's
restore take seconds to minutes, and no epoch or heartbeat exists yet. A pid says
nothing on another host (a gateway, a pod), and a hostname does not even tell hosts
apart (network namespaces, containers). So the driver says it itself, in the control
plane every host reads:

    drivers/{run token}.json   {"token", "job", "state", "time", "seq", "host", "pid", ...}

- `booting`: written at once, then every `BEAT_INTERVAL` seconds;
- `handed-over`: its runner took an epoch and beats the job's heartbeat, which is the
  driver's liveness from then on (`epoch` says which); the beat stops;
- `exited`: the process ended (`exit_code`, `error`), whenever it ends normally;

and `stale` is what a reader concludes when a booting beat is older than
`BEAT_STALE_AFTER` (a SIGKILL, a lost host). The key is the run token's alone: a start
knows its token before the driver exists, and an upgrade's green beats under it though
its launch is recorded under the shadow job. Host and pid are written for people
reading it, never used to decide anything.

A beat that cannot be written (storage down) is logged and retried at the next beat:
the driver's work never waits for it, and a reader that sees it stale concludes what a
lost host would make it conclude.

The driver's log reaches every host the same way: when its output goes to a file (the
launchers' `.streamkeeper/logs/*.log`, on whatever host it runs), the tail this process
wrote there (`LOG_TAIL_BYTES`) is shipped to `drivers/{token}.log.json` with each beat,
then every `LOG_INTERVAL` seconds while it grows, and once more at exit; the *Driver log*
link serves it when the file is on another host.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from streamkeeper.storage import ObjectStore

log = logging.getLogger(__name__)

BEAT_INTERVAL = 5.0
BEAT_STALE_AFTER = 30.0  # six missed beats: the runner heartbeat's staleness, too
LOG_INTERVAL = 30.0  # after the handover, the log is shipped this often while it grows
LOG_TAIL_BYTES = 256 * 1024
BeatState = Literal["booting", "handed-over", "exited"]


def beat_key(token: str) -> str:
    return f"drivers/{token}.json"


def log_key(token: str) -> str:
    return f"drivers/{token}.log.json"


def own_log_file() -> tuple[str, int] | None:
    """The file this process's stderr writes to and its size now, if it is a file (the
    launchers send a detached driver's output to one); None for a terminal or a pipe."""
    try:
        target = os.readlink("/proc/self/fd/2")
        return (target, os.path.getsize(target)) if os.path.isfile(target) else None
    except OSError:
        return None


@dataclass(frozen=True)
class BeatReading:
    """What a reader makes of a driver's beat at `now`."""

    state: Literal["none", "booting", "handed-over", "exited", "stale"]
    age: float | None  # seconds since the last beat (None: no beat)
    record: dict[str, Any]

    @property
    def ended(self) -> bool:
        return self.state in ("exited", "stale")

    def describe(self) -> str:
        where = f"on {self.record.get('host')}" if self.record.get("host") else ""
        if self.state == "exited":
            error = self.record.get("error")
            code = self.record.get("exit_code")
            return f"its driver exited {where} (exit {code}){': ' + error if error else ''}"
        if self.state == "stale":
            return (
                f"its driver stopped beating {self.age:.0f}s ago {where} while booting "
                "(killed, or its host was lost)"
            )
        if self.state == "none":
            return "its driver has not beaten yet"
        return f"its driver is {self.state} {where}"


def read_beat(record: dict[str, Any] | None, now: float) -> BeatReading:
    """Classify a beat record (`store.read_json(beat_key(token))`) at time `now`."""
    if not record:
        return BeatReading("none", None, {})
    age = max(0.0, now - float(record.get("time", 0.0)))
    state = record.get("state")
    if state == "booting" and age > BEAT_STALE_AFTER:
        return BeatReading("stale", age, record)
    if state in ("booting", "handed-over", "exited"):
        return BeatReading(state, age, record)
    return BeatReading("stale", age, record)  # an unknown state from a newer writer: ignore


class DriverBeat:
    """Beats `drivers/{token}.json` from a daemon thread until handed over or closed."""

    def __init__(
        self,
        store: ObjectStore,
        token: str,
        job: str,
        interval: float = BEAT_INTERVAL,
        log_interval: float = LOG_INTERVAL,
    ) -> None:
        self.store = store
        self.token = token
        self.job = job
        self.interval = interval
        self.log_interval = log_interval
        self.error: str | None = None  # the run's error, said when the process exits
        self._epoch: int | None = None  # the runner's, once handed over
        self._seq = 0
        self._lock = threading.Lock()
        self._handed = threading.Event()  # the runner's heartbeat speaks for the driver
        self._closed = threading.Event()
        self._started_at = time.time()
        self._log = own_log_file()  # (path, offset): this run's output starts at offset
        self._shipped = -1  # the log size last shipped
        self._thread = threading.Thread(target=self._run, name="streamkeeper-beat", daemon=True)

    def start(self) -> DriverBeat:
        """Beat from a thread, the first beat at once: the driver never waits for storage
        (an unreachable root is the runner's probe to report)."""
        self._thread.start()
        return self

    def hand_over(self, epoch: int) -> None:
        """The runner beats the job's heartbeat as `epoch` now: stop beating here."""
        if not self._handed.is_set():
            self._epoch = epoch
            self._handed.set()
            self._write("handed-over", epoch=epoch)

    def close(self, exit_code: int, error: str | None = None) -> None:
        """The process is ending: say how (the last word wins), with its last log lines."""
        self._handed.set()
        self._closed.set()
        error = (error or None) and error[-500:]
        self._write("exited", exit_code=exit_code, error=error, epoch=self._epoch)
        self._ship_log()

    def _run(self) -> None:
        self._write("booting")
        self._ship_log()
        while not self._closed.wait(self.log_interval if self._handed.is_set() else self.interval):
            self._write("booting")
            self._ship_log()

    def _ship_log(self) -> None:
        """Put the tail of this run's output in the control plane, if it grew."""
        if self._log is None:
            return
        path, offset = self._log
        with self._lock:
            try:
                size = os.path.getsize(path)
                if size == self._shipped:
                    return
                start = max(offset, size - LOG_TAIL_BYTES)
                with open(path, "rb") as log_file:
                    log_file.seek(start)
                    tail = log_file.read(size - start)
                record = {
                    "token": self.token,
                    "job": self.job,
                    "host": socket.gethostname(),
                    "path": path,
                    "time": time.time(),
                    "truncated": start > offset,
                    "text": tail.decode("utf-8", errors="replace"),
                }
                self.store.write_json(log_key(self.token), record)
                self._shipped = size
            except Exception as error:  # the next beat tries again
                log.warning("driver log not shipped (%s): %s", type(error).__name__, error)

    def _write(self, state: BeatState, **facts: Any) -> None:
        with self._lock:
            if state == "booting" and self._handed.is_set():
                return  # handed over or closed while this beat waited for the lock
            self._seq += 1
            record = {
                "token": self.token,
                "job": self.job,
                "state": state,
                "time": time.time(),
                "seq": self._seq,
                "started_at": self._started_at,
                "host": socket.gethostname(),  # for people; never used to decide
                "pid": os.getpid(),
                **facts,
            }
            try:
                self.store.write_json(beat_key(self.token), record)
            except Exception as error:  # storage down: the next beat tries again
                log.warning(
                    "driver beat %s not written (%s): %s", state, type(error).__name__, error
                )
