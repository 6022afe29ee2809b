"""Canonical state: a job's state by operator uid, independent of code and partitioning.

- `format`: `OperatorState`, `CanonicalManifest`, `write/read_canonical_manifest`;
- `export.export_canonical`: a checkpoint's state at a batch -> Delta tables by uid;
- `positions.read_source_positions`: the batch's source positions, for the manifest;
- `restore.restore_canonical`: savepoint -> a fresh checkpoint for the new code, any
  partition count, either state store;
- `processor`: read, change and write a savepoint's state (the state processor API);
- `uids.resolve_uids`: the spec's `state.operators` checked against a query.

Spark is imported lazily: `format` and `positions` work without it.
"""

from streamkeeper.state.format import (
    CanonicalManifest,
    OperatorState,
    read_canonical_manifest,
    write_canonical_manifest,
)
from streamkeeper.state.positions import SourcePositions, read_source_positions

__all__ = [
    "CanonicalManifest",
    "OperatorState",
    "SourcePositions",
    "read_canonical_manifest",
    "read_source_positions",
    "write_canonical_manifest",
]
