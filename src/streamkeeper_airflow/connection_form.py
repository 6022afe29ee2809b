"""The `streamkeeper` connection's form in Airflow's UI: fields, labels, placeholders.

Declared once, here, and handed to Airflow two ways: as the provider info's
`conn-fields` and `ui-field-behaviour` (read without importing the hook, Airflow 3.2+),
and through the hook's `get_ui_field_behaviour` for earlier versions. The extra fields
are stored in the connection's extra JSON under their own names (`root`, `region`,
`role_arn`, `allow_http`), which is what `connection.ConnectionSettings` reads.
"""

from __future__ import annotations

from typing import Any

from streamkeeper_airflow.connection import EXAMPLE_EXTRA, ROLE_ARN_PATTERN

HIDDEN_FIELDS = ["schema", "port"]
RELABELING = {
    "host": "S3 endpoint URL (empty: AWS)",
    "login": "Access key id (empty: the default AWS credential chain)",
    "password": "Secret access key",
}
PLACEHOLDERS = {"host": "http://127.0.0.1:8333", "extra": EXAMPLE_EXTRA}

# A local root must be absolute (workers differ in their directory); connection.py says
# why when one is not.
ROOT_PATTERN = r"^(s3://[^/]+(/.*)?|file:///.+|/.+)$"

CONN_FIELDS: dict[str, dict[str, Any]] = {
    "root": {
        "label": "Storage root",
        "description": "Where the jobs' control plane, checkpoints and tables live: "
        "s3://bucket/prefix, or an absolute local path.",
        "schema": {"type": ["string", "null"], "pattern": ROOT_PATTERN},
    },
    "region": {
        "label": "Region",
        "description": "The S3 region (ignored for a local root).",
        "schema": {"type": ["string", "null"], "default": "us-east-1"},
    },
    "role_arn": {
        "label": "Role ARN",
        "description": "An IAM role every client assumes with the key above (or with the "
        "default AWS chain when it is empty), its temporary credentials refreshed; "
        "empty: no role.",
        "schema": {"type": ["string", "null"], "pattern": f"^({ROLE_ARN_PATTERN})?$"},
    },
    "allow_http": {
        "label": "Allow plain HTTP",
        "description": "Talk to the endpoint without TLS (a local SeaweedFS or MinIO); "
        "empty: only when the endpoint URL starts with http://.",
        "schema": {"type": ["boolean", "null"]},
    },
}


def provider_connection_form() -> dict[str, Any]:
    """The provider info's form keys of the `streamkeeper` connection type."""
    return {
        "conn-fields": CONN_FIELDS,
        "ui-field-behaviour": {
            "hidden-fields": HIDDEN_FIELDS,
            "relabeling": RELABELING,
            "placeholders": PLACEHOLDERS,
        },
    }


def ui_field_behaviour() -> dict[str, Any]:
    """The same, as a hook's `get_ui_field_behaviour` returns it (Airflow before 3.2)."""
    return {"hidden_fields": HIDDEN_FIELDS, "relabeling": RELABELING, "placeholders": PLACEHOLDERS}
