"""Spark's `hash()` (Murmur3 x86_32, seed 42) of a state key, with numpy, row-vectorized.

A stateful operator's state is partitioned by `pmod(hash(key), n)`. Computing it here
lets a restore's task convert its rows and write their state files in one Python pass,
with no trip back to the JVM. It follows Spark's `Murmur3HashFunction` /
`Murmur3_x86_32` exactly, including its tail handling of strings and binaries (each
byte past the last whole 4-byte word is mixed alone, as a signed int) and its
normalization of -0.0 to 0.0; a null field leaves the running hash unchanged; a
struct's fields are hashed in order, each seeded with the hash so far.

Only the types below are supported (`supports`); for any other key type (decimals,
arrays, maps, collated strings, intervals) the caller lets Spark compute the partition.
tests/integration/test_state_murmur3.py checks every type against Spark's own `hash`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

SEED = 42
_C1, _C2 = np.uint32(0xCC9E2D51), np.uint32(0x1B873593)
_INTS = {"integer", "short", "byte", "date", "boolean"}  # hashInt of the value as an int
_LONGS = {"long", "timestamp", "timestamp_ntz"}  # hashLong
_BYTES = {"string", "binary"}  # hashUnsafeBytes of the UTF-8 / raw bytes


def supports(spark_type: Any) -> bool:
    """True if `partition` computes Spark's hash for this key type (schema JSON)."""
    if isinstance(spark_type, dict):
        return spark_type.get("type") == "struct" and all(
            supports(field["type"]) for field in spark_type["fields"]
        )
    return spark_type in _INTS | _LONGS | _BYTES | {"float", "double"}


def spark_hash(key: pa.Array, spark_type: Any) -> np.ndarray:
    """Spark's `hash(key)` (int32) for every row of `key` (Spark's Arrow form of it)."""
    seeds = np.full(len(key), SEED, dtype=np.uint32)
    return _hash(key, spark_type, seeds).view(np.int32)


def partition(key: pa.Array, spark_type: Any, partitions: int) -> np.ndarray:
    """`pmod(hash(key), partitions)` for every row: the state partition of each key."""
    return np.mod(spark_hash(key, spark_type).astype(np.int64), partitions).astype(np.int32)


def _hash(array: pa.Array, spark_type: Any, seeds: np.ndarray) -> np.ndarray:
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if isinstance(spark_type, dict):  # a struct: its fields in order (flatten: parent nulls)
        hashes = seeds
        for child, field in zip(array.flatten(), spark_type["fields"], strict=True):
            hashes = _hash(child, field["type"], hashes)
        return hashes
    if spark_type in _BYTES:
        hashed = _hash_bytes(array, seeds)
    elif spark_type in _LONGS:
        hashed = _hash_long(_values(array, np.int64), seeds)
    elif spark_type == "double":
        values = _values(array, np.float64)
        values = np.where(values == 0.0, 0.0, values)  # -0.0 hashes as 0.0
        bits = values.view(np.int64)
        bits = np.where(np.isnan(values), np.int64(0x7FF8000000000000), bits)  # canonical NaN
        hashed = _hash_long(bits, seeds)
    elif spark_type == "float":
        values = _values(array, np.float32)
        values = np.where(values == 0.0, np.float32(0.0), values)
        bits = values.view(np.int32)
        bits = np.where(np.isnan(values), np.int32(0x7FC00000), bits)
        hashed = _hash_int(bits, seeds)
    elif spark_type in _INTS:
        hashed = _hash_int(_values(array, np.int32), seeds)
    else:
        raise ValueError(f"no Murmur3 for Spark type {spark_type!r} (check supports() first)")
    if array.null_count:
        return np.where(array.is_valid().to_numpy(zero_copy_only=False), hashed, seeds)
    return hashed


def _values(array: pa.Array, dtype: type) -> np.ndarray:
    """The array's values as `dtype` (nulls as 0: their hash is not used)."""
    if pa.types.is_boolean(array.type):
        array = array.cast(pa.int32())
    elif pa.types.is_date32(array.type):
        array = array.view(pa.int32())
    elif pa.types.is_timestamp(array.type):
        array = array.view(pa.int64())
    values = array.fill_null(0).to_numpy(zero_copy_only=False)
    return values.astype(dtype, copy=False)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _mix_k1(k1: np.ndarray) -> np.ndarray:
    return _rotl(k1 * _C1, 15) * _C2


def _mix_h1(h1: np.ndarray, k1: np.ndarray) -> np.ndarray:
    return _rotl(h1 ^ k1, 13) * np.uint32(5) + np.uint32(0xE6546B64)


def _fmix(h1: np.ndarray, length: np.ndarray | int) -> np.ndarray:
    h1 = h1 ^ np.asarray(length).astype(np.uint32)
    h1 = h1 ^ (h1 >> np.uint32(16))
    h1 = h1 * np.uint32(0x85EBCA6B)
    h1 = h1 ^ (h1 >> np.uint32(13))
    h1 = h1 * np.uint32(0xC2B2AE35)
    return h1 ^ (h1 >> np.uint32(16))


def _hash_int(values: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    return _fmix(_mix_h1(seeds, _mix_k1(values.view(np.uint32))), 4)


def _hash_long(values: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    words = values.view(np.uint32).reshape(-1, 2)  # little-endian: low word, high word
    h1 = _mix_h1(seeds, _mix_k1(words[:, 0]))
    return _fmix(_mix_h1(h1, _mix_k1(words[:, 1])), 8)


def _hash_bytes(array: pa.Array, seeds: np.ndarray) -> np.ndarray:
    """Spark's hashUnsafeBytes: whole little-endian words, then each tail byte alone."""
    array = array.cast(pa.large_binary())
    _, offset_buffer, data_buffer = array.buffers()
    offsets = np.frombuffer(offset_buffer, dtype=np.int64)[
        array.offset : array.offset + len(array) + 1
    ]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer else np.zeros(0, np.uint8)
    # Room to read a whole word past any row's end without a bounds check.
    data = np.concatenate([data, np.zeros(4, np.uint8)])
    starts, lengths = offsets[:-1], np.diff(offsets)
    words = lengths // 4
    h1 = seeds.copy()
    # Longest first, so the rows that still have a word at step j are a prefix.
    order = np.argsort(-words, kind="stable")
    remaining = words[order]
    for j in range(int(remaining[0]) if len(remaining) else 0):
        rows = order[: int(np.searchsorted(-remaining, -j, side="left"))]
        at = starts[rows] + 4 * j
        word = (
            data[at].astype(np.uint32)
            | (data[at + 1].astype(np.uint32) << np.uint32(8))
            | (data[at + 2].astype(np.uint32) << np.uint32(16))
            | (data[at + 3].astype(np.uint32) << np.uint32(24))
        )
        h1[rows] = _mix_h1(h1[rows], _mix_k1(word))
    tails = lengths % 4
    for t in range(3):
        rows = np.nonzero(tails > t)[0]
        if len(rows):
            byte = data[starts[rows] + 4 * words[rows] + t].view(np.int8).astype(np.int32)
            h1[rows] = _mix_h1(h1[rows], _mix_k1(byte.view(np.uint32)))
    return _fmix(h1, lengths)
