"""The bad-input corpus's hostile-storage section: objects planted under the storage root.

Whoever may write objects under the root (another job's transform runs with its
credentials) is less trusted than the operator. Each case plants a manifest, an index
entry, a registry entry or a job record whose path, key or id reaches outside its folder,
then feeds the surface that reads it (a restore from the latest checkpoint as the
operations page and the monitor's restart run it, a savepoint restore or delete, a
status). Each is refused before any side effect: the case folder's listing (the root, the
checkpoint directory, and the folder around them, which stands for the driver host's
files) is unchanged, and the message names the planted value and says what to do.

Imported by tests/reliability/test_bad_input_corpus.py after its helpers are defined.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from tests.reliability.test_bad_input_corpus import (
    ESCAPE,
    JOB,
    MANIFEST,
    Case,
    Ctx,
    cli,
    rewrite_manifest,
    run,
)

PLANTED = "not written by streamkeeper"
CHECKPOINT_ID = 99  # above any seq the world committed: no rewind question first


def _lineage(ctx: Ctx) -> Any:
    return ctx.root / "lineages" / JOB


def planted_checkpoint(path: str = "metadata", key: str | None = None) -> Callable[[Ctx], None]:
    """An externalized checkpoint (manifest and index entry) listing one file at `path`
    with storage key `key` (default: a stored object of the right sha256): only the path
    or the key is bad, so an unchecked restore would write or read it."""

    def prepare(ctx: Ctx) -> None:
        body = b"planted by a hostile writer\n"
        sha = hashlib.sha256(body).hexdigest()
        stored = f"lineages/{JOB}/checkpoints/files/{sha}.e1"
        (ctx.root / stored).parent.mkdir(parents=True, exist_ok=True)
        (ctx.root / stored).write_bytes(body)
        file = {"size": len(body), "mtime_ns": 0, "sha256": sha}
        files = [{"path": ctx.fmt(path), "key": ctx.fmt(key or stored), **file}]
        manifest = {
            "lineage": JOB,
            "checkpoint_id": CHECKPOINT_ID,
            "query_id": "planted",
            "batch_id": 0,
            "files": files,
            "format": 1,
        }
        folder = _lineage(ctx) / "checkpoints"
        (folder / "manifests").mkdir(parents=True, exist_ok=True)
        (folder / "manifests" / f"{CHECKPOINT_ID:020d}.json").write_text(json.dumps(manifest))
        _write_index(ctx, [{"id": CHECKPOINT_ID, "batch_id": 0, "epoch": 1}])

    return prepare


def _write_index(ctx: Ctx, entries: list[dict[str, Any]], pins: dict | None = None) -> None:
    path = _lineage(ctx) / "checkpoints" / "index.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    index = {"owner_epoch": 1, "checkpoints": entries, "pins": pins or {}, "format": 1}
    path.write_text(json.dumps(index))


def index_entry(entry_id: object, pins: dict | None = None) -> Callable[[Ctx], None]:
    return lambda ctx: _write_index(ctx, [{"id": entry_id, "batch_id": 0, "epoch": 1}], pins)


def registry_id(new_id: str) -> Callable[[Ctx], None]:
    """The registry's entry of the native savepoint renamed to `new_id`."""

    def prepare(ctx: Ctx) -> None:
        path = _lineage(ctx) / "savepoints" / "registry.json"
        registry = json.loads(path.read_text())
        for entry in registry["savepoints"]:
            if entry["id"] == ctx.names["native"]:
                entry["id"] = new_id
        path.write_text(json.dumps(registry))

    return prepare


def job_record_lineage(lineage: str) -> Callable[[Ctx], None]:
    def prepare(ctx: Ctx) -> None:
        path = ctx.root / "jobs" / JOB / "job.json"
        record = json.loads(path.read_text())
        record["lineage"] = lineage
        path.write_text(json.dumps(record))

    return prepare


def _first_file(field: str, value: str) -> Callable[[dict[str, Any]], None]:
    def change(manifest: dict[str, Any]) -> None:
        manifest["files"][0][field] = value

    return change


def _state_table(value: str) -> Callable[[dict[str, Any]], None]:
    def change(manifest: dict[str, Any]) -> None:
        manifest["operators"][0]["table"] = value

    return change


def _source_log_name(name: str) -> Callable[[dict[str, Any]], None]:
    def change(manifest: dict[str, Any]) -> None:
        log = ((manifest.get("source") or {}).get("log") or {}).setdefault("0", {})
        log.setdefault("files", {})[name] = "v1\n"
        manifest.setdefault("source", {})["log"] = {"0": log}

    return change


LATEST = run("--from-checkpoint", "latest")

