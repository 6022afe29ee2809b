"""Parquet files read whole, in one GET, then parsed.

A ranged read (a column chunk, a footer) that S3 answers with an error (a 503 SlowDown,
a 500) fails at once, unretried: the AWS SDK under pyarrow writes the error's body into
the range's preallocated buffer, which it does not fit ("Failed to flush response
stream"). A plain GET is retried like any other request (storage/location.py: six
attempts). Found by the fault run, where it failed batches, upgrade probations and a
green's restore of its handover savepoint. For the files this reads (a batch's staged
rows, a part of a savepoint's state, a history file) one GET is also the cheaper read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow.parquet as pq
    from pyarrow.fs import FileSystem


def open_parquet_whole(filesystem: FileSystem, path: str) -> pq.ParquetFile:
    """The Parquet file at `path` (on `filesystem`), read into memory in one request."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with filesystem.open_input_stream(path) as stream:
        body = pa.BufferReader(stream.read())
    return pq.ParquetFile(body)
