"""Commands to a running job through object storage: savepoint, stop, cancel.

    jobs/{job}/commands/{id}.json          the command; the sender puts it if absent
    jobs/{job}/commands/{id}.result.json   its result; the runner puts it if absent
    jobs/{job}/command-log/{id}.json       the runner's record: claimed, then answered

A sender (the CLI on another host, an Airflow worker) needs nothing but the storage
root. The runner lists only `commands/` between batches (it holds commands not yet
answered and acknowledged, so the listing stays small) and executes each command once:

- the same id sent twice is one object (put-if-absent); a retried sender gets the
  stored command back, or an error if it asked for something else under that id;
- before executing, the runner claims the id in the command log (put-if-absent, with
  its epoch), so no runner, this one or a later one, executes it a second time; a
  command claimed by a runner that ended before answering is answered `failed` by the
  next owner (it may or may not have taken effect: the reason says where to look);
- the result is put-if-absent too, after the log records it: a lost result is
  published again from the log, never computed again.

Reading a result and acknowledging it (`acknowledge`) removes the pair from
`commands/`; the command log keeps the record. Pyspark-free: the client uses it.
"""

from __future__ import annotations

import os
import re
import socket
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

from streamkeeper import injection
from streamkeeper.errors import CommandError
from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.storage import ObjectStore

CommandKind = Literal["savepoint", "stop", "cancel"]
SavepointFormat = Literal["native", "canonical"]
ResultState = Literal["ok", "failed"]

COMMAND_KINDS: tuple[str, ...] = get_args(CommandKind)
SAVEPOINT_FORMATS: tuple[str, ...] = get_args(SavepointFormat)
DEFAULT_TTL = 600.0  # a command nobody picked up by then is answered `failed` (expired)
_COMMAND_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$")  # no dots: `.result` is ours
_RESULT_SUFFIX = ".result.json"
_HOLDER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9:._-]{0,119}$")


def new_command_id(kind: str) -> str:
    """A fresh id that sorts by sending time, e.g. `savepoint-20270115T080000-1a2b3c4d`."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    return f"{kind}-{stamp}-{uuid.uuid4().hex[:8]}"


def check_command_id(command_id: str) -> str:
    """Raises CommandError unless `command_id` is a valid command id."""
    if not _COMMAND_ID.fullmatch(command_id):
        raise CommandError(
            f"command id {command_id!r} is not valid; use 1-100 letters, digits, '-' or '_', "
            "starting with a letter or digit (or omit it to get a generated one)"
        )
    return command_id


@dataclass(frozen=True)
class Command:
    """What a sender asks of a running job."""

    id: str
    kind: CommandKind
    job: str
    format: SavepointFormat = "native"  # savepoint, stop
    self_contained: bool = False  # savepoint, stop: copy the files into the savepoint
    savepoint: bool = True  # stop: take a savepoint first (the default)
    # savepoint, stop: the savepoint is born held by this holder (e.g. `upgrade:{id}`: an
    # upgrade's rollback target), so retention can never delete it before the holder acts.
    hold: str | None = None
    sent_at: float = field(default_factory=time.time)
    expires_at: float | None = None
    sender: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")

    def __post_init__(self) -> None:
        check_command_id(self.id)
        self._check_types()
        if self.kind not in COMMAND_KINDS:
            raise CommandError(
                f"command kind {self.kind!r} is unknown; expected one of {COMMAND_KINDS}"
            )
        if self.format not in SAVEPOINT_FORMATS:
            raise CommandError(
                f"savepoint format {self.format!r} is unknown; expected one of {SAVEPOINT_FORMATS}"
            )
        if self.hold is not None and not _HOLDER.fullmatch(str(self.hold)):
            raise CommandError(
                f"hold {self.hold!r} is not a holder name; use 1-120 letters, digits, ':', "
                "'.', '-' or '_', e.g. 'upgrade:up-20270115-1a2b'"
            )
        if self.expires_at is None:
            object.__setattr__(self, "expires_at", self.sent_at + DEFAULT_TTL)

    def _check_types(self) -> None:
        """A command file written by hand (not by the client) is refused naming the field."""
        times = {"sent_at": self.sent_at, "expires_at": self.expires_at}
        flags = {"self_contained": self.self_contained, "savepoint": self.savepoint}
        bad = [
            f"{k} {v!r} is not a time (seconds since the epoch)"
            for k, v in times.items()
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float))
        ]
        bad += [
            f"{k} {v!r} is not true or false" for k, v in flags.items() if not isinstance(v, bool)
        ]
        if bad:
            raise CommandError(
                f"command {self.id!r}: {'; '.join(bad)}; send commands with the client "
                "(`streamkeeper savepoint|stop`, or StreamkeeperClient.send_command)"
            )

    @property
    def takes_savepoint(self) -> bool:
        return self.kind == "savepoint" or (self.kind == "stop" and self.savepoint)

    def asks_the_same_as(self, other: Command) -> bool:
        """Whether `other` is this request again (a retried sender), whenever it was sent."""
        return self._request() == other._request()

    def _request(self) -> tuple:
        return (
            self.id,
            self.kind,
            self.job,
            self.format,
            self.self_contained,
            self.savepoint,
            self.hold,
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Command:
        """Raises CommandError naming the bad field if `data` is no valid command."""
        try:
            return cls(**{k: data[k] for k in data if k in cls.__dataclass_fields__})
        except TypeError as error:
            raise CommandError(f"malformed command {data!r}: {error}") from None


@dataclass(frozen=True)
class CommandResult:
    """What the runner did with a command. `state` is ok or failed (with error and reason)."""

    id: str
    kind: str
    state: ResultState
    savepoint_id: str | None = None
    error: str | None = None  # the error's type, e.g. SavepointError
    reason: str | None = None  # what happened and what to do, for a person
    epoch: int | None = None  # the runner that executed it
    received_at: float | None = None  # when the runner picked it up
    started_at: float | None = None
    finished_at: float | None = None
    timings: dict[str, float] = field(default_factory=dict)  # milliseconds per step
    details: dict[str, Any] = field(default_factory=dict)  # e.g. seq, drained batch

    @property
    def ok(self) -> bool:
        return self.state == "ok"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CommandResult:
        return cls(**{k: data[k] for k in data if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class CommandRecord:
    """The command log's entry: who claimed the command, and its result once answered."""

    id: str
    epoch: int
    claimed_at: float
    command: dict[str, Any]
    result: dict[str, Any] | None = None


