"""Names and the shadow spec of one upgrade.

Green's shadow run is its own job (`{job}-shadow-{hash}`, its own lineage, control plane
and checkpoint directory) writing to tables below `upgrades/{job}/{upgrade}/shadow/`,
so it fences nobody and its output never mixes with the live tables.
"""

from __future__ import annotations

import hashlib
import re
import time
import uuid
from pathlib import Path

from streamkeeper.errors import SpecError
from streamkeeper.spec import JobSpec, parse_spec

_UPGRADE_ID = re.compile(r"^up-[0-9]{8}t[0-9]{6}-[0-9a-f]{8}$")


def new_upgrade_id(now: float | None = None) -> str:
    """A fresh id that sorts by time: `up-20261124t233400-1a2b3c4d`."""
    stamp = time.strftime("%Y%m%dt%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"up-{stamp}-{uuid.uuid4().hex[:8]}"


def check_upgrade_id(upgrade_id: str) -> str:
    """Raises SpecError unless `upgrade_id` has an upgrade id's form."""
    if not _UPGRADE_ID.fullmatch(upgrade_id):
        raise SpecError(
            f"{upgrade_id!r} is not an upgrade id (they look like up-20261124t233400-1a2b3c4d; "
            "`streamkeeper upgrades JOB` lists a job's)"
        )
    return upgrade_id


def shadow_job_name(job: str, upgrade_id: str) -> str:
    """The shadow run's job name: a valid job name (at most 63 characters)."""
    digest = hashlib.sha256(upgrade_id.encode()).hexdigest()[:8]
    return f"{job[:47].rstrip('-')}-shadow-{digest}"


def shadow_table(job: str, upgrade_id: str, sink: str) -> str:
    """A shadow table, relative to the storage root."""
    return f"upgrades/{job}/{upgrade_id}/shadow/{sink}"


def shadow_spec(spec: JobSpec, upgrade_id: str, live_checkpoint_dir: Path) -> JobSpec:
    """Green's spec for its shadow run: same code and source, its own name and tables.

    Args:
        live_checkpoint_dir: green's live checkpoint directory; the shadow one is beside it.
    """
    data = spec.model_dump(mode="python", by_alias=True, exclude_none=True)
    data["name"] = shadow_job_name(spec.name, upgrade_id)
    data.pop("lineage", None)
    for sink in data["sinks"]:
        sink["table"] = shadow_table(spec.name, upgrade_id, sink["name"])
        sink["shared"] = False
    checkpoint = data.setdefault("checkpoint", {})
    checkpoint["dir"] = f"{live_checkpoint_dir}.{upgrade_id}.shadow"
    # A shadow run is thrown away: nothing of it needs to outlive its driver.
    checkpoint["externalized"] = {"enabled": False}
    data.pop("savepoints", None)
    try:
        return parse_spec(data, source=f"shadow of {spec.name!r} ({upgrade_id})")
    except SpecError as error:  # a bug here, not the user's: say so
        raise SpecError(f"cannot derive the shadow spec: {error}") from None
