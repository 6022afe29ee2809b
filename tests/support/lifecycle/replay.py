"""Replay a falsifying example exactly as Hypothesis printed it.

The lifecycle machine labels every draw (`Draw 3 (actor): <takeover#1 at start>`), so
its printed report is a complete program: the rules in order, their arguments, and
which actor each draw picked. Replaying it needs no seed, blob or database, which
matters when a deep profile ran for an hour without printing a blob.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

_DRAW = re.compile(r"^Draw \d+ \((?P<label>\w+)\): (?P<value>.*)$")
_CALL = re.compile(r"^state\.(?P<rule>\w+)\((?P<args>.*)\)$")
_ACTOR = re.compile(r"^<(?P<name>\S+) (?P<state>.*)>$")


@dataclass
class Move:
    rule: str
    kwargs: dict[str, Any]
    draws: list[tuple[str, str]] = field(default_factory=list)  # (label, printed value)


def parse(report: str) -> list[Move]:
    """The moves of a printed falsifying example (draws belong to the call after them)."""
    moves: list[Move] = []
    pending: list[tuple[str, str]] = []
    for raw in report.splitlines():
        line = raw.strip()
        if match := _DRAW.match(line):
            pending.append((match["label"], match["value"]))
        elif match := _CALL.match(line):
            kwargs = _kwargs(match["args"])
            moves.append(Move(match["rule"], kwargs, pending))
            pending = []
    return moves


def _kwargs(text: str) -> dict[str, Any]:
    call = ast.parse(f"f({text})", mode="eval").body
    assert isinstance(call, ast.Call)
    values: dict[str, Any] = {}
    for keyword in call.keywords:
        if keyword.arg == "data":
            continue  # drawn: the Draw lines say what
        values[str(keyword.arg)] = ast.literal_eval(keyword.value)
    return values


class MoveNotApplicableError(Exception):
    """A move names an actor the world no longer has (it ended earlier after a fix)."""


class ScriptedData:
    """Stands in for `st.data()`: answers each draw with the value the report printed."""

    def __init__(self, draws: list[tuple[str, str]], diverged: list[str]) -> None:
        self._draws: Iterator[tuple[str, str]] = iter(draws)
        self._diverged = diverged

    def draw(self, strategy: Any, label: str | None = None) -> Any:
        printed_label, printed = next(self._draws)
        assert printed_label == label, f"draw {label!r}, the report has {printed_label!r}"
        elements = list(getattr(strategy, "wrapped_strategy", strategy).elements)
        actor = _ACTOR.match(printed)
        if actor is None:  # a savepoint id, or another plain value
            chosen = ast.literal_eval(printed)
            assert chosen in elements, f"{printed} is not among {elements}"
            return chosen
        by_name = {element.name: element for element in elements}
        if actor["name"] not in by_name:  # the fixed code ended it earlier than the run did
            raise MoveNotApplicableError(f"{printed}: not movable now ({elements})")
        chosen = by_name[actor["name"]]
        if repr(chosen) != printed:  # the world went another way than in the run
            self._diverged.append(f"{printed} is now {chosen!r}")
        return chosen


def replay(report: str, *, verbose: bool = False) -> list[str]:
    """Run the moves on a fresh machine; raises what the run raised. Returns divergences."""
    import os

    from tests.property.test_lifecycle_machine import LifecycleMachine

    before = os.environ.get("STREAMKEEPER_LIFECYCLE_NUMBERED_IDS")
    os.environ["STREAMKEEPER_LIFECYCLE_NUMBERED_IDS"] = "1"  # as the deep profile ran
    try:
        return _replay(LifecycleMachine(), report, verbose=verbose)
    finally:
        if before is None:
            os.environ.pop("STREAMKEEPER_LIFECYCLE_NUMBERED_IDS", None)
        else:
            os.environ["STREAMKEEPER_LIFECYCLE_NUMBERED_IDS"] = before


def _replay(machine: Any, report: str, *, verbose: bool) -> list[str]:
    diverged: list[str] = []
    try:
        for number, move in enumerate(parse(report)):
            method = getattr(machine, move.rule)
            if verbose:
                print(f"{number:3d} {move.rule}({move.kwargs}) {move.draws}")
            if move.draws:
                try:
                    method(data=ScriptedData(move.draws, diverged), **move.kwargs)
                except MoveNotApplicableError as skipped:
                    diverged.append(f"move {number} ({move.rule}) skipped: {skipped}")
                    continue
            elif move.rule == "teardown":
                break
            else:
                method(**move.kwargs)
            machine.holds()
        machine.teardown()
    finally:
        if machine.scene is not None:
            machine.scene.close()
    return diverged
