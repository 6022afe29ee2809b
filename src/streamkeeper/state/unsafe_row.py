"""Spark's UnsafeRow binary format, written from Arrow columns with numpy.

A state store keeps each key and value as an UnsafeRow: a null bitset (one bit per
field, in 8-byte words), one 8-byte slot per field, then a variable-length region. A
fixed-width value sits in its slot, zero-extended; a string, binary, large decimal or
nested struct goes to the variable region, 8-byte aligned and zero-padded, and its slot
holds `offset << 32 | size` (offset from the row's start). A null field has its bit set
and a zero slot (a null large decimal still reserves its 16 bytes).

The bytes must equal what Spark's own UnsafeProjection writes for the same values: the
HDFS-backed store finds keys by byte equality and RocksDB uses them as its keys. Tested
against the bytes Spark's `statestore` reader returns (tests/integration).

Types: boolean, byte, short, integer, long, float, double, date, timestamp(_ntz),
decimal, string, binary, null and nested structs. Arrays and maps are refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamkeeper.state.errors import StateTypeError

_WORD = 8
_MAX_LONG_DIGITS = 18  # decimals up to this precision are stored as an unscaled long
_FIXED_INT = {"byte": np.uint8, "short": np.uint16, "integer": np.uint32, "date": np.uint32}
_FIXED_LONG = {"long", "timestamp", "timestamp_ntz"}
NULL_TYPES = {"void", "null"}  # Spark's NullType (named "void" since 3.x's JSON)


@dataclass
class _Field:
    """One encoded field: its slot values, nulls, and bytes for the variable region."""

    slot: np.ndarray  # uint64 per row (for variable fields: the size; the offset is added)
    nulls: np.ndarray  # bool per row
    var_offsets: np.ndarray | None = None  # int64, n + 1: each row's payload in var_data
    var_data: np.ndarray | None = None  # uint8 payloads, back to back
    reserve: int = 0  # a fixed number of bytes each row reserves (large decimals)


def encode_struct(array: pa.Array, spark_type: dict[str, Any]) -> pa.BinaryArray:
    """Each row of a struct array as UnsafeRow bytes.

    Args:
        array: a struct array (rows may not be null).
        spark_type: the struct's Spark type as JSON (`StructType.jsonValue()`).

    Raises:
        StateTypeError: a field has a type the format cannot be written for here.
    """
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    offsets, data = _encode_rows(array, spark_type)
    return pa.BinaryArray.from_buffers(
        pa.binary(), len(array), [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)]
    )


def _encode_rows(
    array: pa.StructArray, spark_type: dict[str, Any]
) -> tuple[np.ndarray, np.ndarray]:
    """(row offsets int64 n + 1, row bytes) of a struct array."""
    rows = len(array)
    fields = spark_type["fields"]
    children = array.flatten()
    encoded = [
        _encode_field(child, field["type"], field["name"])
        for child, field in zip(children, fields, strict=True)
    ]
    bitset_words = (len(fields) + 63) // 64
    fixed = (bitset_words + len(fields)) * _WORD
    words = np.zeros((rows, bitset_words + len(fields)), dtype=np.uint64)
    var_sizes = np.zeros(rows, dtype=np.int64)  # the variable region so far, per row
    placements = []
    for index, field in enumerate(encoded):
        if field.nulls.any():
            bit = np.uint64(1) << np.uint64(index % 64)
            words[:, index // 64] |= np.where(field.nulls, bit, np.uint64(0))
        if field.var_offsets is None and not field.reserve:
            words[:, bitset_words + index] = np.where(field.nulls, np.uint64(0), field.slot)
            continue
        start = fixed + var_sizes  # where this field's payload begins, per row
        payload = np.diff(field.var_offsets) if field.var_offsets is not None else 0
        size = np.maximum(_padded(payload), field.reserve)
        slot = (start.astype(np.uint64) << np.uint64(32)) | field.slot
        if field.reserve:  # a null large decimal keeps its offset (size 0)
            words[:, bitset_words + index] = slot
        else:
            words[:, bitset_words + index] = np.where(field.nulls, np.uint64(0), slot)
            size = np.where(field.nulls, 0, size)
        if field.var_offsets is not None:
            placements.append((start, field))
        var_sizes = var_sizes + size
    row_sizes = fixed + var_sizes
    offsets = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(row_sizes, out=offsets[1:])
    out = np.zeros(int(offsets[-1]), dtype=np.uint8)
    fixed_bytes = words.view(np.uint8).reshape(rows, fixed)
    if not placements:  # every row has the same size: the fixed part is the row
        out[:] = fixed_bytes.reshape(-1)
        return offsets, out
    _scatter_rows(out, offsets[:-1], fixed_bytes)
    for start, field in placements:
        _copy_ragged(out, offsets[:-1] + start, field.var_offsets, field.var_data)
    return offsets, out


def _padded(sizes: Any) -> Any:
    return (sizes + (_WORD - 1)) // _WORD * _WORD


def _scatter_rows(out: np.ndarray, starts: np.ndarray, rows: np.ndarray) -> None:
    """out[starts[i] : starts[i] + width] = rows[i] for every i."""
    width = rows.shape[1]
    index = starts[:, None] + np.arange(width, dtype=np.int64)[None, :]
    out[index.reshape(-1)] = rows.reshape(-1)


def _copy_ragged(
    out: np.ndarray, destinations: np.ndarray, offsets: np.ndarray, data: np.ndarray
) -> None:
    """Copy payload i (data[offsets[i]:offsets[i+1]]) to out[destinations[i]:]."""
    lengths = np.diff(offsets)
    total = int(lengths.sum())
    if total == 0:
        return
    source = np.arange(offsets[0], offsets[-1], dtype=np.int64)
    target = source + np.repeat(destinations - offsets[:-1], lengths)
    out[target] = data[offsets[0] : offsets[-1]]


def _encode_field(array: pa.Array, spark_type: Any, name: str) -> _Field:
    rows = len(array)
    nulls = _nulls(array)
    if isinstance(spark_type, str) and spark_type in NULL_TYPES:
        return _Field(np.zeros(rows, dtype=np.uint64), np.ones(rows, dtype=bool))
    if isinstance(spark_type, dict):
        if spark_type.get("type") != "struct":
            raise StateTypeError(
                f"state field {name!r} has type {spark_type.get('type')!r}; canonical restore "
                "writes only flat types and structs (no arrays or maps); keep this operator's "
                "state in a native savepoint"
            )
        return _struct_field(array, spark_type, nulls)
    if spark_type in ("string", "binary"):
        return _binary_field(array, nulls)
    if spark_type.startswith("decimal"):
        return _decimal_field(array, spark_type, nulls)
    return _Field(_fixed_slot(array, spark_type, name), nulls)


def _nulls(array: pa.Array) -> np.ndarray:
    if array.null_count == 0:
        return np.zeros(len(array), dtype=bool)
    return array.is_null().to_numpy(zero_copy_only=False)


_SIGNED = {np.uint8: np.int8, np.uint16: np.int16, np.uint32: np.int32}


def _fixed_slot(array: pa.Array, spark_type: str, name: str) -> np.ndarray:
    """The 8-byte slot of a fixed-width value: its little-endian bits, zero-extended."""
    if spark_type == "boolean":
        return pc.fill_null(array, False).to_numpy(zero_copy_only=False).astype(np.uint64)
    if spark_type in _FIXED_LONG:
        if pa.types.is_timestamp(array.type):  # Spark keeps microseconds
            array = array.cast(pa.timestamp("us", tz=array.type.tz)).cast(pa.int64())
        numbers = pc.fill_null(array.cast(pa.int64()), 0).to_numpy(zero_copy_only=False)
        return numbers.astype(np.int64).view(np.uint64)
    if spark_type in _FIXED_INT:
        if pa.types.is_date(array.type):
            array = array.cast(pa.date32()).cast(pa.int32())
        unsigned = _FIXED_INT[spark_type]
        numbers = pc.fill_null(array, 0).to_numpy(zero_copy_only=False)
        return numbers.astype(_SIGNED[unsigned]).view(unsigned).astype(np.uint64)
    if spark_type == "float":
        bits = pc.fill_null(array, 0.0).to_numpy(zero_copy_only=False).astype(np.float32)
        return bits.view(np.uint32).astype(np.uint64)
    if spark_type == "double":
        bits = pc.fill_null(array, 0.0).to_numpy(zero_copy_only=False).astype(np.float64)
        return bits.view(np.uint64)
    raise StateTypeError(
        f"state field {name!r} has type {spark_type!r}, which canonical restore cannot write; "
        "keep this operator's state in a native savepoint"
    )


def _binary_field(array: pa.Array, nulls: np.ndarray) -> _Field:
    # A null's payload is empty, whatever its offsets say.
    array = pc.fill_null(array.cast(pa.large_binary()), b"")
    _, offsets_buffer, data_buffer = array.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=np.int64)
    offsets = offsets[array.offset : array.offset + len(array) + 1]
    data = _bytes(data_buffer)
    return _Field(np.diff(offsets).astype(np.uint64), nulls, offsets, data)


def _bytes(buffer: pa.Buffer | None) -> np.ndarray:
    return np.zeros(0, np.uint8) if buffer is None else np.frombuffer(buffer, dtype=np.uint8)


def _struct_field(array: pa.Array, spark_type: dict[str, Any], nulls: np.ndarray) -> _Field:
    offsets, data = _encode_rows(array, spark_type)
    if nulls.any():  # a null struct has no payload
        offsets, data = _keep_payloads(offsets, data, ~nulls)
    return _Field(np.diff(offsets).astype(np.uint64), nulls, offsets, data)


def _keep_payloads(
    offsets: np.ndarray, data: np.ndarray, keep: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The payloads with the unkept ones made empty (offsets keep one entry per row)."""
    lengths = np.where(keep, np.diff(offsets), 0)
    kept = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=kept[1:])
    out = np.zeros(int(kept[-1]), dtype=np.uint8)
    if len(out):
        source = np.arange(len(out), dtype=np.int64) + np.repeat(offsets[:-1] - kept[:-1], lengths)
        out[:] = data[source]
    return kept, out


