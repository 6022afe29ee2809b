"""The polling loop every streamkeeper trigger shares.

A trigger holds nothing but its serialized arguments (it may be moved to another
triggerer, or run twice): the baseline, the run token, the absolute deadline are
arguments computed by the operator before it defers. Each poll calls the trigger's
synchronous `check` (control-plane reads through the pyspark-free client) in a thread,
so the triggerer's event loop never blocks on storage.

A poll that raises (storage timing out, a 503, a dropped connection) is tolerated up to
`tolerated_failures` times in a row, each logged with its error redacted, and the next
poll tries again: one S3 timeout must not fail a probation and roll back a healthy green.
The next failure after that is reported; a successful poll resets the count.

Events are `{"status": "success" | "error", "message": ..., "job": ..., ...}`; the
operator's `execute_complete` raises on "error". No event holds a credential.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from airflow.triggers.base import BaseTrigger, TriggerEvent

from streamkeeper_airflow.secrets import redact

if TYPE_CHECKING:
    from streamkeeper_airflow.hooks.streamkeeper import StreamkeeperHook

DEFAULT_POLL_SECONDS = 5.0
# Seconds before the first check. Airflow 3.3's scheduler fails a resumed task when the
# trigger fires before it has drained the executor's event of the deferring attempt
# (apache/airflow#72716, #66374); waiting first leaves it that time.
SETTLE_SECONDS = 5.0
# How long storage may be unreachable (plus the client's own retries) before a wait fails:
# by default a trigger tolerates as many failed polls in a row as fit in it (3 at 5 s).
TOLERATED_OUTAGE_SECONDS = 15.0


def tolerated_failures_for(poll_interval: float) -> int:
    """Failed polls in a row that span TOLERATED_OUTAGE_SECONDS at this interval."""
    return max(1, math.ceil(TOLERATED_OUTAGE_SECONDS / poll_interval))


@dataclass(frozen=True)
class Check:
    """One poll's verdict: done (with a success or error payload) or still waiting."""

    done: bool
    payload: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def success(cls, message: str, **facts: Any) -> Check:
        return cls(True, {"status": "success", "message": message, **facts})

    @classmethod
    def error(cls, message: str, **facts: Any) -> Check:
        return cls(True, {"status": "error", "message": message, **facts})

    @classmethod
    def waiting(cls, message: str, **facts: Any) -> Check:
        return cls(False, {"status": "waiting", "message": message, **facts})


