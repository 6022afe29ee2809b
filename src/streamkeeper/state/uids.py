"""Operator uids: stable names for a query's stateful operators (Flink's `uid()`).

Spark numbers stateful operators 0, 1, ... in plan order; a code change can renumber
them. A savepoint stores state by uid, so a restore finds each operator's state by name,
whatever its number in the new code. The spec's `state.operators` names them; without
it operator N is `op-N`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from streamkeeper.spec import StateSpec
from streamkeeper.state.errors import OperatorUidError
from streamkeeper.state.spark_state import OperatorInfo


def default_uid(operator_id: int) -> str:
    return f"op-{operator_id}"


def resolve_uids(
    state: StateSpec | Mapping[int, str] | None, operators: Sequence[OperatorInfo]
) -> dict[int, str]:
    """operator id -> uid for a query's operators, checked against the spec.

    Args:
        state: the spec's `state` section, or its `operator_uids()`; None or empty:
            default uids `op-N`.
        operators: the query's stateful operators (`spark_state.read_operators`).

    Raises:
        OperatorUidError: the spec names an operator the query does not have, or leaves
            one of its operators without a uid.
    """
    declared = dict(state.operator_uids() if isinstance(state, StateSpec) else state or {})
    if not declared:
        return {op.operator_id: default_uid(op.operator_id) for op in operators}
    known = {op.operator_id: op for op in operators}
    listing = ", ".join(op.describe() for op in operators) or "none"
    unknown = sorted(set(declared) - set(known))
    if unknown:
        names = [declared[i] for i in unknown]
        raise OperatorUidError(
            f"state.operators gives uid(s) {names} to operator id(s) {unknown}, but the query's "
            f"stateful operators are: {listing}; remove those entries or fix their operator_id"
        )
    missing = [known[i] for i in sorted(set(known) - set(declared))]
    if missing:
        suggestion = ", ".join(f"{{uid: <name>, operator_id: {op.operator_id}}}" for op in missing)
        raise OperatorUidError(
            f"stateful operator(s) {', '.join(op.describe() for op in missing)} have no uid in "
            f"state.operators; add {suggestion} (the query's operators are: {listing})"
        )
    return {i: declared[i] for i in sorted(declared)}
