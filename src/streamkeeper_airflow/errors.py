"""Errors of the Airflow layer. Each names the bad value and the fix, and never a secret."""

from __future__ import annotations

from streamkeeper.errors import StreamkeeperError


class StreamkeeperAirflowError(StreamkeeperError):
    """Base class of the Airflow layer's errors."""


class ConnectionConfigError(StreamkeeperAirflowError):
    """An Airflow connection cannot describe a streamkeeper storage root as it is."""


class LaunchError(StreamkeeperAirflowError):
    """A driver could not be launched (the launcher's command failed)."""


class StartRefusedError(StreamkeeperAirflowError):
    """A start would run a second driver of a lineage, or restore over a running one."""


class SecretSafeError(StreamkeeperAirflowError):
    """An error whose original message held a secret; this one holds it redacted."""


class LaunchPolicyError(StreamkeeperAirflowError):
    """A trigger's Param or a record read from storage asks for a launch the DAG author and
    the operator did not allow (an override key, a spec path, a master, a credential)."""


class InvalidJobSpecsError(StreamkeeperAirflowError):
    """Job specs in the jobs folder that no DAG is generated from (dags/job_specs.py
    raises it, so Airflow shows it as that file's import error)."""