class ControlPlaneTrigger(BaseTrigger):
    """Polls one job's control plane until `check` is done or the deadline passes.

    Args:
        conn_id: the Airflow connection of the storage root.
        job: the job's name.
        root: the storage root, if not the connection's.
        poll_interval: seconds between polls.
        deadline: seconds since the epoch after which the trigger reports an error.
        settle: seconds before the first check (see SETTLE_SECONDS).
        tolerated_failures: polls that raise, in a row, before the error is reported
            (default: as many as span TOLERATED_OUTAGE_SECONDS).
    """

    def __init__(
        self,
        *,
        conn_id: str,
        job: str,
        root: str | None = None,
        poll_interval: float = DEFAULT_POLL_SECONDS,
        deadline: float | None = None,
        settle: float = SETTLE_SECONDS,
        tolerated_failures: int | None = None,
    ) -> None:
        super().__init__()
        if float(poll_interval) <= 0:
            raise ValueError(f"poll_interval {poll_interval!r} is not positive; expected seconds")
        if tolerated_failures is None:
            tolerated_failures = tolerated_failures_for(float(poll_interval))
        if int(tolerated_failures) < 0:
            raise ValueError(
                f"tolerated_failures {tolerated_failures!r} is negative; expected 0 (report "
                "the first failed poll) or more"
            )
        self.conn_id = conn_id
        self.job = job
        self.root = root
        self.poll_interval = float(poll_interval)
        self.deadline = deadline
        self.settle = float(settle)
        self.tolerated_failures = int(tolerated_failures)

    def _base_kwargs(self) -> dict[str, Any]:
        return {
            "conn_id": self.conn_id,
            "job": self.job,
            "root": self.root,
            "poll_interval": self.poll_interval,
            "deadline": self.deadline,
            "settle": self.settle,
            "tolerated_failures": self.tolerated_failures,
        }

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{type(self).__module__}.{type(self).__qualname__}", self._kwargs()

    def _kwargs(self) -> dict[str, Any]:
        """Every constructor argument (subclasses add theirs)."""
        return self._base_kwargs()

    def check(self, hook: StreamkeeperHook, now: float) -> Check:
        """One synchronous poll (runs in a thread)."""
        raise NotImplementedError

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = None
        said = None  # the last message logged (a local, not trigger state)
        failures = 0  # failed polls in a row (a local: a moved trigger starts afresh)
        await asyncio.sleep(self.settle)
        while True:
            try:
                hook = hook or await hook_for(self.conn_id, self.root)
                verdict = await asyncio.to_thread(self.check, hook, time.time())
            except Exception as error:  # noqa: BLE001 - tolerated, then reported
                failures += 1
                secrets = () if hook is None else hook.settings.secrets
                message = redact(f"{type(error).__name__}: {error}", secrets)
                if failures > self.tolerated_failures:
                    if failures > 1:
                        message = f"{message} ({failures} polls failed in a row)"
                    yield TriggerEvent(self._event({"status": "error", "message": message}))
                    return
                self.log.warning(
                    "%s: poll failed (%d of %d tolerated in a row), trying again in %.1f s: %s",
                    self.job,
                    failures,
                    self.tolerated_failures,
                    self.poll_interval,
                    message,
                )
                verdict = Check.waiting(f"the last poll failed: {message}")
            else:
                failures = 0
                if verdict.done:
                    # Under the trigger's own logger, so the triggerer's log names which
                    # trigger decided, even one that fired on its first poll.
                    self.log.info("%s: %s", self.job, verdict.payload.get("message"))
                    yield TriggerEvent(self._event(verdict.payload))
                    return
            if self.deadline is not None and time.time() >= self.deadline:
                yield TriggerEvent(self._timed_out(verdict.payload))
                return
            if not failures and verdict.payload.get("message") != said:
                said = verdict.payload.get("message")
                self.log.info("%s: %s", self.job, said)
            await asyncio.sleep(self.poll_interval)

    def _timed_out(self, last: dict[str, Any]) -> dict[str, Any]:
        return {
            **last,
            "status": "error",
            "message": f"gave up waiting at the deadline; last seen: {last.get('message')}",
        }

    def _event(self, payload: dict[str, Any]) -> dict[str, Any]:
        return {"job": self.job, **payload}


async def hook_for(conn_id: str, root: str | None) -> StreamkeeperHook:
    """The hook, with its connection fetched asynchronously (imported late: parse time)."""
    from streamkeeper_airflow.hooks.streamkeeper import StreamkeeperHook

    hook = await StreamkeeperHook.for_trigger(conn_id, root)
    await asyncio.to_thread(lambda: hook.client)  # builds the storage client off the loop
    return hook


T = TypeVar("T")


async def watch_polls(
    trigger: BaseTrigger,
    poll: Callable[[StreamkeeperHook], T],
    *,
    conn_id: str,
    root: str | None,
    interval: float,
    what: str,
) -> AsyncIterator[T]:
    """What `poll(hook)` reads (in a thread) every `interval` seconds, forever: an event
    trigger's watch. A failed poll is logged, redacted, and the watch goes on (a watcher
    that gave up would leave its assets without events until the triggerer restarts)."""
    hook: StreamkeeperHook | None = None
    while True:
        try:
            hook = hook or await hook_for(conn_id, root)
            reading = await asyncio.to_thread(poll, hook)
        except Exception as error:  # noqa: BLE001 - a watcher keeps watching
            secrets = () if hook is None else hook.settings.secrets
            trigger.log.warning(
                "%s poll failed, trying again in %.1f s: %s",
                what,
                interval,
                redact(f"{type(error).__name__}: {error}", secrets),
            )
        else:
            yield reading
        await asyncio.sleep(interval)
