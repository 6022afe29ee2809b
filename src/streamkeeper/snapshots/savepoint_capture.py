"""What a savepoint captures of a checkpoint directory, and the self-contained copy.

The savepoint is taken at a batch boundary after batch N committed (see PROTOCOL.md,
"Savepoints"). Spark may have planned batch N+1 already (`offsets/N+1`); no state of
it was written (the batch boundary is held). The capture is checkpoint N exactly:
offsets and commits up to N, state versions up to N+1 (batch N writes version N+1).
The file source's log (`sources/{i}/{n}`, `{n}.compact`) is cut too: an entry for
N+1 written while Spark planned it would make the restored query's first batch read N+1's
files and the next ones together, so its output would be batched unlike the original's
(a change log appended per batch would differ, and blue-green validation with it). It is
cut at the source's own log offset in offsets/N, not at N: the log numbers its entries
apart from the batches (a run killed after logging an entry, before planning its batch,
leaves the log ahead), and a restored query reads entry `logOffset` to resume.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from streamkeeper.errors import SavepointError
from streamkeeper.snapshots import savepoint_points
from streamkeeper.snapshots.manifest import WORKERS, CheckpointFile, FileTransfer, LocalFile
from streamkeeper.snapshots.savepoint_manifest import SELF_CONTAINED_FOLDER
from streamkeeper.spec import JobSpec
from streamkeeper.state.positions import file_log_offset
from streamkeeper.storage import ObjectStore

log = logging.getLogger(__name__)

_VERSION = re.compile(r"^\.?(\d+)")  # 12.delta, .12.delta.crc, 12_uuid.zip, 12


def _number(name: str) -> int | None:
    match = _VERSION.match(name)
    return int(match.group(1)) if match else None


def in_savepoint(path: str, batch_id: int, source_logs: Mapping[str, int] | None = None) -> bool:
    """Whether a checkpoint file belongs to checkpoint `batch_id` (nothing planned after it).

    Args:
        source_logs: each file source's log offset in offsets/N, by source index (see
            `source_log_offsets`); a source not in it is cut at `batch_id`.
    """
    parts = path.split("/")
    number = _number(parts[-1])
    if parts[0] in ("offsets", "commits") and len(parts) == 2 and number is not None:
        return number <= batch_id
    if parts[0] == "sources" and len(parts) == 3 and number is not None:
        # sources/{source}/{entry}[.compact]
        return number <= (source_logs or {}).get(parts[1], batch_id)
    if parts[0] == "state" and len(parts) == 4 and number is not None:
        return number <= batch_id + 1  # state/{op}/{partition}/{version}.*
    return True


def savepoint_view(
    files: list[CheckpointFile], batch_id: int, source_logs: Mapping[str, int] | None = None
) -> list[CheckpointFile]:
    """The files of checkpoint `batch_id` among a captured checkpoint's files."""
    return [f for f in files if in_savepoint(f.path, batch_id, source_logs)]


def source_log_offsets(directory: Path, batch_id: int) -> dict[str, int]:
    """Each file source's log offset in offsets/N, by source index ("0", "1", ...).

    Raises:
        SavepointError: offsets/N is missing or unreadable.
    """
    offsets, _ = source_offsets(directory, batch_id)
    found = {}
    for index, offset in enumerate(offsets):
        log_offset = file_log_offset(None if offset is None else json.dumps(offset))
        if log_offset is not None:
            found[str(index)] = log_offset
    return found


def source_offsets(directory: Path, batch_id: int) -> tuple[list[Any], dict[str, Any]]:
    """Each source's offset and the batch metadata, as Spark recorded them in offsets/N.

    Raises:
        SavepointError: offsets/N is missing or unreadable.
    """
    path = directory / "offsets" / str(batch_id)
    try:
        lines = path.read_text().splitlines()
        metadata = json.loads(lines[1])
        return [None if line == "-" else json.loads(line) for line in lines[2:]], metadata
    except (FileNotFoundError, IndexError, ValueError) as error:
        raise SavepointError(
            f"cannot read the source offsets of batch {batch_id} from {str(path)!r} "
            f"({type(error).__name__}: {error}); the checkpoint directory is damaged"
        ) from None


def spec_hash(spec: JobSpec) -> str:
    """A fingerprint of the spec as loaded (with overrides), for the manifest."""
    text = json.dumps(spec.model_dump(mode="json", by_alias=True), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def code_version(spec: JobSpec, spec_dir: Path) -> str:
    """sha256 of the transform's source file ('unknown' if it has no file)."""
    import importlib.util

    module_ref = spec.transform.split(":")[0]
    if module_ref.endswith(".py"):
        path: Path | None = (spec_dir / module_ref).resolve()
    else:
        found = importlib.util.find_spec(module_ref)
        path = Path(found.origin) if found is not None and found.origin else None
    if path is None or not path.is_file():
        return "unknown"
    return hashlib.sha256(path.read_bytes()).hexdigest()


class SelfContainedCopy:
    """Copies captured files into a savepoint's own folder (`checkpoint/{path}`).

    A file the checkpoint store already holds is copied from there (server-side on
    S3); any other is uploaded from the local checkpoint directory and hashed on the
    way. Concurrent, as the checkpoint upload is.
    """

    def __init__(self, store: ObjectStore, directory: Path, folder: str) -> None:
        self.transfer = FileTransfer(store)
        self.directory = directory
        self.folder = folder  # the savepoint's folder key

    def copy(
        self,
        stored: list[CheckpointFile],
        local: list[LocalFile],
        progress: Callable[[], None] | None = None,
    ) -> list[CheckpointFile]:
        """Copy `stored` (known sha256 and key) and `local` files; returns their entries.

        A local file Spark's maintenance deleted meanwhile is left out: Spark deletes
        only what no retained state version needs, and N+1 is the newest.

        Raises:
            SavepointError: a local file changed while copied (Spark never rewrites one).
        """
        jobs: list[Callable[[], CheckpointFile | None]] = [
            lambda f=f: self._from_store(f) for f in stored
        ] + [lambda f=f: self._from_disk(f) for f in local]

        def run(job: Callable[[], CheckpointFile | None]) -> CheckpointFile | None:
            copied = job()
            savepoint_points.reached("savepoint_during_copy")
            if progress is not None:
                progress()
            return copied

        with ThreadPoolExecutor(max_workers=WORKERS) as pool:
            return [f for f in pool.map(run, jobs) if f is not None]

    def _target(self, path: str) -> tuple[str, str]:
        relative = f"{SELF_CONTAINED_FOLDER}/{path}"
        return relative, f"{self.folder}/{relative}"

    def _from_store(self, file: CheckpointFile) -> CheckpointFile:
        relative, key = self._target(file.path)
        self.transfer.copy(file.key, key, file.size)
        return CheckpointFile(file.path, file.size, file.mtime_ns, file.sha256, relative)

    def _from_disk(self, file: LocalFile) -> CheckpointFile | None:
        relative, key = self._target(file.path)
        try:
            size, sha = self.transfer.put_hashed(self.directory / file.path, key)
        except FileNotFoundError:
            log.debug("%s deleted by Spark's maintenance; not needed by the savepoint", file.path)
            return None
        after = LocalFile.stat(self.directory, file.path)  # None: deleted after the copy
        if size != file.size or (after is not None and after != file):
            raise SavepointError(
                f"checkpoint file {file.path!r} changed while the savepoint copied it; "
                "take the savepoint again"
            )
        return CheckpointFile(file.path, size, file.mtime_ns, sha, relative)
