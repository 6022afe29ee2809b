"""What to do about a rollback left halfway: said once, read by the runner's refusal
(runtime/ownership.py) and by `status` (observability/status.py).

`jobs/{job}/rewind-pending.json` is written by a rollback before it changes a table
(upgrade/rollback.py) and gets `marker_seq` once every table is restored and the
rollback's marker written; the start from its savepoint deletes it.
"""

from __future__ import annotations

from typing import Any


def rewind_advice(pending: dict[str, Any]) -> str:
    """The fix for a rollback left halfway, from its pending record."""
    savepoint = pending.get("savepoint")
    if pending.get("marker_seq") is None:
        return (
            f"a rollback to savepoint {savepoint} did not restore every table: run the "
            "rollback again (it restores those it has not); any start is refused until then"
        )
    return (
        f"a rollback restored the tables to savepoint {savepoint} and did not start the job: "
        f"run the rollback again, or start from it (--from-savepoint {savepoint} "
        "--takeover); any other start is refused"
    )
