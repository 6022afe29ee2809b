"""Process management shared by the local services: ports, binaries, process groups."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

HOST = "127.0.0.1"
"""The only address any service binds to."""

INFRA_DIR_ENV = "STREAMKEEPER_INFRA_DIR"
"""Environment variable overriding the location of the infra scripts."""

_LOG_TAIL_CHARS = 4000


class ServiceError(RuntimeError):
    """A local service failed to start or exited early."""


def infra_dir() -> Path:
    """Return the directory holding the service start scripts.

    Returns:
        ``$STREAMKEEPER_INFRA_DIR`` if set, else ``<repo>/infra``.
    """
    override = os.environ.get(INFRA_DIR_ENV)
    if override:
        return Path(override)
    # This file is <repo>/infra/components/process.py.
    return Path(__file__).resolve().parents[1]


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago.

    Returns:
        A port number chosen by the kernel (bind to port 0).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def tcp_connects(port: int, timeout: float = 0.5) -> bool:
    """Return whether a TCP connection to ``port`` on 127.0.0.1 succeeds."""
    try:
        with socket.create_connection((HOST, port), timeout=timeout):
            return True
    except OSError:
        return False


class Stoppable:
    """Context-manager support: ``with`` calls ``stop()`` on exit."""

    def stop(self, grace: float = 15.0) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class LocalService(Stoppable):
    """One service process started from an infra script, in its own session.

    Args:
        name: Human-readable name used in messages.
        argv: Command line; ``argv[0]`` is usually an infra script.
        log_path: File receiving the process's stdout and stderr (appended).
        env: Environment of the process (default: this process's).
        cwd: Working directory of the process.

    Attributes:
        process: The ``Popen`` object once started, else ``None``.
        ready_seconds: Seconds from start until ``wait_until_ready`` succeeded.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = [str(a) for a in argv]
        self.log_path = Path(log_path)
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.process: subprocess.Popen[bytes] | None = None
        self.ready_seconds: float | None = None
        self._pgid: int | None = None
        self._started_at = 0.0

    def start(self) -> Self:
        """Start the process in a new session (and so a new process group).

        Returns:
            ``self``, for chaining.

        Raises:
            RuntimeError: If the service was already started.
        """
        if self.process is not None:
            raise RuntimeError(f"{self.name} already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        # start_new_session makes the child a session and group leader.
        self._pgid = self.process.pid
        self._started_at = time.monotonic()
        return self

    @property
    def pid(self) -> int | None:
        """Process id of the started process, or ``None`` before start."""
        return self.process.pid if self.process is not None else None

    def is_running(self) -> bool:
        """Return whether the started process is still alive."""
        return self.process is not None and self.process.poll() is None

    def log_tail(self, max_chars: int = _LOG_TAIL_CHARS) -> str:
        """Return the last ``max_chars`` characters of the log file, or ``""``."""
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-max_chars:].decode("utf-8", errors="replace")

    def failure(self, what: str) -> ServiceError:
        """Build (not raise) an error naming this service's log, with its tail.

        Args:
            what: What went wrong, e.g. ``"exited with code 1"``.
        """
        return ServiceError(
            f"{self.name} {what}; log file: {self.log_path}\n"
            f"--- last lines of {self.log_path} ---\n{self.log_tail()}"
        )

    def wait_until_ready(
        self,
        check: Callable[[], bool],
        timeout: float = 60.0,
        interval: float = 0.2,
    ) -> float:
        """Poll ``check`` until it returns true.

        Exceptions from ``check`` mean "not ready yet", except ``ServiceError``,
        which is raised at once (e.g. a companion process died).

        Args:
            check: Readiness probe.
            timeout: Seconds to wait, counted from the call.
            interval: Seconds between probes.

        Returns:
            Seconds from the start of the process until it was ready.

        Raises:
            ServiceError: If the process exits or ``timeout`` passes first.
        """
        if self.process is None:
            raise RuntimeError(f"{self.name} was not started")
        deadline = time.monotonic() + timeout
        while True:
            try:
                ok = bool(check())
            except ServiceError:
                raise
            except Exception:  # any probe error means "not ready yet"
                ok = False
            if ok:
                self.ready_seconds = time.monotonic() - self._started_at
                return self.ready_seconds
            code = self.process.poll()
            if code is not None:
                raise self.failure(f"exited with code {code} before it was ready")
            if time.monotonic() >= deadline:
                raise self.failure(f"was not ready within {timeout:.0f}s")
            time.sleep(interval)

    def stop(self, grace: float = 15.0) -> None:
        """Stop the process group started by ``start``; safe to call twice.

        SIGTERM to the group, up to ``grace`` seconds for the process to exit,
        then SIGKILL to the group. The group id is the started process's pid,
        which the kernel does not reuse while any group member lives.

        Args:
            grace: Seconds to wait between SIGTERM and SIGKILL.
        """
        if self.process is None or self._pgid is None:
            return
        pgid = self._pgid
        self._signal_group(pgid, signal.SIGTERM)
        try:
            self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        # Whatever is left of our group (the leader or its children) is killed.
        self._signal_group(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5.0)
        self._pgid = None

    @staticmethod
    def _signal_group(pgid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)

    def __repr__(self) -> str:
        return f"LocalService(name={self.name!r}, pid={self.pid}, log={self.log_path})"
