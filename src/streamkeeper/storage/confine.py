"""Confinement: a path, key or id read back from storage stays below its own folder.

Whoever may write objects under the storage root (another job's transform runs with the
root's credentials) is less trusted than the operator: a manifest, an index, a registry
entry or a job record can be planted. Every path or key taken from one is checked here
before it is joined to a folder, so that nothing is written, read or deleted outside it:
no absolute path, no `..` or `.` segment, no empty segment, no backslash, no NUL. The
stores refuse such keys as well (`check_store_key`), a second wall under each reader's.
"""

from __future__ import annotations

import re
from pathlib import Path

from streamkeeper.errors import UnsafePathError

# Names that become folders below the storage root (the spec checks them on the way in).
NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"  # jobs and lineages
SINK_NAME_PATTERN = r"^[a-z][a-z0-9_]{0,62}$"

PLANTED_FIX = (
    "it was not written by streamkeeper (someone with write access to the storage root "
    "planted or damaged it); nothing was written or deleted; delete it or restore it "
    "from a backup"
)


def path_problem(relative: object) -> str | None:
    """Why `relative` is no clean relative path (segments joined by '/'), or None."""
    if not isinstance(relative, str):
        return f"is a {type(relative).__name__}, not a path"
    if not relative:
        return "is empty"
    if "\x00" in relative:
        return "holds a NUL character"
    if "\\" in relative:
        return "holds a backslash"
    if relative.startswith("/"):
        return "is absolute"
    segments = relative.split("/")
    if ".." in segments:
        return "climbs out with '..'"
    if "." in segments or "" in segments:
        return "has an empty or '.' segment"
    return None


def check_store_key(key: str, where: str) -> str:
    """A key a store may be asked for: a clean relative path, or "" (the store's root) and
    a trailing '/' for folders.

    Raises:
        UnsafePathError: naming the key and the store.
    """
    bare = key[:-1] if key.endswith("/") else key
    problem = path_problem(bare) if bare else None
    if problem is not None:
        raise UnsafePathError(
            f"key {key!r} escapes the store's root {where!r} or is not a clean relative path "
            f"(it {problem}); keys are relative paths of plain segments joined by '/'"
        )
    return key


def _refuse(value: object, what: str, source: str, within: str, problem: str) -> UnsafePathError:
    return UnsafePathError(
        f"{source} lists {what} {value!r}, which {problem}; it must stay below {within}: "
        f"{PLANTED_FIX}"
    )


def confined_key(folder: str, key: object, *, what: str, source: str) -> str:
    """`key` (relative to the store's root), which must lie below `folder`.

    Args:
        what: what the key is, for the error ("file key").
        source: where it was read, for the error ("the checkpoint manifest 'lineages/...'").

    Raises:
        UnsafePathError: naming the key, where it was read, the folder and the fix.
    """
    problem = path_problem(key)
    if problem is None and not str(key).startswith(folder.rstrip("/") + "/"):
        problem = "lies elsewhere"
    if problem is not None:
        raise _refuse(key, what, source, f"its folder {folder!r}", problem)
    return str(key)


def joined_key(folder: str, relative: object, *, what: str, source: str) -> str:
    """`folder/relative`, `relative` checked to be a clean relative path first."""
    problem = path_problem(relative)
    if problem is not None:
        raise _refuse(relative, what, source, f"its folder {folder!r}", problem)
    return f"{folder}/{relative}" if folder else str(relative)


def clean_relative(relative: object, *, what: str, source: str, within: str) -> str:
    """`relative`, checked to be a clean relative path (to be joined below `within`)."""
    problem = path_problem(relative)
    if problem is not None:
        raise _refuse(relative, what, source, within, problem)
    return str(relative)


def confined_path(base: Path, relative: object, *, what: str, source: str) -> Path:
    """`base / relative` on the local file system, `relative` checked first."""
    return base / clean_relative(relative, what=what, source=source, within=repr(str(base)))


def confined_uri(folder: str, uri: object, *, what: str, source: str) -> str:
    """`uri` (a local path or s3:// URI), which must lie below the location `folder`."""
    base = folder.rstrip("/") + "/"
    inner = uri[len(base) :] if isinstance(uri, str) and uri.startswith(base) else None
    problem = "lies elsewhere" if inner is None else path_problem(inner)
    if problem is not None:
        raise _refuse(uri, what, source, f"its folder {folder!r}", problem)
    return str(uri)


def checked_name(value: object, pattern: str, *, what: str, source: str, expected: str) -> str:
    """An id or name read back from storage, checked with the pattern it was written with.

    Raises:
        UnsafePathError: naming the value, where it was read and the form expected.
    """
    if not isinstance(value, str) or not re.fullmatch(pattern, value):
        raise UnsafePathError(
            f"{source} names {what} {value!r}, which is not {expected}; {PLANTED_FIX}"
        )
    return value
