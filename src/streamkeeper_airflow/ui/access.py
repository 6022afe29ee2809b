"""Who may see and act on which job: the per-DAG permissions of Airflow's auth manager.

A job is exactly as visible as its DAGs. A user sees it (a row in the jobs table, its
detail, its DAG runs) only if Airflow's auth manager lets them read every DAG the DAG
factory makes for it (`{job}.start`, `.monitor`, `.savepoint`, `.stop`, `.upgrade`,
`.rollback`): the check Airflow's own DAG pages make, so FAB roles, a custom auth
manager or SimpleAuthManager's roles decide here as they do there. To anyone else the
job answers as a job that does not exist does (404, never 403), so its existence is not
leaked. An action needs, on top, the right to trigger its DAG (POST on its runs, what
Airflow's own trigger endpoint asks), and Airflow checks that again when it is sent on.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from airflow.api_fastapi.auth.managers.base_auth_manager import BaseAuthManager


def job_dag_ids(job: str) -> list[str]:
    """Every DAG the factory makes for `job`: reading the job needs them all."""
    from streamkeeper_airflow.dag_factory import ACTIONS

    return [f"{job}.{action}" for action in ACTIONS]


def job_of_dag(dag_id: str) -> str | None:
    """The job whose DAG `dag_id` is (`{job}.{action}`), None for any other DAG."""
    from streamkeeper_airflow.dag_factory import ACTIONS

    job, _, action = dag_id.rpartition(".")
    return job if job and action in ACTIONS else None


class JobAccess(Protocol):
    """What one user may see and trigger."""

    def readable(self, jobs: list[str]) -> list[str]:
        """Those of `jobs` the user may see, in the same order."""
        ...

    def may_trigger(self, dag_id: str) -> bool:
        """Whether the user may start a run of `dag_id`."""
        ...


class Everyone:
    """No authorisation: for the app built with `authenticate=False` (tests, benchmark)."""

    def readable(self, jobs: list[str]) -> list[str]:
        return list(jobs)

    def may_trigger(self, dag_id: str) -> bool:
        return True


class AirflowUserAccess:
    """One logged-in user's rights, as Airflow's auth manager grants them.

    Args:
        user: the request's user (Airflow's `get_user`).
        auth_manager: Airflow's (`get_auth_manager()` if None).
    """

    def __init__(self, user: Any, auth_manager: BaseAuthManager | None = None) -> None:
        if auth_manager is None:
            from airflow.api_fastapi.app import get_auth_manager

            auth_manager = get_auth_manager()
        self.user, self.auth_manager = user, auth_manager

    def readable(self, jobs: list[str]) -> list[str]:
        wanted = {dag_id for job in jobs for dag_id in job_dag_ids(job)}
        allowed: set[str] = set()
        for team, dag_ids in _by_team(wanted).items():
            allowed |= self.auth_manager.filter_authorized_dag_ids(
                dag_ids=dag_ids, user=self.user, method="GET", team_name=team
            )
        return [job for job in jobs if allowed.issuperset(job_dag_ids(job))]

    def may_trigger(self, dag_id: str) -> bool:
        from airflow.api_fastapi.auth.managers.models.resource_details import (
            DagAccessEntity,
            DagDetails,
        )

        team = next(iter(_by_team({dag_id})))
        return self.auth_manager.is_authorized_dag(
            method="POST",
            access_entity=DagAccessEntity.RUN,
            details=DagDetails(id=dag_id, team_name=team),
            user=self.user,
        )


def _by_team(dag_ids: set[str]) -> dict[str | None, set[str]]:
    """The DAG ids grouped by their team (all under None unless `[core] multi_team`)."""
    from airflow.configuration import conf

    if not conf.getboolean("core", "multi_team", fallback=False):
        return {None: dag_ids}
    from airflow.models.dag import DagModel

    teams = DagModel.get_dag_id_to_team_name_mapping(sorted(dag_ids))
    grouped: dict[str | None, set[str]] = defaultdict(set)
    for dag_id in dag_ids:
        grouped[teams.get(dag_id)].add(dag_id)
    return dict(grouped)
