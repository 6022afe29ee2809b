"""Spark's LZ4 block stream as the restore's tasks write it (hdfs_files), read back.

Spark's own reader of these files is proven by the restore tests
(tests/integration/test_state_restore.py): a restored query continues exactly from them.
"""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest

from streamkeeper.state.hdfs_files import (
    MAGIC,
    UnreadableState,
    lz4_stream_compress,
    lz4_stream_decompress,
)


@pytest.mark.parametrize("size", [0, 1, 1023, 1024, 5000])
def test_any_body_round_trips_over_many_blocks(size: int) -> None:
    body = (b"key-" * (size // 4 + 1))[: size // 2] + os.urandom(size - size // 2)
    packed = lz4_stream_compress(np.frombuffer(body, dtype=np.uint8), block_size=1024)
    assert lz4_stream_decompress(packed) == body
    # One header per block of at most 1024 bytes, then the empty block that ends it.
    assert packed.count(MAGIC) == -(-size // 1024) + 1
    assert packed.endswith(MAGIC + bytes([0x10 | 0]) + bytes(12))


def test_incompressible_blocks_are_stored_raw_and_repetitive_ones_compressed() -> None:
    noise = os.urandom(1024)
    packed = lz4_stream_compress(noise + b"\0" * 1024, block_size=1024)
    first = struct.unpack_from("<8sBiii", packed, 0)
    second = struct.unpack_from("<8sBiii", packed, 21 + first[2])
    assert (first[1] & 0xF0, first[2]) == (0x10, 1024)  # raw, stored as is
    assert second[1] & 0xF0 == 0x20 and second[2] < 100  # LZ4
    assert lz4_stream_decompress(packed) == noise + b"\0" * 1024


def test_a_corrupted_block_is_refused_by_its_checksum() -> None:
    packed = bytearray(lz4_stream_compress(os.urandom(2048), block_size=1024))
    packed[21 + 10] ^= 0xFF  # a byte of the first (raw) block
    with pytest.raises(UnreadableState, match="checksum"):
        lz4_stream_decompress(bytes(packed))
