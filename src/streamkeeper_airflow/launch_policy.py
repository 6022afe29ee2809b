"""What a DAG run's trigger, and a record read back from storage, may change about a launch.

Who is trusted with what: the DAG author writes the job specs in the jobs folder; the
operator installs the provider and sets `[streamkeeper]`. Both may put anything on a
driver's command line. A person who may only trigger a DAG, and a process that may only
write objects under the storage root (where `jobs/{job}/launch.json` and the upgrade
records live), are trusted less: what they hand a launch passes these checks first.

    overrides     keys matching an allowed pattern: DEFAULT_TRIGGER_OVERRIDES (tuning
                  knobs that reach no file, address or code), the spec's own
                  `airflow.trigger_overrides` (the DAG author's) and `[streamkeeper]
                  trigger_overrides` (the operator's). Patterns are shell-style (`*`
                  matches any text, dots too). NEVER_OVERRIDES are refused whatever the
                  lists say: keys that load code into the driver's JVM or Python, pick the
                  transformation, send storage requests (signed with the root's key)
                  elsewhere, or widen the list itself. They belong in the spec.
    values        no credential (user:password@ in a URL, `password=...`): an override
                  is on the driver's command line (`ps` shows it) and in the launch record.
    spec paths    spec_path, green_spec_path, expectations_path: resolved (symlinks,
                  `..`) under the jobs folder.
    masters       local ones (the driver's own host), the spec's own, and `[streamkeeper]
                  spark_masters`.
    checkpoint    a live checkpoint folder read from a record (green's, the one a rollback
    folders       sets aside): only the folder a job's spec resolves to in the DAG's
                  working directory, which the launch itself would use.

Each refusal is a `LaunchPolicyError` naming the value and the fix.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from streamkeeper_airflow.errors import LaunchPolicyError
from streamkeeper_airflow.secrets import redact, secret_pairs

# Knobs of the job's pace and tolerance: none names a file, an address, a class or code.
DEFAULT_TRIGGER_OVERRIDES: tuple[str, ...] = (
    "checkpoint.interval",
    "checkpoint.mode",
    "checkpoint.timeout",
    "checkpoint.min_pause",
    "checkpoint.tolerable_failures",
    "checkpoint.max_concurrent",
    "spark.master",  # checked against the master allow-list like the spark_master Param
    "spark.shuffle_partitions",
    "source.options.maxFilesPerTrigger",
    "source.options.maxBytesPerTrigger",
    "source.options.maxMessagesPerTrigger",
)

# Refused even when an allow-list matches them (a broad `spark.conf.*` included): they
# run code in the driver or its executors, or send the root's signed requests elsewhere.
# Spark has more such keys than any list: allow spark.conf keys one by one.
NEVER_OVERRIDES: tuple[str, ...] = (
    "airflow.*",  # the allow-list itself and how Airflow runs the job
    "name",
    "transform",
    "storage.endpoint_url",  # the connection's, always
    "spark.conf.spark.jars*",
    "spark.conf.*plugins*",
    "spark.conf.*extrajavaoptions",
    "spark.conf.*extraclasspath",
    "spark.conf.*extralibrarypath",
    "spark.conf.spark.files",
    "spark.conf.spark.archives",
    "spark.conf.spark.submit.*",
    "spark.conf.spark.sql.extensions",
    "spark.conf.*listeners",
    "spark.conf.spark.sql.catalog.*",
    "spark.conf.spark.python.*",
    "spark.conf.spark.pyspark.*",
    "spark.conf.spark.executorenv.*",
    "spark.conf.spark.*.appmasterenv.*",
    "spark.conf.spark.kubernetes.*",
    "spark.conf.spark.hadoop.*",
    "spark.conf.*.endpoint*",
    "spark.conf.*.credentials*",
    "spark.conf.*.provider*",
)

_LOCAL_MASTER = re.compile(r"^local(\[(\*|\d+)(,\s*\d+)?\])?$")
_URL_USERINFO = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s@]*@")
_CREDENTIAL_FIX = (
    "an override is on the driver's command line (visible to `ps`) and in the launch "
    "record: keep the credential out of it; write it into the job spec (a file the DAG "
    "author keeps), or give it to the driver by environment (`[streamkeeper] driver_env`) "
    "or a file it reads"
)


def _matches(key: str, patterns: Iterable[str]) -> bool:
    lowered = key.lower()
    return any(fnmatch.fnmatchcase(lowered, p.lower()) for p in patterns)


def allowed_overrides(
    spec_allowed: Iterable[str] = (), config_allowed: Iterable[str] = ()
) -> tuple[str, ...]:
    """The defaults, the spec's `airflow.trigger_overrides` and the provider config's."""
    return (*DEFAULT_TRIGGER_OVERRIDES, *spec_allowed, *config_allowed)


def check_credential_free(name: str, value: str) -> None:
    """Refuse a value that carries a credential (without quoting the credential).

    Raises:
        LaunchPolicyError: naming `name`, the value redacted, and where credentials go.
    """
    if _URL_USERINFO.search(value):
        what = "user info (user:password@) in a URL"
    elif secret_pairs(value):
        what = "a password/secret/token pair"
    else:
        return
    raise LaunchPolicyError(
        f"{name} carries a credential ({what}) in its value {redact(value)!r}; {_CREDENTIAL_FIX}"
    )


def check_overrides(overrides: Mapping[str, str], allowed: Iterable[str]) -> None:
    """Every key allowed and never one of NEVER_OVERRIDES; no value carries a credential.

    Raises:
        LaunchPolicyError: naming the first bad key (or value) and the fix.
    """
    allowed = tuple(allowed)
    for key, value in sorted(overrides.items()):
        if _matches(key, NEVER_OVERRIDES):
            raise LaunchPolicyError(
                f"override {key!r} is never taken from a trigger or a launch record, whatever "
                "the allow-lists say: it can load code into the driver, pick its "
                "transformation, send the root's signed requests elsewhere or widen the "
                "allow-list; set it in the job spec (the DAG author's) instead"
            )
        if not _matches(key, allowed):
            extra = sorted(set(allowed) - set(DEFAULT_TRIGGER_OVERRIDES))
            raise LaunchPolicyError(
                f"override {key!r} is not one a trigger may set; allowed: "
                f"{', '.join(DEFAULT_TRIGGER_OVERRIDES)}"
                f"{' and ' + ', '.join(extra) if extra else ''}. To allow it, the DAG author "
                "lists it in the spec's airflow.trigger_overrides, or the operator in "
                "[streamkeeper] trigger_overrides"
            )
        check_credential_free(f"override {key!r}", str(value))


def confine_path(path: str | Path, folders: Iterable[str | Path], *, what: str) -> Path:
    """`path` resolved (symlinks, `..`), refused unless it lies under one of `folders`
    (the jobs folder, then `[streamkeeper] spec_folders`; each resolved).

    Raises:
        LaunchPolicyError: naming the path, the folders and the fix.
    """
    folders = [Path(f) for f in ([folders] if isinstance(folders, str | Path) else folders)]
    resolved = Path(path).resolve()
    for folder in folders:
        base = folder.resolve()
        if resolved != base and resolved.is_relative_to(base):
            return resolved
    shown = " or ".join(repr(str(f)) for f in folders) or "(none configured)"
    raise LaunchPolicyError(
        f"{what} {str(path)!r} is outside the jobs folder {shown} (it resolves to "
        f"{str(resolved)!r}); pass a file under that folder (the DAG author's specs), or "
        "ask the operator to set [streamkeeper] jobs_folder or spec_folders"
    )


def check_master(master: str | None, *, spec_master: str, allowed: Iterable[str]) -> None:
    """A local master, the spec's own, or one of `[streamkeeper] spark_masters`.

    Raises:
        LaunchPolicyError: naming the master and the fix.
    """
    if not master:
        return
    check_credential_free(f"Spark master {redact(master)!r}", master)
    allowed = tuple(allowed)
    if _LOCAL_MASTER.match(master) or master == spec_master or _matches(master, allowed):
        return
    raise LaunchPolicyError(
        f"Spark master {master!r} is not allowed: a driver may run on a local master, the "
        f"spec's own ({spec_master!r}) or one of [streamkeeper] spark_masters "
        f"({', '.join(allowed) or 'none set'}); ask the operator to add it there"
    )


def spec_checkpoint_dir(spec: Any, workdir: str | Path) -> Path:
    """The live checkpoint folder of a driver started in `workdir` (as `resolve_paths`)."""
    directory = Path(spec.checkpoint.dir or f".streamkeeper/checkpoints/{spec.lineage_id}")
    return (directory if directory.is_absolute() else Path(workdir) / directory).resolve()


def check_recorded_checkpoint_dir(
    recorded: str | None, allowed: Iterable[Path], *, what: str
) -> Path | None:
    """A checkpoint folder read from a record, refused unless it is one a spec resolves
    to: a green launched into it, or a rollback, would move or write any folder else.

    Raises:
        LaunchPolicyError: naming the folder, the ones allowed and the fix.
    """
    if not recorded:
        return None
    allowed = [Path(a).resolve() for a in allowed]
    resolved = Path(recorded).resolve()
    if resolved in allowed:
        return resolved
    shown = " or ".join(repr(str(a)) for a in allowed)
    raise LaunchPolicyError(
        f"{what} {recorded!r} is not the job's checkpoint folder ({shown}, from its spec in "
        "the DAG's working directory); the record was changed or the spec's checkpoint.dir "
        "moved: put checkpoint.dir back, or move the folder there yourself and rerun"
    )
