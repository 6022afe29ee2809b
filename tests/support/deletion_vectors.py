"""A Delta commit with a deletion vector, as a DV-writing engine (Spark, Databricks) makes it.

delta-rs 1.6 reads deletion vectors but never writes them (its DELETE rewrites files), so
the tests write the commit themselves: `remove` the file, `add` it again with an inline
deletion vector (a Z85-encoded RoaringBitmapArray, as in the Delta protocol). delta-rs
itself decodes it (`DeltaTable.deletion_vectors()`), so the commit is a real one.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_ROARING_ARRAY_MAGIC = 1681511377
_PORTABLE_NO_RUN_COOKIE = 12346


def z85(data: bytes) -> str:
    """Z85 (ZeroMQ base-85) of `data`, zero-padded to a multiple of 4 bytes as Delta does."""
    padded = data + b"\0" * (-len(data) % 4)
    out = []
    for start in range(0, len(padded), 4):
        number = int.from_bytes(padded[start : start + 4], "big")
        chunk = []
        for _ in range(5):
            number, digit = divmod(number, 85)
            chunk.append(_Z85[digit])
        out.extend(reversed(chunk))
    return "".join(out)


def roaring_bitmap_array(rows: list[int]) -> bytes:
    """Delta's RoaringBitmapArray of row indexes below 65536: one bitmap, one array container."""
    values = sorted(set(rows))
    assert values and values[-1] < 65536
    bitmap = struct.pack("<II", _PORTABLE_NO_RUN_COOKIE, 1)  # cookie, one container
    bitmap += struct.pack("<HH", 0, len(values) - 1)  # container key, cardinality - 1
    bitmap += struct.pack("<I", 8 + 4 + 4)  # offset of the container's data
    bitmap += b"".join(struct.pack("<H", v) for v in values)
    return struct.pack("<iqi", _ROARING_ARRAY_MAGIC, 1, 0) + bitmap


def deletion_vector_actions(add: dict[str, Any], rows: list[int], operation: str) -> list[dict]:
    """The actions deleting `rows` of the file `add` (a log add action) with a deletion vector."""
    now = int(time.time() * 1000)
    serialized = roaring_bitmap_array(rows)
    vector = {
        "storageType": "i",
        "pathOrInlineDv": z85(serialized),
        "sizeInBytes": len(serialized),
        "cardinality": len(set(rows)),
    }
    kept = {k: add[k] for k in ("path", "partitionValues", "size", "stats") if k in add}
    return [
        {"commitInfo": {"timestamp": now, "operation": operation, "operationParameters": {}}},
        {
            "remove": {
                "path": add["path"],
                "dataChange": True,
                "deletionTimestamp": now,
                "extendedFileMetadata": True,
                "partitionValues": add.get("partitionValues", {}),
                "size": add["size"],
            }
        },
        {"add": {**kept, "modificationTime": now, "dataChange": True, "deletionVector": vector}},
    ]


def delete_rows_with_deletion_vector(
    table_dir: Path, version: int, rows: list[int], operation: str = "DELETE"
) -> int:
    """Commit a deletion vector for `rows` of the first file `version` added; the new version."""
    log = table_dir / "_delta_log"
    added = [
        json.loads(line)["add"]
        for line in (log / f"{version:020d}.json").read_text().splitlines()
        if line.strip() and "add" in json.loads(line)
    ]
    new_version = max(int(p.stem) for p in log.glob("*.json")) + 1
    actions = deletion_vector_actions(added[0], rows, operation)
    text = "".join(json.dumps(action) + "\n" for action in actions)
    with open(log / f"{new_version:020d}.json", "x") as handle:  # put-if-absent, as Delta
        handle.write(text)
    return new_version
