"""Where durable things live: locations (local or s3://), small objects, the start-up probe."""

from streamkeeper.storage.location import Location, S3Settings, join_under, resolve_root
from streamkeeper.storage.objects import LocalStore, ObjectStore, S3Store
from streamkeeper.storage.probe import probe

__all__ = [
    "LocalStore",
    "Location",
    "ObjectStore",
    "S3Settings",
    "S3Store",
    "join_under",
    "probe",
    "resolve_root",
]