def _decimal_field(array: pa.Array, spark_type: str, nulls: np.ndarray) -> _Field:
    precision, scale = (int(p) for p in spark_type[len("decimal(") : -1].split(","))
    array = array.cast(pa.decimal128(precision, scale))
    raw = np.frombuffer(array.buffers()[1], dtype=np.int64)
    raw = raw[2 * array.offset : 2 * (array.offset + len(array))].reshape(-1, 2)
    if precision <= _MAX_LONG_DIGITS:
        return _Field(np.where(nulls, 0, raw[:, 0]).view(np.uint64), nulls)
    # Java's BigInteger.toByteArray: big-endian, minimal two's complement, in 16 bytes.
    payloads = [
        b"" if null else _big_endian(int(low) & 0xFFFFFFFFFFFFFFFF | int(high) << 64)
        for null, (low, high) in zip(nulls, raw, strict=True)
    ]
    lengths = np.array([len(p) for p in payloads], dtype=np.int64)
    offsets = np.zeros(len(payloads) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = np.frombuffer(b"".join(payloads), dtype=np.uint8)
    return _Field(lengths.astype(np.uint64), nulls, offsets, data, reserve=16)


def _big_endian(unscaled: int) -> bytes:
    if unscaled >= 1 << 127:
        unscaled -= 1 << 128  # the high word was signed
    length = unscaled.bit_length() // 8 + 1
    return unscaled.to_bytes(length, "big", signed=True)
