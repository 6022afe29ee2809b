"""An Airflow auth manager that grants each user the DAGs whose ids start with given prefixes.

Airflow's SimpleAuthManager knows roles only (a viewer reads every DAG, a user triggers
every DAG); FAB, which can grant per DAG, is not installed here. This subclass keeps the
simple manager's users, passwords, roles and login form and narrows DAG access, through
the real extension point (`[core] auth_manager`), so a test can have a user who may read
and trigger one job's DAGs but not another's:

    AIRFLOW__CORE__AUTH_MANAGER=tests.support.dag_prefix_auth_manager.DagPrefixAuthManager
    STREAMKEEPER_TEST_DAG_PREFIXES='{"alice": ["alpha."]}'

A user named in the map may reach only DAGs whose id starts with one of their prefixes
(and, within those, what their role allows); a user not named keeps their role's rights.
A request about no DAG in particular (a list) is left to the role: Airflow then filters
the list DAG by DAG.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

if TYPE_CHECKING:
    from airflow.api_fastapi.auth.managers.base_auth_manager import ResourceMethod
    from airflow.api_fastapi.auth.managers.models.resource_details import (
        DagAccessEntity,
        DagDetails,
    )
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

PREFIXES_VARIABLE = "STREAMKEEPER_TEST_DAG_PREFIXES"


def _prefixes() -> dict[str, list[str]]:
    return json.loads(os.environ.get(PREFIXES_VARIABLE) or "{}")


class DagPrefixAuthManager(SimpleAuthManager):
    """SimpleAuthManager with each named user's DAGs confined to id prefixes."""

    def is_authorized_dag(
        self,
        *,
        method: ResourceMethod,
        user: SimpleAuthManagerUser,
        access_entity: DagAccessEntity | None = None,
        details: DagDetails | None = None,
    ) -> bool:
        prefixes = _prefixes().get(user.get_name())
        dag_id = None if details is None else details.id
        if prefixes is not None and dag_id is not None and not dag_id.startswith(tuple(prefixes)):
            return False
        return super().is_authorized_dag(
            method=method, user=user, access_entity=access_entity, details=details
        )
