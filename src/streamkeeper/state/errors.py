"""Errors of canonical savepoints. Each names the operator uid, the bad value and the fix.

They specialise the runtime's errors (streamkeeper.errors), so callers that catch
`CheckpointRestoreError` or `SpecError` catch these too.
"""

from __future__ import annotations

from streamkeeper.errors import CheckpointRestoreError, CorruptManifestError, SpecError


class StateSchemaError(CheckpointRestoreError):
    """The new job's state schema cannot hold the savepoint's state."""


class OperatorUidError(SpecError):
    """Operator uids do not fit the query's stateful operators or the savepoint."""


class StateTypeError(CheckpointRestoreError):
    """A state field has a type canonical restore cannot write in Spark's format."""


class UnsupportedOperatorError(CheckpointRestoreError):
    """A stateful operator whose state canonical savepoints cannot carry."""


class CanonicalManifestError(CorruptManifestError):
    """A canonical savepoint's manifest is missing, malformed, or of another format."""
