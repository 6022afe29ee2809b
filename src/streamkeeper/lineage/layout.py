"""Where each durable artefact of a job lineage lives, below the storage root.

    {root}/lineages/{lineage}/wal/manifests/{seq}.json      pending WAL manifests
    {root}/lineages/{lineage}/wal/staging/{seq}/{sink}/     buffered merge rows (Parquet)
    {root}/lineages/{lineage}/markers/{seq}.json            commit markers (batch -> versions)
    {root}/lineages/{lineage}/epochs/{epoch}.json           fencing epochs, one per runner start
    {root}/lineages/{lineage}/checkpoints/manifests/{id}.json  externalized checkpoints (id = seq)
    {root}/lineages/{lineage}/checkpoints/files/{sha256}       their files, content-addressed
    {root}/lineages/{lineage}/checkpoints/index.json        retained checkpoints, savepoint
                                                            pins, owner epoch (CAS)
    {root}/lineages/{lineage}/rollback.json                 the latest rollback (CAS by epoch)
    {root}/lineages/{lineage}/savepoints/registry.json      savepoints, protection, holds (CAS)
    {root}/lineages/{lineage}/savepoints/{id}/manifest.json a savepoint (its commit point)
    {root}/lineages/{lineage}/savepoints/{id}/checkpoint/   a self-contained savepoint's files
    {root}/lineages/{lineage}/savepoints/{id}/state/        a canonical savepoint's Delta tables
    {root}/jobs/{job}/job.json                              the job record: lineage, tables, knobs
    {root}/jobs/{job}/heartbeat.json                        the runner's state (CAS, by epoch)
    {root}/jobs/{job}/commands/{id}.json                    a command to the job (put-if-absent)
    {root}/jobs/{job}/commands/{id}.result.json             its result (put-if-absent)
    {root}/jobs/{job}/command-log/{id}.json                 the runner's record of executing it
    {root}/tables/{sink}                                    default table location
    {table}/sk-{lineage}/{seq}/e{epoch}-{uuid}.parquet      pre-committed files of one batch
    {table}/_streamkeeper/writers/{lineage}.json            which lineages write the table

Every key is zero-padded so that lexical order is numeric order (S3 lists lexically).
"""

from __future__ import annotations

from dataclasses import dataclass

from streamkeeper.storage import Location

SEQ_WIDTH = 20


def seq_name(seq: int) -> str:
    return f"{seq:0{SEQ_WIDTH}d}"


def seq_of(key: str) -> int:
    """The sequence number in a key such as `.../00000000000000000012.json`."""
    return int(key.rsplit("/", 1)[-1].split(".", 1)[0])


@dataclass(frozen=True)
class LineageLayout:
    """Keys of one lineage, relative to the storage root's object store."""

    root: Location
    lineage: str
    job: str

    @property
    def base(self) -> str:
        return f"lineages/{self.lineage}"

    @property
    def manifests(self) -> str:
        return f"{self.base}/wal/manifests"

    def manifest(self, seq: int) -> str:
        return f"{self.manifests}/{seq_name(seq)}.json"

    def staging(self, seq: int, sink: str) -> Location:
        return self.root.child(f"{self.base}/wal/staging/{seq_name(seq)}/{sink}")

    def staging_prefix(self, seq: int) -> str:
        return f"{self.base}/wal/staging/{seq_name(seq)}"

    @property
    def staging_root(self) -> str:
        return f"{self.base}/wal/staging"

    @property
    def markers(self) -> str:
        return f"{self.base}/markers"

    def marker(self, seq: int) -> str:
        return f"{self.markers}/{seq_name(seq)}.json"

    @property
    def epochs(self) -> str:
        return f"{self.base}/epochs"

    def epoch(self, epoch: int) -> str:
        return f"{self.epochs}/{epoch:010d}.json"

    @property
    def checkpoints(self) -> str:
        return f"{self.base}/checkpoints"

    @property
    def checkpoint_manifests(self) -> str:
        return f"{self.checkpoints}/manifests"

    def checkpoint_manifest(self, checkpoint_id: int) -> str:
        return f"{self.checkpoint_manifests}/{seq_name(checkpoint_id)}.json"

    @property
    def checkpoint_files(self) -> str:
        return f"{self.checkpoints}/files"

    def checkpoint_file(self, sha256: str) -> str:
        return f"{self.checkpoint_files}/{sha256}"

    @property
    def job_base(self) -> str:
        return f"jobs/{self.job}"

    @property
    def job_record(self) -> str:
        return f"{self.job_base}/job.json"

    @property
    def rewind_pending(self) -> str:
        """Written by a rollback before it restores the job's tables, deleted by the start
        from its savepoint: until then only that start may run (runtime/runner.py)."""
        return f"{self.job_base}/rewind-pending.json"

    @property
    def rollback(self) -> str:
        """The lineage's latest rollback (its epoch, savepoint, seq): written before its
        first RESTORE, kept. No WAL manifest of an older epoch is ever committed."""
        return f"{self.base}/rollback.json"

    @property
    def checkpoint_index(self) -> str:
        return f"{self.checkpoints}/index.json"

    # -- savepoints ------------------------------------------------------------------

    @property
    def savepoints(self) -> str:
        return f"{self.base}/savepoints"

    @property
    def savepoint_registry(self) -> str:
        return f"{self.savepoints}/registry.json"

    def savepoint(self, savepoint_id: str) -> str:
        """The folder of one savepoint."""
        return f"{self.savepoints}/{savepoint_id}"

    def savepoint_manifest(self, savepoint_id: str) -> str:
        return f"{self.savepoint(savepoint_id)}/manifest.json"

    # -- commands to the running job ---------------------------------------------------

    @property
    def commands(self) -> str:
        """Commands not yet answered and acknowledged (the runner lists only this)."""
        return f"{self.job_base}/commands"

    def command(self, command_id: str) -> str:
        return f"{self.commands}/{command_id}.json"

    def command_result(self, command_id: str) -> str:
        return f"{self.commands}/{command_id}.result.json"

    @property
    def command_log(self) -> str:
        return f"{self.job_base}/command-log"

    def command_record(self, command_id: str) -> str:
        """The runner's record: claimed before it executes the command, then its result."""
        return f"{self.command_log}/{command_id}.json"

    @property
    def precommit_folder(self) -> str:
        """The folder, inside each target table, of this lineage's pre-committed files."""
        return f"sk-{self.lineage}"

    def precommit_dir(self, seq: int) -> str:
        """Relative to a table: where batch `seq`'s files go before they are committed."""
        return f"{self.precommit_folder}/{seq_name(seq)}"

    @property
    def heartbeat(self) -> str:
        return f"{self.job_base}/heartbeat.json"

    def data_app_id(self, sink: str) -> str:
        """Delta app id of one table's commits: per lineage and table."""
        return f"streamkeeper:{self.lineage}:{sink}"

    def fence_app_id(self) -> str:
        """Delta app id carrying the committing runner's epoch (fencing token)."""
        return f"streamkeeper-fence:{self.lineage}"
