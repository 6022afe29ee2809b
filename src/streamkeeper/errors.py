"""Every error streamkeeper raises on purpose. Each message names the bad value and the fix."""

from __future__ import annotations


class StreamkeeperError(Exception):
    """Base class: an error the user can act on."""


class SpecError(StreamkeeperError):
    """A job spec is malformed or inconsistent."""


class StorageError(StreamkeeperError):
    """Object storage is unreachable, refuses our credentials, or a path escapes its root."""


class UnsafePathError(StorageError):
    """A path, key or id would reach outside its folder: one given as a key to a store, or
    one read back from storage (a manifest, an index, a registry entry, a job record),
    which streamkeeper never writes. Raised before any byte is written or deleted."""


class UnusableRootError(StorageError):
    """The start's probe of the root failed: unreachable, credentials refused, no bucket,
    not writable (bad input: the error names the fix)."""


class CorruptObjectError(StreamkeeperError, ValueError):
    """A stored JSON object (a record, a registry, a manifest) is not valid JSON or not an
    object: it was damaged outside streamkeeper. A ValueError too, as json's own error."""


class SchemaMismatchError(StreamkeeperError):
    """A target table exists with a schema that the job's output does not match."""


class CorruptManifestError(StreamkeeperError):
    """A write-ahead-log manifest cannot be parsed or does not belong to this lineage."""


class FencedError(StreamkeeperError):
    """Another runner of the same job lineage took over; this one must not commit."""


class AlreadyRunningError(StreamkeeperError):
    """A live runner of the same job lineage holds the lineage."""


class SourceError(StreamkeeperError):
    """A source is unreachable or missing, or cannot replay the offsets a checkpoint asks for."""


class CheckpointRestoreError(StreamkeeperError):
    """An externalized checkpoint (or savepoint) cannot be restored as asked."""


class CheckpointFailureLimitError(StreamkeeperError):
    """More consecutive checkpoint failures than `checkpoint.tolerable_failures`."""


class QueryFailedError(StreamkeeperError):
    """The streaming query stopped with an error (a failed checkpoint)."""


class DuplicateKeyError(StreamkeeperError):
    """A merge sink's batch holds more than one row for a key, and no order_by decides."""


class UnknownJobError(StreamkeeperError):
    """No job of that name ever ran under the storage root."""


class SavepointError(StreamkeeperError):
    """A savepoint cannot be taken, found, restored, inspected or deleted as asked."""


class UnknownSavepointError(SavepointError):
    """No savepoint of that id under the storage root (or in that lineage)."""


class BrokenSavepointError(SavepointError):
    """A savepoint whose manifest or data is partly missing or corrupt: never used."""


class IncompatibleSavepointError(SavepointError):
    """A savepoint of another job or lineage, or of another topology than the job's."""


class RewindPendingError(SavepointError):
    """A rollback restored the job's tables and did not finish: only its savepoint may start."""


class CommandError(StreamkeeperError):
    """A command to a running job is malformed, conflicts with another, or got no answer."""