HOSTILE_STORAGE_CASES: list[Case] = [
    # -- a planted checkpoint manifest, restored as a restart from the latest checkpoint ------
    Case(
        "planted-checkpoint-absolute-path",
        MANIFEST,
        LATEST,
        "exit 2",
        ("'{base}/planted'", "is absolute", PLANTED, f"{CHECKPOINT_ID:020d}.json"),
        prepare=planted_checkpoint(path="{base}/planted"),
    ),
    Case(
        "planted-checkpoint-dotdot-path",
        MANIFEST,
        LATEST,
        "exit 2",
        ("'../../../planted'", "climbs out with '..'", PLANTED),
        prepare=planted_checkpoint(path="../../../planted"),
    ),
    Case(
        "planted-checkpoint-key-outside-its-folder",
        MANIFEST,
        LATEST,
        "exit 2",
        (f"'jobs/{JOB}/job.json'", "lies elsewhere", f"lineages/{JOB}/checkpoints/files"),
        prepare=planted_checkpoint(key=f"jobs/{JOB}/job.json"),
    ),
    Case(
        "planted-checkpoint-key-with-dotdot",
        MANIFEST,
        LATEST,
        "exit 2",
        (f"'lineages/{JOB}/checkpoints/files/../../../../../../x'", "climbs out", PLANTED),
        prepare=planted_checkpoint(key=f"lineages/{JOB}/checkpoints/files/../../../../../../x"),
    ),
    Case(
        "index-entry-naming-a-path",
        ESCAPE,
        LATEST,
        "exit 2",
        ("'../../../jobs/keyed-totals/job'", "is not a checkpoint id", "index.json"),
        prepare=index_entry("../../../jobs/keyed-totals/job"),
    ),
    Case(
        "index-pin-naming-a-path",
        ESCAPE,
        LATEST,
        "exit 2",
        ("'../registry'", "is not a savepoint id", "index.json", PLANTED),
        prepare=index_entry(CHECKPOINT_ID, pins={"../registry": CHECKPOINT_ID}),
    ),
    # -- planted savepoint manifests -----------------------------------------------------------
    Case(
        "planted-savepoint-manifest-path",
        MANIFEST,
        run("--from-savepoint", "{native}"),
        "exit 2",
        ("'../../../../planted'", "climbs out with '..'", "restore another savepoint"),
        prepare=rewrite_manifest("native", _first_file("path", "../../../../planted")),
    ),
    Case(
        "planted-savepoint-manifest-key",
        MANIFEST,
        run("--from-savepoint", "{native}"),
        "exit 2",
        (f"'lineages/{JOB}/savepoints/registry.json'", "lies elsewhere", "'checkpoint'"),
        prepare=rewrite_manifest(
            "native", _first_file("key", f"lineages/{JOB}/savepoints/registry.json")
        ),
    ),
    Case(
        "planted-canonical-state-table",
        MANIFEST,
        run("--from-savepoint", "{canonical}"),
        "exit 2",
        ("'../../../../tables/totals'", "state table", "restore another savepoint"),
        prepare=rewrite_manifest("canonical", _state_table("../../../../tables/totals")),
    ),
    Case(
        "planted-canonical-source-log-name",
        MANIFEST,
        run("--from-savepoint", "{canonical}"),
        "exit 2",
        ("'../../../../planted'", "source log file", "restore another savepoint"),
        prepare=rewrite_manifest("canonical", _source_log_name("../../../../planted")),
    ),
    # -- registry entries and job records: ids and names checked as they were written ----------
    Case(
        "registry-entry-with-an-empty-id",
        ESCAPE,
        cli("savepoints", "delete", "{canonical}", "--root", "{root}"),
        "exit 2",
        ("savepoint ''", "is not a savepoint id", "registry.json", PLANTED),
        prepare=registry_id(""),
    ),
    Case(
        "registry-entry-climbing-out",
        ESCAPE,
        cli("savepoints", "delete", "{canonical}", "--root", "{root}"),
        "exit 2",
        ("'../../../jobs'", "is not a savepoint id", "registry.json"),
        prepare=registry_id("../../../jobs"),
    ),
    Case(
        "job-record-lineage-climbing-out",
        ESCAPE,
        cli("status", JOB, "--root", "{root}"),
        "exit 2",
        ("'../../jobs'", "is not a lineage name", f"jobs/{JOB}/job.json"),
        prepare=job_record_lineage("../../jobs"),
    ),
]

# Those whose planted object meets the object store itself: again on S3 (SeaweedFS has no
# `..` of its own; the S3 store refuses such keys as the local one does).
HOSTILE_STORAGE_ON_S3 = {
    "planted-checkpoint-dotdot-path",
    "planted-checkpoint-key-with-dotdot",
    "planted-checkpoint-key-outside-its-folder",
    "index-entry-naming-a-path",
    "planted-savepoint-manifest-key",
    "registry-entry-with-an-empty-id",
    "job-record-lineage-climbing-out",
}
