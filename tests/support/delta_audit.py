"""An independent audit of a Delta table's transaction log (`_delta_log`), local or S3.

It reads the log itself (JSON commits, and the checkpoint Parquet where maintenance
expired the early log), not through delta-rs, so a bug the writer and delta-rs share
cannot hide. `audit_table(location)` returns the problems found, empty when clean:

- **versions contiguous**: no commit missing between the oldest and the newest; a log
  that no longer starts at 0 starts at a checkpoint (else the table cannot be read);
  `_last_checkpoint` names a checkpoint that exists; every checkpoint is whole.
- **every referenced file present**: each file of the newest version's snapshot exists.
- **no file added twice**: an `add` of a path the snapshot already holds, or of a path
  removed earlier by any commit but a `RESTORE` (which re-adds, by design, the files of
  the version it returns to); a `remove` of a path the snapshot does not hold.
- **app transactions monotonic**: per `appId`, the `txn` version never decreases from
  one table version to the next.
- **checkpoints agree with the log**: the files and app transactions a checkpoint holds
  are exactly those the replay of the commits up to it gives.

`known_files(location)` is every data path the readable log mentions (added or removed),
for finding files no version of the table ever referenced (orphans).
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from streamkeeper.storage import Location

LOG = "_delta_log"
_COMMIT = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10}))?\.parquet$")
_TEMPORARY = re.compile(r"(^_commit_|\.tmp$|^\.)")


@dataclass
class _Log:
    """What `_delta_log/` holds: commit versions, checkpoint parts, other entries."""

    commits: dict[int, str] = field(default_factory=dict)  # version -> key
    checkpoints: dict[int, list[str]] = field(default_factory=dict)  # version -> part keys
    parts_expected: dict[int, int] = field(default_factory=dict)
    last_checkpoint: str | None = None
    temporary: list[str] = field(default_factory=list)


@dataclass
class _Replay:
    """The snapshot as the replay stands: files (path -> version added), txns, removals."""

    active: dict[str, int] = field(default_factory=dict)
    removed: set[str] = field(default_factory=set)
    txns: dict[str, int] = field(default_factory=dict)
    mentioned: set[str] = field(default_factory=set)


def _as_location(location: Location | str | Path) -> Location:
    return location if isinstance(location, Location) else Location(str(location))


def _list_log(location: Location) -> _Log:
    found = _Log()
    for key in location.store().list(LOG):
        name = key.rsplit("/", 1)[-1]
        if key.count("/") != 1:
            continue  # e.g. _delta_log/_commits/: not used by this writer
        if match := _COMMIT.match(name):
            found.commits[int(match.group(1))] = key
        elif match := _CHECKPOINT.match(name):
            version = int(match.group(1))
            found.checkpoints.setdefault(version, []).append(key)
            if match.group(3):
                found.parts_expected[version] = int(match.group(3))
        elif name == "_last_checkpoint":
            found.last_checkpoint = key
        elif _TEMPORARY.search(name):
            found.temporary.append(key)
    return found


def _read_bytes(location: Location, key: str) -> bytes:
    filesystem = location.arrow_filesystem()
    with filesystem.open_input_stream(f"{location.fs_path}/{key}") as stream:
        return stream.read()


def _ranges(numbers: list[int]) -> str:
    """`[3, 4, 5, 9]` -> `3-5, 9`."""
    spans: list[list[int]] = []
    for n in sorted(numbers):
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _data_path(location: Location, path: str) -> str:
    """An add/remove path relative to the table (Delta paths are URL-encoded)."""
    decoded = unquote(path)
    if "://" in decoded or decoded.startswith("/"):
        prefix = location.uri.rstrip("/") + "/"
        return decoded[len(prefix) :] if decoded.startswith(prefix) else decoded
    return decoded


def _commit_actions(location: Location, key: str, version: int, problems: list[str]) -> list:
    actions = []
    for number, line in enumerate(_read_bytes(location, key).decode().splitlines(), 1):
        if not line.strip():
            continue
        try:
            actions.append(json.loads(line))
        except json.JSONDecodeError:
            problems.append(f"version {version}: line {number} of {key} is not JSON")
    return actions


def _checkpoint_state(location: Location, keys: list[str]) -> _Replay:
    """The files and app transactions a checkpoint holds."""
    import pyarrow.parquet as pq

    state = _Replay()
    for key in sorted(keys):
        table = pq.read_table(io.BytesIO(_read_bytes(location, key)))
        columns = set(table.column_names)
        for row in table.select([c for c in ("add", "remove", "txn") if c in columns]).to_pylist():
            if row.get("add"):
                path = _data_path(location, row["add"]["path"])
                state.active[path] = -1
                state.mentioned.add(path)
            if row.get("remove"):
                path = _data_path(location, row["remove"]["path"])
                state.removed.add(path)
                state.mentioned.add(path)
            if row.get("txn"):
                state.txns[row["txn"]["appId"]] = int(row["txn"]["version"])
    return state


def _apply(
    location: Location, replay: _Replay, version: int, actions: list, problems: list[str]
) -> None:
    """One commit: removes first, then adds (a commit never holds both for one path)."""
    operation = next((a["commitInfo"].get("operation") for a in actions if "commitInfo" in a), None)
    for action in actions:
        if "remove" in action:
            path = _data_path(location, action["remove"]["path"])
            replay.mentioned.add(path)
            if replay.active.pop(path, None) is None:
                problems.append(f"version {version} removes {path}, which the table does not hold")
            replay.removed.add(path)
    for action in actions:
        if "add" in action:
            path = _data_path(location, action["add"]["path"])
            replay.mentioned.add(path)
            if path in replay.active:
                since = replay.active[path]
                added = f"version {since}" if since >= 0 else "a checkpoint"
                problems.append(
                    f"version {version} adds {path} twice: the table holds it since {added}"
                )
            elif path in replay.removed and operation != "RESTORE":
                problems.append(
                    f"version {version} ({operation}) adds {path} again after it was removed"
                )
            replay.active[path] = version
        if "txn" in action:
            app, txn = action["txn"]["appId"], int(action["txn"]["version"])
            if txn < replay.txns.get(app, txn):
                problems.append(
                    f"version {version}: app transaction {app!r} goes back from "
                    f"{replay.txns[app]} to {txn}"
                )
            replay.txns[app] = max(txn, replay.txns.get(app, txn))


def _compare_checkpoint(version: int, replay: _Replay, checkpoint: _Replay) -> list[str]:
    problems = []
    only_checkpoint = sorted(set(checkpoint.active) - set(replay.active))
    only_replay = sorted(set(replay.active) - set(checkpoint.active))
    if only_checkpoint or only_replay:
        problems.append(
            f"checkpoint {version} disagrees with the commits before it: "
            f"{len(only_checkpoint)} file(s) only in the checkpoint {only_checkpoint[:3]}, "
            f"{len(only_replay)} only in the replay {only_replay[:3]}"
        )
    if checkpoint.txns != replay.txns:
        problems.append(
            f"checkpoint {version} holds app transactions {checkpoint.txns}, the commits "
            f"before it give {replay.txns}"
        )
    return problems


def _structure(log: _Log) -> list[str]:
    """Contiguity, whole checkpoints, `_last_checkpoint`, leftovers."""
    problems = []
    versions = sorted(log.commits)
    if not versions and not log.checkpoints:
        return ["the table has no Delta log (no commit, no checkpoint)"]
    for version, parts in sorted(log.checkpoints.items()):
        expected = log.parts_expected.get(version, 1)
        if len(parts) != expected:
            problems.append(f"checkpoint {version} has {len(parts)} of its {expected} parts")
    if versions:
        gaps = sorted(set(range(versions[0], versions[-1] + 1)) - set(versions))
        if gaps:
            problems.append(f"commit(s) missing from the log: version(s) {_ranges(gaps)}")
        lo = versions[0]
        if lo > 0 and not any(v >= lo - 1 for v in log.checkpoints):
            problems.append(
                f"the log starts at version {lo} with no checkpoint at {lo - 1} or later: the "
                "table cannot be read"
            )
        past = [v for v in log.checkpoints if v > versions[-1]]
        if past:
            problems.append(f"checkpoint(s) {_ranges(past)} past the newest commit {versions[-1]}")
    for key in log.temporary:
        problems.append(f"a temporary log entry was left behind: {key}")
    return problems


def _replay_start(log: _Log) -> int | None:
    """The checkpoint the replay starts from (None: from version 0)."""
    versions = sorted(log.commits)
    if versions and versions[0] == 0:
        return None
    lo = versions[0] if versions else 0
    usable = [v for v, parts in log.checkpoints.items() if v >= lo - 1 and parts]
    return min(usable) if usable else None


def _replay(location: Location, log: _Log, problems: list[str]) -> _Replay | None:
    start = _replay_start(log)
    versions = sorted(log.commits)
    if start is None and (not versions or versions[0] != 0):
        return None  # unreadable: reported by _structure
    replay = _checkpoint_state(location, log.checkpoints[start]) if start is not None else _Replay()
    first = -1 if start is None else start
    for version in [v for v in versions if v > first]:
        actions = _commit_actions(location, log.commits[version], version, problems)
        _apply(location, replay, version, actions, problems)
        if version in log.checkpoints and len(log.checkpoints[version]) == log.parts_expected.get(
            version, 1
        ):
            checkpoint = _checkpoint_state(location, log.checkpoints[version])
            problems += _compare_checkpoint(version, replay, checkpoint)
            replay.mentioned |= checkpoint.mentioned
    return replay


def _last_checkpoint(location: Location, log: _Log) -> list[str]:
    if log.last_checkpoint is None:
        return []
    try:
        pointer = json.loads(_read_bytes(location, log.last_checkpoint))
    except (json.JSONDecodeError, OSError) as error:
        return [f"_last_checkpoint cannot be read: {error}"]
    version = pointer.get("version")
    if version not in log.checkpoints:
        return [f"_last_checkpoint names checkpoint {version}, which does not exist"]
    return []


def audit_table(location: Location | str | Path) -> list[str]:
    """The problems of one Delta table's log (module doc); empty when it is clean."""
    location = _as_location(location)
    log = _list_log(location)
    problems = _structure(log)
    if not log.commits and not log.checkpoints:
        return problems
    problems += _last_checkpoint(location, log)
    replay = _replay(location, log, problems)
    if replay is None:
        return problems
    present = {k for k in location.store().list("") if not k.startswith(f"{LOG}/")}
    missing = sorted(p for p in replay.active if p not in present)
    newest = max([*log.commits, *log.checkpoints])
    for path in missing[:20]:
        problems.append(f"version {newest} references {path}, which does not exist")
    if len(missing) > 20:
        problems.append(f"... and {len(missing) - 20} more missing files")
    return problems


def known_files(location: Location | str | Path) -> set[str]:
    """Every data path (relative to the table) that the readable log adds or removes."""
    location = _as_location(location)
    log = _list_log(location)
    replay = _replay(location, log, [])
    return set() if replay is None else replay.mentioned | set(replay.active)


def snapshot_txns(location: Location | str | Path) -> dict[str, Any]:
    """The app transactions of the newest version, per appId (from the replay)."""
    location = _as_location(location)
    replay = _replay(location, _list_log(location), [])
    return {} if replay is None else dict(replay.txns)
