"""Named points where a test can inject a fault: a crash, a delay, an error.

The runtime calls `reached(point, **context)` at each point; production runs register
no handler, so a point costs one dictionary lookup. Tests register handlers directly
(`register`), or, in a driver process they start, name a module in
`STREAMKEEPER_INJECT` whose `install()` registers them (see `tests/support/faults.py`).
The crash points of the commit protocol are listed in `commit/crashpoints.py`.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

ENVIRONMENT_VARIABLE = "STREAMKEEPER_INJECT"

Handler = Callable[..., None]
_handlers: dict[str, list[Handler]] = {}
_loaded_from_environment = False


def register(point: str, handler: Handler) -> None:
    """Call `handler(**context)` every time `point` is reached."""
    _handlers.setdefault(point, []).append(handler)


def clear() -> None:
    """Forget every handler (the environment's module is installed again when asked)."""
    global _loaded_from_environment
    _handlers.clear()
    _loaded_from_environment = False


def reached(point: str, **context: Any) -> None:
    """The runtime reached `point`; run whatever a test registered there."""
    for handler in _handlers.get(point, ()):
        handler(**context)


def load_from_environment() -> None:
    """Import the module named by STREAMKEEPER_INJECT and call its `install()`, once per
    process (a driver calls it at start; an Airflow task that rolls back, at its first step).
    """
    global _loaded_from_environment
    module_name = os.environ.get(ENVIRONMENT_VARIABLE)
    if not module_name or _loaded_from_environment:
        return
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise RuntimeError(
            f"{ENVIRONMENT_VARIABLE}={module_name!r} cannot be imported ({error}); unset it, "
            "or put the module on PYTHONPATH"
        ) from None
    module.install()
    _loaded_from_environment = True
