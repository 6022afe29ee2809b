"""Actors in lock step: real runtime code in threads that pause at every named point.

Each actor runs one operation of the real code (a runner's start and batches, a
rollback, a handover) in its own thread. The runtime's `injection` points and every
write to the object store are *steps*: there the actor's thread stops and hands control
back to the scheduler, which decides who moves next. Only one thread runs at a time, so
a run is a deterministic interleaving that Hypothesis can draw, replay and shrink.

A crash is a SIGKILL: the actor's thread is never resumed, so it writes nothing more and
runs no clean-up (`except BaseException` handlers included). Its blocked thread is
released only when the world is torn down, by an exception nobody in the runtime
catches for long (`_Released`), after which its writes go to a world that is gone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from streamkeeper import injection
from streamkeeper.commit.crashpoints import POINTS as COMMIT_POINTS
from streamkeeper.snapshots.savepoint_points import POINTS as SAVEPOINT_POINTS
from streamkeeper.upgrade.points import POINTS as LIFECYCLE_POINTS

# Where an actor may be interrupted: the protocols' crash points, the moments a Delta
# commit, fence or restore landed (a test may lose its answer there), and waits.
PAUSE_POINTS = (
    *COMMIT_POINTS,
    *SAVEPOINT_POINTS,
    *LIFECYCLE_POINTS,
    "batch_start",
    "before_table_commit",
    "table_commit_landed",
    "table_fence_landed",
    "table_restore_landed",
    "awaiting_command_result",
)
STEP_TIMEOUT = 120.0  # seconds one step may take before the scheduler calls it stuck


class _Released(BaseException):
    """Unwinds a crashed actor's thread when its world is torn down."""


class LostResponse(ConnectionResetError):
    """The write landed; its answer did not (what S3 clients see as a reset)."""


class StuckActorError(AssertionError):
    """An actor neither paused nor finished within STEP_TIMEOUT."""


class Actor:
    """One operation of real code, run step by step."""

    def __init__(self, name: str, operation: Callable[[Actor], Any]) -> None:
        self.name = name
        self.operation = operation
        self.at: str | None = None  # the point it is paused at
        self.steps = 0
        self.done = False
        self.crashed = False
        self.result: Any = None
        self.error: BaseException | None = None
        self.lose_next: set[str] = set()  # kinds of step whose answer is lost, once each
        self._resume = threading.Event()
        self._parked = threading.Event()
        self._released = False
        self._thread = threading.Thread(target=self._main, name=f"actor-{name}", daemon=True)

    # -- called by the scheduler -------------------------------------------------------

    def start(self) -> None:
        self._thread.start()
        self._wait_parked()

    def step(self) -> None:
        """Run until the next pause point, or to the end."""
        assert not self.done and not self.crashed, f"{self.name} cannot move"
        self._parked.clear()
        self._resume.set()
        self._wait_parked()

    def crash(self) -> None:
        """SIGKILL: never resumed again."""
        self.crashed = True

    def release(self) -> None:
        """Unwind a parked thread (teardown)."""
        if self._thread.is_alive() and not self.done:
            self._released = True
            self._resume.set()
            self._thread.join(timeout=10)

    @property
    def movable(self) -> bool:
        return not self.done and not self.crashed

    def __repr__(self) -> str:
        state = "crashed" if self.crashed else "done" if self.done else f"at {self.at}"
        return f"<{self.name} {state}>"

    # -- called from the actor's own thread --------------------------------------------

    def pause(self, point: str) -> None:
        self.at = point
        self.steps += 1
        self._resume.clear()
        self._parked.set()
        self._resume.wait()
        if self._released:
            raise _Released(point)

    def _main(self) -> None:
        _current.actor = self
        try:
            self.pause("start")
            self.result = self.operation(self)
        except _Released:
            return
        except BaseException as error:  # noqa: BLE001 - recorded: the machine judges it
            self.error = error
        finally:
            self.done = not self._released
            self.at = None
            self._parked.set()

    def _wait_parked(self) -> None:
        if not self._parked.wait(STEP_TIMEOUT):
            raise StuckActorError(f"actor {self.name} did not reach a step in {STEP_TIMEOUT}s")


class _Current(threading.local):
    actor: Actor | None = None


_current = _Current()


def current_actor() -> Actor | None:
    return _current.actor


def pause_here(point: str) -> None:
    """A step of the actor running this thread (none: a worker pool's thread, or the test)."""
    actor = current_actor()
    if actor is not None:
        actor.pause(point)


def lose_answer_if_asked(kind: str) -> None:
    """After a write landed: raise LostResponse if the test asked to lose this answer."""
    actor = current_actor()
    if actor is not None and kind in actor.lose_next:
        actor.lose_next.discard(kind)
        raise LostResponse(f"{actor.name}: the answer to {kind} was lost")


def install_pause_points() -> None:
    """Every pause point becomes a step of whichever actor reaches it."""
    for point in PAUSE_POINTS:
        injection.register(point, lambda point=point, **_context: pause_here(point))
    for kind in ("table_commit_landed", "table_fence_landed", "table_restore_landed"):
        injection.register(kind, lambda kind=kind, **_context: lose_answer_if_asked(kind))


# -- the object store's writes as steps ------------------------------------------------

STORE_WRITES = ("write_json", "create_json", "write_if", "delete_if", "delete", "delete_folder")


def install_store_steps() -> Callable[[], None]:
    """Every write to a local store becomes a step, and may lose its answer.

    A lost answer is what an S3 client sees when the connection drops after the server
    applied the write: a conditional write's retry finds its own object and reports the
    precondition failed (`create_json` False, `write_if` None, `delete_if` False); any
    other write raises.

    Returns:
        A function that puts the store back as it was.
    """
    from streamkeeper.storage.objects import LocalStore

    originals = {name: getattr(LocalStore, name) for name in STORE_WRITES}

    def stepped(name: str) -> Callable[..., Any]:
        original = originals[name]
        lost_answer = {"create_json": False, "write_if": None, "delete_if": False}

        def write(self: LocalStore, *args: Any, **kwargs: Any) -> Any:
            pause_here(f"store.{name}")
            result = original(self, *args, **kwargs)
            actor = current_actor()
            if actor is not None and "store" in actor.lose_next:
                actor.lose_next.discard("store")
                if name in lost_answer:
                    return lost_answer[name]
                raise LostResponse(f"{actor.name}: the answer to store.{name} was lost")
            return result

        return write

    for name in STORE_WRITES:
        setattr(LocalStore, name, stepped(name))

    def undo() -> None:
        for name, original in originals.items():
            setattr(LocalStore, name, original)

    return undo
