"""State schema compatibility and the canonical form (no Spark needed)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from streamkeeper.state.errors import StateSchemaError
from streamkeeper.state.schema import canonical_names, check_compatible, reshape


def struct(*fields: tuple[str, object, bool]) -> dict:
    return {
        "type": "struct",
        "fields": [
            {"name": name, "type": kind, "nullable": nullable, "metadata": {}}
            for name, kind, nullable in fields
        ],
    }


KEY = struct(("key", "string", True))
VALUE = struct(("count", "long", False), ("sum", "long", True))


def test_the_same_schema_restores_field_by_field() -> None:
    plan = check_compatible("totals", KEY, VALUE, KEY, VALUE)
    assert [s.old_index for s in plan.sources] == [0, 1]
    assert plan.warnings == []


@pytest.mark.parametrize(
    ("new_key", "words"),
    [
        (struct(("key", "bigint", True)), ["'totals'", "'key'", "string", "bigint"]),
        (struct(("id", "string", True)), ["key field 1", "'key' (string)", "'id' (string)"]),
        (struct(("key", "string", True), ("day", "date", True)), ["key field 2", "nothing"]),
    ],
)
def test_a_changed_key_is_refused_naming_the_field_and_types(new_key: dict, words: list) -> None:
    with pytest.raises(StateSchemaError) as failure:
        check_compatible("totals", KEY, VALUE, new_key, VALUE)
    for word in [*words, "state processor API"]:
        assert word in str(failure.value), str(failure.value)


def test_key_nullability_does_not_matter() -> None:
    check_compatible("t", KEY, VALUE, struct(("key", "string", False)), VALUE)


def test_a_value_type_that_cannot_hold_the_old_one_is_refused() -> None:
    new = struct(("count", "long", False), ("sum", "double", True))
    with pytest.raises(StateSchemaError, match=r"'t'.*'sum' is bigint .* but double"):
        check_compatible("t", KEY, VALUE, KEY, new)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("integer", "long"),
        ("byte", "short"),
        ("float", "double"),
        ("decimal(10,2)", "decimal(20,2)"),
    ],
)
def test_widening_value_types_are_compatible(old: str, new: str) -> None:
    plan = check_compatible("t", KEY, struct(("v", old, True)), KEY, struct(("v", new, True)))
    values = pa.array([{"v": 1}], pa.struct([("v", _arrow(old))]))
    restored = plan.apply(values, struct(("v", new, True)))
    assert restored.type.field(0).type == _arrow(new)
    assert restored.to_pylist()[0]["v"] == 1


def _arrow(kind: str) -> pa.DataType:
    if kind.startswith("decimal"):
        precision, scale = (int(x) for x in kind[8:-1].split(","))
        return pa.decimal128(precision, scale)
    return {
        "integer": pa.int32(),
        "long": pa.int64(),
        "byte": pa.int8(),
        "short": pa.int16(),
        "float": pa.float32(),
        "double": pa.float64(),
    }[kind]


def test_new_value_fields_start_null_or_zero_and_dropped_ones_are_reported() -> None:
    new = struct(
        ("sum", "long", True),
        ("largest", "long", True),
        ("seen", "long", False),
    )
    plan = check_compatible("t", KEY, VALUE, KEY, new)
    values = pa.array(
        [{"count": 3, "sum": 10}], pa.struct([("count", pa.int64()), ("sum", pa.int64())])
    )
    assert plan.apply(values, new).to_pylist() == [{"sum": 10, "largest": None, "seen": 0}]
    text = " ".join(plan.warnings)
    assert "'largest'" in text and "null" in text
    assert "'seen'" in text and "start with 0" in text
    assert "['count']" in text and "dropped" in text


def test_a_new_non_nullable_field_without_a_zero_is_refused() -> None:
    window = struct(("start", "timestamp", True))
    new = struct(("count", "long", False), ("sum", "long", True), ("w", window, False))
    with pytest.raises(StateSchemaError, match="'w'.*not nullable.*make it nullable"):
        check_compatible("t", KEY, VALUE, KEY, new)


def test_repeated_buffer_names_are_matched_by_occurrence() -> None:
    # sum(value) then avg(value): the aggregation buffer is sum, sum, count.
    old = struct(("sum", "long", True), ("sum", "double", True), ("count", "long", True))
    assert canonical_names(old) == ["sum", "sum__2", "count"]
    new = struct(
        ("sum", "long", True),
        ("sum", "double", True),
        ("count", "long", True),
        ("sum", "long", True),
    )
    plan = check_compatible("t", KEY, old, KEY, new)
    assert [s.old_index for s in plan.sources] == [0, 1, 2, None]


def test_canonical_form_stores_null_types_as_booleans_and_back() -> None:
    kind = struct(("__dummy__", "void", True))
    spark_form = pa.array([{"__dummy__": None}] * 2, pa.struct([("__dummy__", pa.null())]))
    stored = reshape(spark_form, kind, canonical=True)
    assert stored.type == pa.struct([("__dummy__", pa.bool_())])
    assert reshape(stored, kind, canonical=False).type == spark_form.type
