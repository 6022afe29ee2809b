"""State schemas: the canonical (storable) form, and old-to-new compatibility.

Types are Spark's schema JSON (`StructType.jsonValue()`), so this module needs no
Spark session. A savepoint's key and value types are checked against the new job's
before anything is written:

- the key must keep its fields and their types exactly (names matched in order): a
  key's type decides its partition (Murmur3 hashes int and bigint differently) and its
  stored bytes, so a changed key would silently miss its state;
- value fields are matched by name (a repeated name by its occurrence, see format.py);
  a type may widen (byte < short < int < bigint, float < double, a decimal's precision
  with the same scale); a field the new job adds starts as null, or as its type's zero
  if it cannot be null; a field it drops is dropped. Both are reported as warnings.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from streamkeeper.state.errors import StateSchemaError
from streamkeeper.state.unsafe_row import NULL_TYPES

SparkType = Any  # a type in Spark's schema JSON: "long", {"type": "struct", ...}, ...

_INTEGRAL = ["byte", "short", "integer", "long"]
_ZERO = {
    "boolean": False,
    "byte": 0,
    "short": 0,
    "integer": 0,
    "long": 0,
    "float": 0.0,
    "double": 0.0,
    "string": "",
    "binary": b"",
}
FIX = (
    "keep the state's type in the new job, or convert the state with the state processor "
    "API (streamkeeper.state.processor: read_state, transform, write_state) and restore "
    "from the new savepoint"
)


def canonical_names(struct: dict[str, Any]) -> list[str]:
    """Field names made unique: the k-th occurrence of `name` is `name__k` (k >= 2)."""
    seen: Counter[str] = Counter()
    names = []
    for item in struct["fields"]:
        seen[item["name"]] += 1
        count = seen[item["name"]]
        names.append(item["name"] if count == 1 else f"{item['name']}__{count}")
    return names


def with_canonical_names(spark_type: SparkType) -> SparkType:
    """The type with every struct's repeated field names made unique (canonical_names)."""
    if isinstance(spark_type, dict) and spark_type.get("type") == "struct":
        fields = [
            {**item, "name": name, "type": with_canonical_names(item["type"])}
            for name, item in zip(canonical_names(spark_type), spark_type["fields"], strict=True)
        ]
        return {**spark_type, "fields": fields}
    return spark_type


def type_text(spark_type: SparkType) -> str:
    """A type as Spark's DDL would show it (struct<a:bigint>, decimal(10,2), ...)."""
    if isinstance(spark_type, str):
        return {"long": "bigint", "integer": "int", "short": "smallint", "byte": "tinyint"}.get(
            spark_type, spark_type
        )
    kind = spark_type.get("type")
    if kind == "struct":
        inner = ",".join(f"{f['name']}:{type_text(f['type'])}" for f in spark_type["fields"])
        return f"struct<{inner}>"
    if kind == "array":
        return f"array<{type_text(spark_type['elementType'])}>"
    if kind == "map":
        return f"map<{type_text(spark_type['keyType'])},{type_text(spark_type['valueType'])}>"
    return str(kind)


def arrow_type(spark_type: SparkType, *, canonical: bool) -> pa.DataType:
    """The Arrow type Spark uses for `spark_type`; `canonical`: the storable form."""
    if isinstance(spark_type, dict) and spark_type.get("type") == "struct":
        names = (
            canonical_names(spark_type) if canonical else [f["name"] for f in spark_type["fields"]]
        )
        return pa.struct(
            [
                pa.field(name, arrow_type(f["type"], canonical=canonical), f.get("nullable", True))
                for name, f in zip(names, spark_type["fields"], strict=True)
            ]
        )
    if isinstance(spark_type, str) and spark_type in NULL_TYPES and canonical:
        return pa.bool_()  # Delta has no null type
    from pyspark.sql.pandas.types import to_arrow_type

    return to_arrow_type(spark_data_type(spark_type), timezone="UTC")


def spark_data_type(spark_type: SparkType) -> Any:
    """A pyspark DataType from its schema JSON."""
    from pyspark.sql.types import _parse_datatype_json_value

    return _parse_datatype_json_value(spark_type)


def reshape(array: pa.Array, spark_type: SparkType, *, canonical: bool) -> pa.Array:
    """Convert an array between Spark's Arrow form and the canonical form of a type.

    Field order and values are kept; names and null-typed fields change.
    """
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if isinstance(spark_type, dict) and spark_type.get("type") == "struct":
        target = arrow_type(spark_type, canonical=canonical)
        children = [
            reshape(child, f["type"], canonical=canonical)
            for child, f in zip(array.flatten(), spark_type["fields"], strict=True)
        ]
        mask = array.is_null() if array.null_count else None
        return pa.StructArray.from_arrays(children, fields=list(target), mask=mask)
    if isinstance(spark_type, str) and spark_type in NULL_TYPES:
        return pa.nulls(len(array), pa.bool_() if canonical else pa.null())
    target = arrow_type(spark_type, canonical=canonical)
    return array if array.type == target else array.cast(target)


