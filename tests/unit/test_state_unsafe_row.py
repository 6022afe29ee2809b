"""UnsafeRow encoding from Arrow, byte for byte (no Spark: the layouts are Spark's).

Integration tests compare the encoder with the bytes Spark itself wrote for the same
state (tests/integration/test_state_encoding.py); these pin the layout rules.
"""

from __future__ import annotations

import datetime
import decimal
import struct

import numpy as np
import pyarrow as pa
import pytest

from streamkeeper.state.errors import StateTypeError
from streamkeeper.state.unsafe_row import encode_struct
from streamkeeper.state.writers import frame_records


def struct_type(*fields: tuple[str, object]) -> dict:
    return {
        "type": "struct",
        "fields": [
            {"name": name, "type": kind, "nullable": True, "metadata": {}} for name, kind in fields
        ],
    }


def word(value: int) -> bytes:
    return struct.pack("<Q", value & 0xFFFFFFFFFFFFFFFF)


def test_a_string_key_is_offset_and_size_then_padded_bytes() -> None:
    rows = pa.array([{"key": "k0003"}, {"key": ""}, {"key": "exactly8"}])
    encoded = encode_struct(rows, struct_type(("key", "string"))).to_pylist()
    assert encoded == [
        word(0) + word(16 << 32 | 5) + b"k0003\0\0\0",
        word(0) + word(16 << 32 | 0),
        word(0) + word(16 << 32 | 8) + b"exactly8",
    ]


def test_fixed_width_values_are_zero_extended_little_endian() -> None:
    kinds = [
        ("b", "boolean"),
        ("t", "byte"),
        ("s", "short"),
        ("i", "integer"),
        ("l", "long"),
        ("f", "float"),
        ("d", "double"),
        ("day", "date"),
        ("ts", "timestamp"),
    ]
    row = {
        "b": True,
        "t": -2,
        "s": -3,
        "i": -4,
        "l": -5,
        "f": 1.5,
        "d": -2.25,
        "day": datetime.date(1970, 1, 3),
        "ts": datetime.datetime(1970, 1, 1, 0, 0, 1, tzinfo=datetime.UTC),
    }
    arrow = pa.array(
        [row],
        pa.struct(
            [
                ("b", pa.bool_()),
                ("t", pa.int8()),
                ("s", pa.int16()),
                ("i", pa.int32()),
                ("l", pa.int64()),
                ("f", pa.float32()),
                ("d", pa.float64()),
                ("day", pa.date32()),
                ("ts", pa.timestamp("us", tz="UTC")),
            ]
        ),
    )
    encoded = encode_struct(arrow, struct_type(*kinds)).to_pylist()[0]
    expected = word(0) + b"".join(
        [
            word(1),
            word(0xFE),
            word(0xFFFD),
            word(0xFFFFFFFC),
            word(-5),
            struct.pack("<f", 1.5) + b"\0" * 4,
            struct.pack("<d", -2.25),
            word(2),
            word(1_000_000),
        ]
    )
    assert encoded == expected


def test_nulls_set_their_bit_and_leave_a_zero_slot() -> None:
    rows = pa.array(
        [{"a": None, "b": "x", "c": None}],
        pa.struct([("a", pa.int64()), ("b", pa.string()), ("c", pa.string())]),
    )
    kinds = struct_type(("a", "long"), ("b", "string"), ("c", "string"))
    encoded = encode_struct(rows, kinds).to_pylist()[0]
    assert encoded == word(0b101) + word(0) + word(32 << 32 | 1) + word(0) + b"x" + b"\0" * 7


def test_a_null_type_field_is_always_null() -> None:
    rows = pa.array([{"__dummy__": None}], pa.struct([("__dummy__", pa.null())]))
    assert encode_struct(rows, struct_type(("__dummy__", "void"))).to_pylist() == [
        word(1) + word(0)
    ]


def test_a_nested_struct_is_a_row_in_the_variable_region() -> None:
    window = pa.struct(
        [("start", pa.timestamp("us", tz="UTC")), ("end", pa.timestamp("us", tz="UTC"))]
    )
    rows = pa.array(
        [{"w": {"start": 1, "end": 2}, "k": "ab"}, {"w": None, "k": "c"}],
        pa.struct([("w", window), ("k", pa.string())]),
    )
    window_type = struct_type(("start", "timestamp"), ("end", "timestamp"))
    encoded = encode_struct(rows, struct_type(("w", window_type), ("k", "string"))).to_pylist()
    nested = word(0) + word(1) + word(2)
    assert (
        encoded[0]
        == word(0) + word(24 << 32 | 24) + word(48 << 32 | 2) + nested + b"ab" + b"\0" * 6
    )
    assert encoded[1] == word(1) + word(0) + word(24 << 32 | 1) + b"c" + b"\0" * 7


def test_decimals_small_as_unscaled_long_large_in_sixteen_bytes() -> None:
    rows = pa.array(
        [
            {"small": decimal.Decimal("-1.25"), "large": decimal.Decimal("12345678901234567890.5")},
            {"small": None, "large": None},
        ],
        pa.struct([("small", pa.decimal128(10, 2)), ("large", pa.decimal128(25, 1))]),
    )
    kinds = struct_type(("small", "decimal(10,2)"), ("large", "decimal(25,1)"))
    encoded = encode_struct(rows, kinds).to_pylist()
    unscaled = (123456789012345678905).to_bytes(9, "big", signed=True)
    assert encoded[0] == word(0) + word(-125) + word(24 << 32 | 9) + unscaled + b"\0" * 7
    # A null large decimal keeps its 16 bytes and its offset, with size 0.
    assert encoded[1] == word(0b11) + word(0) + word(24 << 32) + b"\0" * 16


def test_arrays_are_refused_with_the_field_name() -> None:
    rows = pa.array([{"xs": [1]}])
    with pytest.raises(StateTypeError, match="'xs'.*array"):
        encode_struct(
            rows,
            struct_type(("xs", {"type": "array", "elementType": "long", "containsNull": True})),
        )


def test_sliced_arrays_encode_their_own_rows() -> None:
    rows = pa.array([{"key": "a"}, {"key": "bb"}, {"key": "ccc"}]).slice(1, 2)
    encoded = encode_struct(rows, struct_type(("key", "string"))).to_pylist()
    assert [e[16:].rstrip(b"\0") for e in encoded] == [b"bb", b"ccc"]


def test_delta_file_records_are_length_prefixed_and_end_with_minus_one() -> None:
    keys, values = pa.array([b"ab", b"c"], pa.binary()), pa.array([b"xyz", b""], pa.binary())
    body = frame_records(keys, values).tobytes()
    assert body == (
        struct.pack(">i", 2)
        + b"ab"
        + struct.pack(">i", 3)
        + b"xyz"
        + struct.pack(">i", 1)
        + b"c"
        + struct.pack(">i", 0)
        + struct.pack(">i", -1)
    )
    empty = frame_records(pa.array([], pa.binary()), pa.array([], pa.binary()))
    assert np.array_equal(empty, np.frombuffer(struct.pack(">i", -1), np.uint8))
