"""Canonical savepoints through the canonical-state package, `streamkeeper.state`.

The only place the savepoint lifecycle touches canonical state. The package is
imported lazily: without it, native savepoints work and a canonical one is refused
with a clear error. What is expected of it:

- `export_canonical(spark, checkpoint_dir, target, *, batch_id, uids, storage_options)`
  writes each stateful operator's state of batch `batch_id` as a Delta table per
  operator uid below the URI `target`, and returns its canonical manifest (a mapping
  or an object with `to_json()`) that names each uid's table;
- `restore_canonical(spark, source, checkpoint_dir, *, spec, uid_mapping,
  allow_non_restored_state, bootstrap_dir, storage_options)` writes that state into a
  fresh checkpoint directory for the job's (maybe changed) query; `bootstrap_dir`
  holds the savepoint's non-state checkpoint files (offsets, commits, sources);
- optionally `operator_uids(spec) -> {operator id: uid}` from the spec's `state:`.

Arguments a function does not declare are not passed, so either side may grow.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamkeeper.errors import SavepointError
from streamkeeper.spec import JobSpec
from streamkeeper.storage import Location

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)
PACKAGE = "streamkeeper.state"


def available() -> bool:
    """Whether the canonical-state package is installed."""
    try:
        _module()
    except SavepointError:
        return False
    return True


def _module() -> Any:
    try:
        return importlib.import_module(PACKAGE)
    except ImportError as error:
        raise SavepointError(
            f"canonical savepoints need the package {PACKAGE!r}, which is not available "
            f"({error}); take a native savepoint (--format native), or install a "
            "streamkeeper that includes canonical state"
        ) from None


def _function(name: str) -> Callable[..., Any]:
    module = _module()
    function = getattr(module, name, None)
    if function is None:
        raise SavepointError(
            f"{PACKAGE} has no {name}(); this streamkeeper's canonical state does not match "
            "its savepoints: take a native savepoint (--format native)"
        )
    return function


def _call(function: Callable[..., Any], *args: Any, **options: Any) -> Any:
    """Call with the keyword options the function declares (all if it takes **kwargs)."""
    parameters = inspect.signature(function).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        options = {k: v for k, v in options.items() if k in parameters}
    return function(*args, **options)


def operator_uids(spec: JobSpec) -> dict[int, str]:
    """The spec's operator uids by Spark operator id (empty without canonical state)."""
    try:
        function = getattr(_module(), "operator_uids", None)
    except SavepointError:
        return {}
    return {} if function is None else {int(k): str(v) for k, v in function(spec).items()}


def export_state(
    spark: SparkSession, checkpoint_dir: Path, target: Location, batch_id: int, uids: dict
) -> dict[str, Any]:
    """Export every operator's state of batch `batch_id` below `target`.

    Returns:
        `{"tables": {uid: path relative to the savepoint folder}, "manifest": ...}`.
    """
    exported = _call(
        _function("export_canonical"),
        spark,
        str(checkpoint_dir),
        target.uri,
        batch_id=batch_id,
        uids=uids,
        storage_options=target.storage_options(),
    )
    manifest = exported.to_json() if hasattr(exported, "to_json") else dict(exported or {})
    return {"tables": _tables(manifest, target), "manifest": manifest}


def _tables(manifest: dict[str, Any], target: Location) -> dict[str, str]:
    """uid -> table folder relative to the savepoint's folder (`state/{...}`)."""
    folder = target.uri.rstrip("/").rsplit("/", 1)[-1]
    named = manifest.get("tables") or {
        str(op.get("uid")): op.get("table") or op.get("path")
        for op in manifest.get("operators", [])
        if isinstance(op, dict) and op.get("uid")
    }
    if not named:  # the manifest does not say: one table folder per uid
        store = target.store()
        named = {name: name for name in store.children("")}
    prefix = target.uri.rstrip("/") + "/"
    return {
        uid: f"{folder}/{str(path).removeprefix(prefix).strip('/')}"
        for uid, path in named.items()
        if path
    }


def restore_state(
    spark: SparkSession,
    spec: JobSpec,
    source: Location,
    checkpoint_dir: Path,
    *,
    uid_mapping: dict[str, str],
    allow_non_restored_state: bool,
    bootstrap_dir: Path,
) -> None:
    """Write a canonical savepoint's state into the fresh `checkpoint_dir`."""
    _call(
        _function("restore_canonical"),
        spark,
        source.uri,
        str(checkpoint_dir),
        spec=spec,
        uid_mapping=dict(uid_mapping),
        allow_non_restored_state=allow_non_restored_state,
        bootstrap_dir=str(bootstrap_dir),
        storage_options=source.storage_options(),
    )