_RECORD_FIELDS = frozenset(CommandRecord.__dataclass_fields__)


class CommandBox:
    """One job's commands folder, for senders and for the runner."""

    def __init__(self, store: ObjectStore, layout: LineageLayout) -> None:
        self.store = store
        self.layout = layout

    # -- senders -----------------------------------------------------------------------

    def send(self, command: Command) -> Command:
        """Put the command unless its id exists; returns the stored command.

        Raises:
            CommandError: the id was used for another request.
        """
        key = self.layout.command(command.id)
        # Answered and acknowledged, its file is gone: the log keeps what it was. Read
        # first, so that an id used before is never queued again for another request.
        record = self.record(command.id)
        if record is None and self.store.create_json(key, command.to_json()):
            return command
        stored = self._stored_command(command.id)
        if stored is None and record is not None:
            stored = Command.from_json(record.command)
        if stored is not None and stored.asks_the_same_as(command):
            return stored
        raise CommandError(
            f"command id {command.id!r} of job {command.job!r} was already used for another "
            f"command ({None if stored is None else stored.to_json()}); use a new id, or omit "
            "it to get a generated one"
        )

    def result(self, command_id: str) -> CommandResult | None:
        """The command's result, or None while it is not answered.

        Raises:
            CommandError: `command_id` is no command id (e.g. a path).
        """
        data = self.store.read_json(self.layout.command_result(check_command_id(command_id)))
        if data is None:
            record = self.record(command_id)
            data = None if record is None else record.result
        return None if data is None else CommandResult.from_json(data)

    def wait(self, command_id: str, timeout: float, poll: float = 0.5) -> CommandResult:
        """Wait for the command's result.

        Raises:
            CommandError: no result within `timeout` seconds (the command stays queued).
        """
        deadline = time.monotonic() + timeout
        while True:
            result = self.result(command_id)
            if result is not None:
                return result
            if time.monotonic() >= deadline:
                raise CommandError(
                    f"no result for command {command_id!r} of job {self.layout.job!r} after "
                    f"{timeout:g}s; is the job running? (`streamkeeper status "
                    f"{self.layout.job}`); wait longer, or read it later with its id"
                )
            injection.reached("awaiting_command_result", command_id=command_id)
            time.sleep(poll)

    def withdraw(self, command_id: str, reason: str) -> bool:
        """Take back a command no runner claimed: it is answered `failed` and never runs.

        The withdrawal is a claim of its own (epoch 0: no runner's), put-if-absent, so it
        and a runner's claim exclude each other.

        Returns:
            True if no runner executes it (withdrawn now or before, or never sent);
            False if a runner claimed it first: its answer is the one to wait for.
        """
        now = time.time()
        stored = self._stored_command(check_command_id(command_id))
        result = CommandResult(
            id=command_id,
            kind="unknown" if stored is None else stored.kind,
            state="failed",
            error="Withdrawn",
            reason=reason,
            epoch=0,
            received_at=now,
            started_at=now,
            finished_at=now,
        )
        record = CommandRecord(
            id=command_id, epoch=0, claimed_at=now, command={}, result=result.to_json()
        )
        key = self.layout.command_record(check_command_id(command_id))
        if not self.store.create_json(key, asdict(record)):
            existing = self.record(command_id)
            return existing is not None and existing.epoch == 0
        self.publish(command_id, result)
        return True

    def acknowledge(self, command_id: str) -> None:
        """Remove an answered command from `commands/` (the command log keeps its record).

        The command goes first: a result without its command is never executed again.
        """
        if self.record(command_id) is None or self.result(command_id) is None:
            return  # not answered yet: acknowledging would lose the command
        self.store.delete([self.layout.command(command_id)])
        self.store.delete([self.layout.command_result(command_id)])

    def record(self, command_id: str) -> CommandRecord | None:
        """The command log's record of the command (None if no runner claimed it).

        Raises:
            CommandError: `command_id` is no command id, or its record is malformed.
        """
        key = self.layout.command_record(check_command_id(command_id))
        data = self.store.read_json(key)
        if data is None:
            return None
        try:
            return CommandRecord(**{k: data[k] for k in data if k in _RECORD_FIELDS})
        except TypeError as error:
            raise CommandError(
                f"command record {key!r} is malformed ({error}); it was changed outside "
                "streamkeeper: restore it from a backup, or send the command again under a "
                "new id"
            ) from None

    # -- the runner --------------------------------------------------------------------

    def pending(self) -> list[str]:
        """Ids of commands without a result, by id (one listing)."""
        keys = self.store.list(self.layout.commands)
        names = {k.rsplit("/", 1)[-1] for k in keys}
        ids = [
            name[: -len(".json")]
            for name in names
            if name.endswith(".json") and not name.endswith(_RESULT_SUFFIX)
        ]
        return sorted(i for i in ids if f"{i}{_RESULT_SUFFIX}" not in names)

    def answered(self) -> list[str]:
        """Ids of commands answered but not acknowledged (one listing)."""
        names = {k.rsplit("/", 1)[-1] for k in self.store.list(self.layout.commands)}
        return sorted(n[: -len(_RESULT_SUFFIX)] for n in names if n.endswith(_RESULT_SUFFIX))

    def read(self, command_id: str) -> Command | None:
        """The pending command (None if it was acknowledged meanwhile).

        Raises:
            CommandError: it is malformed (the error names the bad value).
        """
        return self._stored_command(command_id)

    def claim(
        self, command: dict[str, Any], command_id: str, epoch: int
    ) -> tuple[CommandRecord, bool]:
        """Claim a command for execution by `epoch`.

        Returns:
            The record that holds the command, and whether this call claimed it: only
            then may the caller execute it.
        """
        record = CommandRecord(id=command_id, epoch=epoch, claimed_at=time.time(), command=command)
        if self.store.create_json(self.layout.command_record(command_id), asdict(record)):
            return record, True
        existing = self.record(command_id)
        if existing is None:  # deleted in between: nothing to do but try again later
            raise CommandError(f"command record {command_id!r} vanished while claimed")
        return existing, False

    def answer(self, record: CommandRecord, result: CommandResult) -> CommandResult:
        """Record the result in the log, then publish it; returns the published result."""
        self.store.write_json(
            self.layout.command_record(record.id), asdict(record) | {"result": result.to_json()}
        )
        return self.publish(record.id, result)

    def publish(self, command_id: str, result: CommandResult) -> CommandResult:
        """Put the result unless one exists; returns the one that exists."""
        key = self.layout.command_result(command_id)
        if self.store.create_json(key, result.to_json()):
            return result
        stored = self.store.read_json(key)
        return result if stored is None else CommandResult.from_json(stored)

    def _stored_command(self, command_id: str) -> Command | None:
        try:
            data = self.store.read_json(self.layout.command(command_id))
        except ValueError as error:
            raise CommandError(
                f"command {command_id!r} of job {self.layout.job!r} is not valid JSON ({error})"
            ) from None
        return None if data is None else Command.from_json(data)