@dataclass(frozen=True)
class FieldSource:
    """Where a new value field comes from: an old field (by index), or a fill value."""

    old_index: int | None
    fill: Any = None


@dataclass(frozen=True)
class ValuePlan:
    """How to turn the savepoint's value struct into the new job's."""

    sources: list[FieldSource]
    warnings: list[str] = field(default_factory=list)

    def apply(self, old: pa.Array, new_type: dict[str, Any]) -> pa.Array:
        """Old canonical value structs -> new canonical value structs."""
        if isinstance(old, pa.ChunkedArray):
            old = old.combine_chunks()
        target = arrow_type(new_type, canonical=True)
        children = old.flatten()
        arrays = []
        for source, target_field in zip(self.sources, target, strict=True):
            if source.old_index is None:
                fill = pa.scalar(source.fill, target_field.type)
                arrays.append(pa.repeat(fill, len(old)))
            else:
                child = children[source.old_index]
                same = child.type == target_field.type
                arrays.append(child if same else child.cast(target_field.type))
        return pa.StructArray.from_arrays(arrays, fields=list(target))


def check_compatible(
    uid: str, old_key: dict, old_value: dict, new_key: dict, new_value: dict
) -> ValuePlan:
    """Check that the new job's state types can hold the savepoint's state.

    Raises:
        StateSchemaError: naming the uid, the field, the old and the new type, and the fix.
    """
    _check_key(uid, old_key, new_key)
    return _plan_value(uid, old_value, new_value)


def _check_key(uid: str, old: dict, new: dict) -> None:
    old_fields, new_fields = old["fields"], new["fields"]
    for position in range(max(len(old_fields), len(new_fields))):
        before = old_fields[position] if position < len(old_fields) else None
        after = new_fields[position] if position < len(new_fields) else None
        if before and after and before["name"] == after["name"]:
            if before["type"] == after["type"]:
                continue
            raise StateSchemaError(
                f"operator {uid!r}: key field {after['name']!r} is "
                f"{type_text(before['type'])} in the savepoint but {type_text(after['type'])} "
                "in the new job; a key must keep its type (it decides the key's partition "
                f"and stored bytes); {FIX}"
            )
        old_text = f"{before['name']!r} ({type_text(before['type'])})" if before else "nothing"
        new_text = f"{after['name']!r} ({type_text(after['type'])})" if after else "nothing"
        raise StateSchemaError(
            f"operator {uid!r}: key field {position + 1} is {old_text} in the savepoint but "
            f"{new_text} in the new job; a key must keep its fields "
            f"(savepoint key {type_text(old)}, new key {type_text(new)}); {FIX}"
        )


def _plan_value(uid: str, old: dict, new: dict) -> ValuePlan:
    old_names = canonical_names(old)
    old_index = {name: i for i, name in enumerate(old_names)}
    sources, warnings = [], []
    for name, target in zip(canonical_names(new), new["fields"], strict=True):
        if name not in old_index:
            sources.append(_new_field(uid, name, target, warnings))
            continue
        index = old_index[name]
        before = old["fields"][index]["type"]
        if before != target["type"] and not _widens(before, target["type"]):
            raise StateSchemaError(
                f"operator {uid!r}: value field {name!r} is {type_text(before)} in the "
                f"savepoint but {type_text(target['type'])} in the new job, which cannot "
                f"hold it; {FIX}"
            )
        sources.append(FieldSource(index))
    dropped = sorted(set(old_names) - set(canonical_names(new)))
    if dropped:
        warnings.append(
            f"operator {uid!r}: value field(s) {dropped} of the savepoint are not in the new "
            "job; their values are dropped"
        )
    return ValuePlan(sources, warnings)


def _new_field(uid: str, name: str, target: dict, warnings: list[str]) -> FieldSource:
    kind = target["type"]
    if target.get("nullable", True):
        warnings.append(
            f"operator {uid!r}: value field {name!r} ({type_text(kind)}) is new; restored "
            "keys start with null"
        )
        return FieldSource(None, None)
    zero = _ZERO.get(kind) if isinstance(kind, str) else None
    if zero is None and isinstance(kind, str) and kind.startswith("decimal"):
        zero = 0
    if zero is None:
        raise StateSchemaError(
            f"operator {uid!r}: value field {name!r} ({type_text(kind)}, not nullable) is new "
            "and has no value in the savepoint; make it nullable, or set it with the state "
            "processor API and restore from the new savepoint"
        )
    warnings.append(
        f"operator {uid!r}: value field {name!r} ({type_text(kind)}, not nullable) is new; "
        f"restored keys start with {zero!r}"
    )
    return FieldSource(None, zero)


def _widens(before: SparkType, after: SparkType) -> bool:
    if before in _INTEGRAL and after in _INTEGRAL:
        return _INTEGRAL.index(before) <= _INTEGRAL.index(after)
    if before == "float" and after == "double":
        return True
    if isinstance(before, str) and isinstance(after, str) and before.startswith("decimal("):
        if after.startswith("decimal("):
            p1, s1 = (int(x) for x in before[8:-1].split(","))
            p2, s2 = (int(x) for x in after[8:-1].split(","))
            return s1 == s2 and p2 >= p1
    return False
