"""Restarting a FAILED job with exponential back-off and a limit (the monitor DAG's job).

The back-off state lives in the control plane, not in a trigger or a worker:

    jobs/{job}/restarts.json   attempts since the job was last healthy, the last
                               restart's time and run token, written by compare-and-swap

Attempt 1 runs as soon as the monitor sees the job FAILED; attempt k+1 waits
`backoff * 2**(k-1)` (at most `max_backoff`) after attempt k; after `max_attempts` the
monitor gives up and alerts. The count resets once the job is healthy again: RUNNING
with a checkpoint committed after the last restart. The wait is checked when the monitor
runs, so its schedule bounds how soon a due restart happens (event-driven: the health
watcher fires again every 5 min while the job stays FAILED, triggers/health.py).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from streamkeeper.client import StatusReport
    from streamkeeper.storage import ObjectStore


def restarts_key(job: str) -> str:
    return f"jobs/{job}/restarts.json"


@dataclass(frozen=True)
class RestartPolicy:
    """Flink's exponential-delay restart strategy, counted per unhealthy period."""

    max_attempts: int = 3
    backoff: float = 60.0
    max_backoff: float = 1800.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts {self.max_attempts!r} must be at least 1")
        if self.backoff < 0 or self.max_backoff < self.backoff:
            raise ValueError(
                f"backoff {self.backoff!r}s and max_backoff {self.max_backoff!r}s: expected "
                "0 <= backoff <= max_backoff"
            )

    def delay_after(self, attempts: int) -> float:
        """The wait after the `attempts`-th restart before the next one (0 before the first)."""
        if attempts <= 0:
            return 0.0
        return min(self.backoff * 2 ** (attempts - 1), self.max_backoff)


@dataclass(frozen=True)
class RestartRecord:
    """`jobs/{job}/restarts.json`."""

    attempts: int = 0
    last_restart_at: float | None = None
    last_token: str | None = None
    history: list[dict[str, Any]] = field(default_factory=list)  # the last few restarts

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> RestartRecord:
        if not data:
            return cls()
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class RestartDecision:
    action: Literal["restart", "wait", "give_up", "retry"]  # retry: our own restart again
    attempt: int  # the attempt this restart is (or would be), 1-based
    not_before: float | None
    reason: str


def decide_restart(
    record: RestartRecord, policy: RestartPolicy, *, token: str, now: float
) -> RestartDecision:
    """Restart now, wait for the back-off, or give up (pure)."""
    if record.last_token == token and record.attempts > 0:
        return RestartDecision(
            "retry", record.attempts, None, f"attempt {record.attempts} is ours (a retried task)"
        )
    attempt = record.attempts + 1
    if record.attempts >= policy.max_attempts:
        return RestartDecision(
            "give_up",
            attempt,
            None,
            f"{record.attempts} restart(s) since the job was last healthy reach the limit "
            f"max_attempts={policy.max_attempts}",
        )
    not_before = (record.last_restart_at or 0.0) + policy.delay_after(record.attempts)
    if now < not_before:
        return RestartDecision(
            "wait",
            attempt,
            not_before,
            f"back-off: restart {attempt}/{policy.max_attempts} is due in "
            f"{not_before - now:.0f} s (after {policy.delay_after(record.attempts):.0f} s)",
        )
    return RestartDecision(
        "restart", attempt, None, f"restart {attempt}/{policy.max_attempts} is due"
    )


def healthy_again(record: RestartRecord, report: StatusReport) -> bool:
    """RUNNING with a checkpoint committed after the last restart: the count starts over."""
    if record.attempts == 0 or report.state != "RUNNING" or report.head is None:
        return False
    committed = report.head.committed_at
    return committed is not None and committed > (record.last_restart_at or 0.0)


class RestartLedger:
    """Reads and writes `jobs/{job}/restarts.json` by compare-and-swap."""

    def __init__(self, store: ObjectStore, job: str) -> None:
        self.store = store
        self.key = restarts_key(job)

    def read(self) -> tuple[RestartRecord, str | None]:
        data, version = self.store.read_versioned(self.key)
        return RestartRecord.from_json(data), version

    def record_attempt(
        self, record: RestartRecord, version: str | None, *, token: str, reason: str
    ) -> bool:
        """Count one restart; False if another monitor wrote first (it restarts, not us)."""
        now = time.time()
        entry = {"attempt": record.attempts + 1, "at": now, "token": token, "reason": reason}
        updated = replace(
            record,
            attempts=record.attempts + 1,
            last_restart_at=now,
            last_token=token,
            history=[*record.history[-9:], entry],
        )
        return self.store.write_if(self.key, updated.to_json(), version) is not None

    def reset(self, record: RestartRecord, version: str | None) -> bool:
        """Start counting over (the job is healthy again); keeps the history."""
        updated = replace(record, attempts=0, last_token=None)
        return self.store.write_if(self.key, updated.to_json(), version) is not None
