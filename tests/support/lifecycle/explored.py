"""What the lifecycle property test explored: for its deep profile's report
(benchmarks/lifecycle_explore.py) and for the CI run's summary line."""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Explored:
    examples: int = 0  # examples that ran to the end and were checked exact
    steps: Counter[str] = field(default_factory=Counter)  # pause points reached
    crashes: Counter[str] = field(default_factory=Counter)  # where actors were killed
    actors: set[str] = field(default_factory=set)
    traces: set[str] = field(default_factory=set)  # distinct interleavings (hashes)
    _trace: list[str] = field(default_factory=list)

    def point(self, point: str | None) -> None:
        if point is not None:
            self.steps[point] += 1
            self._trace.append(point)

    def crash(self, point: str | None) -> None:
        self.crashes[point or "finished"] += 1
        self._trace.append(f"crash@{point}")

    def end_example(self) -> None:
        self.examples += 1
        self.traces.add(hashlib.sha256("|".join(self._trace).encode()).hexdigest())
        self._trace.clear()

    def summary(self) -> str:
        return (
            f"{self.examples} examples, {len(self.traces)} distinct interleavings, "
            f"{sum(self.steps.values())} steps at {len(self.steps)} points, "
            f"{sum(self.crashes.values())} crashes at {len(self.crashes)} points, "
            f"actors {sorted(self.actors)}"
        )


EXPLORED = Explored()
