"""The runner's side of commands: picked up between batches, executed once, answered.

`CommandExecutor.poll` runs on the supervisor's loop (cheap: one listing of the
commands folder every `interval` seconds). Only the lineage's owner executes: every
claim and answer passes the fence. See lineage/commands.py for the protocol.

A stop or cancel is answered once the query has stopped (`finish_deferred`), after the
heartbeat recorded STOPPED, so a sender that reads `ok` finds the job stopped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from streamkeeper.errors import FencedError
from streamkeeper.lineage.commands import (
    Command,
    CommandBox,
    CommandError,
    CommandRecord,
    CommandResult,
)
from streamkeeper.lineage.control import Fence

log = logging.getLogger(__name__)

ACKNOWLEDGE_AFTER_SECONDS = 3600.0  # answered results nobody acknowledged are archived


@dataclass
class Outcome:
    """What a handler did; `deferred`: answered later, once the query stopped."""

    ok: bool = True
    savepoint_id: str | None = None
    error: str | None = None
    reason: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    deferred: bool = False


Handler = Callable[[Command], Outcome]


@dataclass
class _Deferred:
    record: CommandRecord
    command: Command
    received_at: float
    started_at: float
    outcome: Outcome


class CommandExecutor:
    """Executes commands of one job for the runner that owns its lineage."""

    def __init__(
        self,
        box: CommandBox,
        fence: Fence,
        handlers: dict[str, Handler],
        interval: float = 1.0,
    ) -> None:
        self.box = box
        self.fence = fence
        self.handlers = handlers
        self.interval = interval
        self.deferred: _Deferred | None = None
        self._seen: set[str] = set()  # handled by this runner: not looked at again
        self._next_poll = 0.0

    def poll(self, now: float | None = None) -> None:
        """Execute the commands waiting, if a poll is due and no stop is under way.

        Raises:
            FencedError: this runner lost the lineage (nothing is answered).
        """
        now = time.monotonic() if now is None else now
        if now < self._next_poll or self.deferred is not None:
            return
        self._next_poll = now + self.interval
        waiting = [self._read(i) for i in self.box.pending() if i not in self._seen]
        # In the order they were sent (ids may be the senders' own); malformed ones first.
        for command_id, command, raw in sorted(filter(None, waiting), key=_sending_order):
            self._seen.add(command_id)
            self._handle(command_id, command, raw)
            if self.deferred is not None:
                break  # stopping: later commands wait for the next start

    def _read(self, command_id: str) -> tuple[str, Command | None, dict[str, Any]] | None:
        try:
            command = self.box.read(command_id)
        except CommandError as error:  # malformed: claimed, then answered failed
            return command_id, None, {"id": command_id, "error": str(error)}
        return None if command is None else (command_id, command, command.to_json())

    def _handle(self, command_id: str, command: Command | None, raw: dict[str, Any]) -> None:
        received = time.time()
        self.fence.check()
        record, claimed = self.box.claim(raw, command_id, self.fence.epoch)
        # Our own claim whose answer was lost (a runner handles an id once): execute it.
        ours = record.epoch == self.fence.epoch and record.result is None
        if not claimed and not ours:
            self._claimed_before(record)
            return
        if command is None:
            self._answer(record, None, received, received, _failed(CommandError(raw["error"])))
            return
        if command.expires_at is not None and received > command.expires_at:
            reason = (
                f"expired: sent at {command.sent_at:.0f} by {command.sender}, not picked up "
                f"before {command.expires_at:.0f}; send it again"
            )
            expired = Outcome(False, None, "Expired", reason)
            self._answer(record, command, received, received, expired)
            return
        self._execute(record, command, received)

    def _execute(self, record: CommandRecord, command: Command, received: float) -> None:
        started = time.time()
        log.info("executing command %s (%s)", command.id, command.kind)
        try:
            outcome = self.handlers[command.kind](command)
        except FencedError:
            raise
        except Exception as error:  # noqa: BLE001 - answered as failed, the job goes on
            log.warning("command %s failed: %s", command.id, error, exc_info=True)
            outcome = _failed(error)
        if outcome.deferred:
            self.deferred = _Deferred(record, command, received, started, outcome)
            return
        self._answer(record, command, received, started, outcome)

    def finish_deferred(self, ok: bool, reason: str | None = None, **details: Any) -> None:
        """Answer the stop or cancel under way, now that the query stopped (or failed)."""
        if self.deferred is None:
            return
        waiting, self.deferred = self.deferred, None
        outcome = waiting.outcome
        outcome.ok = outcome.ok and ok
        outcome.reason = reason or outcome.reason
        outcome.details.update(details)
        if not ok:
            outcome.error = outcome.error or "StopFailed"
        started = waiting.started_at
        outcome.timings["until_stopped"] = round((time.time() - started) * 1000, 1)
        self._answer(waiting.record, waiting.command, waiting.received_at, started, outcome)

    def _answer(
        self,
        record: CommandRecord,
        command: Command | None,
        received: float,
        started: float,
        outcome: Outcome,
    ) -> None:
        result = CommandResult(
            id=record.id,
            kind=command.kind if command is not None else str(record.command.get("kind")),
            state="ok" if outcome.ok else "failed",
            savepoint_id=outcome.savepoint_id,
            error=outcome.error,
            reason=outcome.reason,
            epoch=self.fence.epoch,
            received_at=received,
            started_at=started,
            finished_at=time.time(),
            timings=outcome.timings,
            details=outcome.details,
        )
        self.fence.check()  # a fenced runner records nothing
        self.box.answer(record, result)
        log.info("command %s answered: %s %s", record.id, result.state, result.reason or "")

    def _claimed_before(self, record: CommandRecord) -> None:
        """Claimed by an earlier runner (or an earlier try of ours): never executed again."""
        if record.result is not None:
            self.box.publish(record.id, CommandResult.from_json(record.result))  # a lost publish
            return
        if record.epoch >= self.fence.epoch:
            return  # ours already, or a newer owner's (the fence will tell)
        reason = (
            f"interrupted: runner epoch {record.epoch} claimed it and ended before answering; "
            "it may have taken effect (see `streamkeeper savepoints` and `status`); send it "
            "again if needed"
        )
        command = Command.from_json(record.command) if "kind" in record.command else None
        now = time.time()
        self._answer(record, command, now, now, Outcome(False, None, "Interrupted", reason))

    def acknowledge_old_results(self, now: float | None = None) -> None:
        """At start: archive results nobody acknowledged for an hour (bounds the folder)."""
        now = time.time() if now is None else now
        for command_id in self.box.answered():
            result = self.box.result(command_id)
            finished = None if result is None else result.finished_at
            if finished is not None and now - finished > ACKNOWLEDGE_AFTER_SECONDS:
                self.box.acknowledge(command_id)


def _sending_order(item: tuple[str, Command | None, dict[str, Any]]) -> tuple[float, str]:
    command_id, command, _raw = item
    return (0.0 if command is None else command.sent_at, command_id)


def _failed(error: BaseException) -> Outcome:
    return Outcome(ok=False, error=type(error).__name__, reason=str(error))
