"""How to run a job, beyond its spec (the CLI's and the launchers' options)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from streamkeeper.observability.progress import ProgressListener


@dataclass(frozen=True)
class RunOptions:
    """How to run a job, beyond its spec."""

    master: str | None = None
    available_now: bool = False  # process what is available, then stop (Trigger.AvailableNow)
    takeover: bool = False
    spec_dir: Path = Path(".")
    from_checkpoint: str | None = None  # restore this externalized checkpoint first: latest|id
    progress: ProgressListener | None = None  # shown on a terminal by the CLI
    # Who started this run (e.g. an Airflow task): recorded in the heartbeat and the job
    # record, so a retried starter finds the driver it launched instead of starting another.
    run_token: str | None = None
    from_savepoint: str | None = None  # restore this savepoint first: an id, or a copied folder
    allow_rewind: bool = False  # restore a savepoint or checkpoint the lineage is past
    # Start a new query on an empty checkpoint directory although the lineage committed:
    # its sources start over (what a start refuses otherwise: ownership.check_fresh_start).
    allow_fresh_start: bool = False
    uid_mapping: dict[str, str] = field(default_factory=dict)  # canonical: old uid -> new
    allow_non_restored_state: bool = False  # canonical: state of operators the job lost
    command_poll_interval: float = 1.0  # how often the commands folder is listed
    # An upgrade's shadow run: (job, lineage) of the running version, whose savepoint
    # (a folder path) it starts from (streamkeeper.upgrade).
    shadow_of: tuple[str, str] | None = None
    # Called with the epoch once this run beats the job's heartbeat (the CLI's driver
    # beat hands over to it: lineage/driver_beat.py).
    on_heartbeat: Callable[[int], None] | None = None
