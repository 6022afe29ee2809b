"""What starting a service needs besides its process: binaries, environment, port retries."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

from infra.components.process import LocalService, ServiceError


def find_executable(name: str) -> str:
    """Find ``name`` beside the running interpreter, else on ``PATH``.

    Raises:
        RuntimeError: If it is in neither place.
    """
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"executable {name!r} not found next to {sys.executable} or on PATH")
    return found


def base_env() -> dict[str, str]:
    """Return this process's environment with the interpreter's directory first on PATH."""
    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", "")])
    return env


class ServiceHandle(Protocol):
    """A handle on a running service that exposes its managed process."""

    @property
    def service(self) -> LocalService: ...


HandleT = TypeVar("HandleT", bound=ServiceHandle)


def start_with_port_retries(
    launch: Callable[[int], HandleT],
    probe: Callable[[HandleT], Callable[[], bool]],
    port: int | None,
    pick_port: Callable[[], int],
    timeout: float,
    attempts: int = 3,
) -> HandleT:
    """Launch a service on a port and wait until it is ready.

    A given ``port`` gets one attempt. Otherwise each attempt uses a port from
    ``pick_port``, and a process that exits before it is ready (e.g. it lost a
    race for the port) is retried up to ``attempts`` times in all; a timeout is
    not retried. A service that did not become ready is stopped.

    Args:
        launch: Starts the service on the given port and returns its handle.
        probe: Builds the readiness check for a handle.
        port: Fixed port, or ``None`` to pick one per attempt.
        pick_port: Picks a port to try.
        timeout: Seconds to wait for readiness, per attempt.
        attempts: Attempts when the port is picked.

    Returns:
        The handle of the ready service.

    Raises:
        ServiceError: If no attempt became ready (the last attempt's error).
    """
    last_error: ServiceError | None = None
    for _ in range(1 if port is not None else attempts):
        handle = launch(port if port is not None else pick_port())
        service = handle.service
        try:
            service.wait_until_ready(probe(handle), timeout=timeout)
        except ServiceError as exc:
            exited = not service.is_running()
            service.stop()
            if not exited:  # timed out: retrying would not help
                raise
            last_error = exc  # e.g. lost a race for a port: try other ports
        except BaseException:
            service.stop()
            raise
        else:
            return handle
    assert last_error is not None
    raise last_error
