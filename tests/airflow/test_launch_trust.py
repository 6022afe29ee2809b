"""What a trigger, and a launch record read back from storage, may change about a driver's
launch (issue 27, items 2 and 6): override keys from an allow-list, spec paths under the
jobs folder, masters from an allow-list, no credential on the command line, and an
allow-listed driver environment.

The operator tests run the real operators against a local root with the launch itself
replaced by a failure: a refusal must come before any launch and any write.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from streamkeeper.storage import LocalStore

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "jobs" / "keyed_totals"
JOB = "keyed-totals"
CONN_ID = "sk_trust"


# -- the policy, as pure functions ----------------------------------------------------------


def _policy() -> Any:
    from streamkeeper_airflow import launch_policy

    return launch_policy


def test_harmless_knobs_pass_the_default_allow_list() -> None:
    policy = _policy()
    allowed = policy.DEFAULT_TRIGGER_OVERRIDES
    policy.check_overrides(
        {
            "checkpoint.interval": "2s",
            "checkpoint.timeout": "5m",
            "spark.shuffle_partitions": "8",
            "source.options.maxFilesPerTrigger": "3",
        },
        allowed,
    )


@pytest.mark.parametrize(
    "key",
    [
        "spark.conf.spark.jars",
        "spark.conf.spark.plugins",
        "spark.conf.spark.driver.extraJavaOptions",
        "storage.endpoint_url",
        "storage.root",
        "transform",
        "source.path",
        "checkpoint.dir",
        "airflow.trigger_overrides",
    ],
)
def test_other_keys_are_refused_naming_the_key_and_where_to_allow_it(key: str) -> None:
    from streamkeeper_airflow.errors import LaunchPolicyError

    policy = _policy()
    with pytest.raises(LaunchPolicyError) as refused:
        policy.check_overrides({key: "x"}, policy.DEFAULT_TRIGGER_OVERRIDES)
    message = str(refused.value)
    assert repr(key) in message
    assert "trigger_overrides" in message or "set it in the job spec" in message


def test_the_spec_or_the_operator_extends_the_list_but_never_to_code_or_the_endpoint() -> None:
    from streamkeeper_airflow.errors import LaunchPolicyError

    policy = _policy()
    allowed = (*policy.DEFAULT_TRIGGER_OVERRIDES, "source.path", "spark.conf.*", "transform")
    policy.check_overrides({"source.path": "/data/in", "spark.conf.spark.sql.x": "1"}, allowed)
    for key in (
        "spark.conf.spark.jars",
        "spark.conf.spark.plugins",
        "spark.conf.spark.driver.extraJavaOptions",
        "spark.conf.spark.executor.extraClassPath",
        "spark.conf.spark.sql.extensions",
        "transform",
        "storage.endpoint_url",
        "airflow.trigger_overrides",
    ):
        with pytest.raises(LaunchPolicyError, match="never"):
            policy.check_overrides({key: "x"}, (*allowed, "*"))


@pytest.mark.parametrize(
    ("value", "secret"),
    [
        ("nats://reader:hunter2pass@10.0.0.5:4222", "hunter2pass"),
        (
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            'username="svc" password="hunter2pass";',
            "hunter2pass",
        ),
        ("token=hunter2pass", "hunter2pass"),
        ("opts auth_token: hunter2pass", "hunter2pass"),
        ("fs.s3a.secret.key=hunter2pass", "hunter2pass"),
        ("x-api-key=hunter2pass", "hunter2pass"),
    ],
)
def test_a_credential_inside_a_value_is_refused_without_quoting_it(value: str, secret: str) -> None:
    from streamkeeper_airflow.errors import LaunchPolicyError

    policy = _policy()
    with pytest.raises(LaunchPolicyError) as refused:
        policy.check_overrides({"source.url": value}, (*policy.DEFAULT_TRIGGER_OVERRIDES, "*"))
    message = str(refused.value)
    assert "'source.url'" in message and "credential" in message
    assert "environment" in message and "file" in message
    assert secret not in message


@pytest.mark.parametrize(
    "value",
    [
        "nats://10.0.0.5:4222",
        "tokenizer=bert-base",  # names that merely contain a secret's word
        "max_tokens=512",
        "secret_rotation_days=30",
        "run_token=af-123",  # an id
    ],
)
def test_a_value_without_a_credential_passes(value: str) -> None:
    policy = _policy()
    allowed = (*policy.DEFAULT_TRIGGER_OVERRIDES, "source.url")
    policy.check_overrides({"source.url": value}, allowed)
    from streamkeeper_airflow.secrets import redact

    assert redact(value) == value


def test_spec_paths_stay_under_the_jobs_folder(tmp_path: Path) -> None:
    from streamkeeper_airflow.errors import LaunchPolicyError

    policy = _policy()
    jobs = tmp_path / "jobs"
    (jobs / "a").mkdir(parents=True)
    (jobs / "a" / "job.yaml").write_text("name: a\n")
    outside = tmp_path / "elsewhere" / "job.yaml"
    outside.parent.mkdir()
    outside.write_text("name: a\n")
    (jobs / "a" / "link.yaml").symlink_to(outside)

    assert (
        policy.confine_path(jobs / "a" / "job.yaml", jobs, what="spec_path")
        == (jobs / "a" / "job.yaml").resolve()
    )
    for bad in (
        outside,
        jobs / "a" / ".." / ".." / "elsewhere" / "job.yaml",
        jobs / "a" / "link.yaml",
    ):
        with pytest.raises(LaunchPolicyError) as refused:
            policy.confine_path(bad, jobs, what="spec_path")
        message = str(refused.value)
        assert "spec_path" in message and str(bad) in message and str(jobs) in message
        assert "jobs_folder" in message


def test_masters_come_from_the_spec_the_operator_or_are_local() -> None:
    from streamkeeper_airflow.errors import LaunchPolicyError

    policy = _policy()
    for ok in ("local", "local[2]", "local[*]", "spark://10.0.0.1:7077"):
        policy.check_master(ok, spec_master="spark://10.0.0.1:7077", allowed=())
    policy.check_master("spark://gw:7077", spec_master="local[*]", allowed=("spark://gw:7077",))
    with pytest.raises(LaunchPolicyError) as refused:
        policy.check_master("spark://203.0.113.9:7077", spec_master="local[*]", allowed=())
    message = str(refused.value)
    assert "'spark://203.0.113.9:7077'" in message and "spark_masters" in message
    with pytest.raises(LaunchPolicyError, match="credential"):
        policy.check_master("spark://u:hunter2pass@gw:7077", spec_master="local[*]", allowed=("*",))


# -- the driver's environment ---------------------------------------------------------------


def test_the_driver_gets_an_allow_listed_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from streamkeeper_airflow.launchers.base import LaunchRequest, driver_environment

    worker = {
        "PATH": "/usr/bin",
        "HOME": "/home/airflow",
        "JAVA_HOME": "/usr/lib/jvm/default",
        "LC_ALL": "C.UTF-8",
        "PYSPARK_PYTHON": "/venv/bin/python",
        "STREAMKEEPER_SPARK_LOG_LEVEL": "ERROR",
        "SPARK_LOCAL_IP": "127.0.0.1",
        "AWS_WEB_IDENTITY_TOKEN_FILE": "/var/run/secrets/token",
        "AWS_ROLE_ARN": "arn:aws:iam::1:role/r",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI": "http://169.254.170.23/v1/credentials",
        "AWS_SECRET_ACCESS_KEY": "worker-own-secret",
        "DATABASE_URL": "postgresql://airflow:pw@db/airflow",
        "GOOGLE_APPLICATION_CREDENTIALS": "/secrets/gcp.json",
        "AIRFLOW__CORE__FERNET_KEY": "fernet",
        "AIRFLOW_CONN_WAREHOUSE": "postgres://u:p@h/db",
        "MY_TEAM_TOKEN": "team",
        "EXTRA_FOR_JOBS": "yes",
    }
    request = LaunchRequest(
        job=JOB,
        spec_path="/jobs/k/job.yaml",
        root="/r",
        run_token="t",
        workdir="/w",
        env={"AWS_ACCESS_KEY_ID": "conn-key", "AWS_SECRET_ACCESS_KEY": "conn-secret"},
    )
    env = driver_environment(request, worker)
    for kept in (
        "PATH",
        "HOME",
        "JAVA_HOME",
        "LC_ALL",
        "PYSPARK_PYTHON",
        "STREAMKEEPER_SPARK_LOG_LEVEL",
        "SPARK_LOCAL_IP",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_ROLE_ARN",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    ):
        assert env[kept] == worker[kept], kept
    for dropped in (
        "DATABASE_URL",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "AIRFLOW__CORE__FERNET_KEY",
        "AIRFLOW_CONN_WAREHOUSE",
        "MY_TEAM_TOKEN",
        "EXTRA_FOR_JOBS",
    ):
        assert dropped not in env, dropped
    assert env["AWS_SECRET_ACCESS_KEY"] == "conn-secret"  # the connection's, not the worker's
    assert env["AWS_ACCESS_KEY_ID"] == "conn-key"

    assert "AWS_SESSION_TOKEN" not in driver_environment(
        request, {**worker, "AWS_SESSION_TOKEN": "worker-token"}
    )  # a token of the worker's key, which the connection's replaced

    # A connection naming only a region and endpoint: the worker's session keys (its
    # instance or assumed role's, exported) are the driver's, token included.
    session = {"AWS_ACCESS_KEY_ID": "ASIA1", "AWS_SECRET_ACCESS_KEY": "s", "AWS_SESSION_TOKEN": "t"}
    regional = dataclasses.replace(request, env={"AWS_REGION": "eu-west-1"})
    env = driver_environment(regional, {**worker, **session})
    assert {k: env[k] for k in session} == session and env["AWS_REGION"] == "eu-west-1"
    assert env["AWS_WEB_IDENTITY_TOKEN_FILE"] == worker["AWS_WEB_IDENTITY_TOKEN_FILE"]

    monkeypatch.setenv("AIRFLOW__STREAMKEEPER__DRIVER_ENV", "EXTRA_FOR_JOBS, NATS_*")
    env = driver_environment(request, {**worker, "NATS_CREDS": "/secrets/nats.creds"})
    assert env["EXTRA_FOR_JOBS"] == "yes" and env["NATS_CREDS"] == "/secrets/nats.creds"
    assert "DATABASE_URL" not in env


# -- the operators: Params and launch records ----------------------------------------------


@pytest.fixture
def place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """A jobs folder holding a copy of the sample job, a local root, a connection to it."""
    jobs = tmp_path / "jobs"
    shutil.copytree(SAMPLE, jobs / "keyed_totals")
    root = tmp_path / "data"
    root.mkdir()
    connection = {"conn_type": "streamkeeper", "extra": {"root": str(root)}}
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(connection))
    monkeypatch.setenv("AIRFLOW__STREAMKEEPER__JOBS_FOLDER", str(jobs))
    monkeypatch.setenv("AIRFLOW__STREAMKEEPER__WORKDIR", str(tmp_path / "work"))
    for name in ("TRIGGER_OVERRIDES", "SPARK_MASTERS", "DRIVER_ENV"):
        monkeypatch.delenv(f"AIRFLOW__STREAMKEEPER__{name}", raising=False)
    outside = tmp_path / "elsewhere" / "job.yaml"
    outside.parent.mkdir()
    shutil.copy(SAMPLE / "job.yaml", outside)
    shutil.copy(SAMPLE / "transform.py", outside.parent / "transform.py")
    return SimpleNamespace(
        base=tmp_path,
        jobs=jobs,
        root=root,
        spec=jobs / "keyed_totals" / "job.yaml",
        outside=outside,
    )


def _context(task_id: str, dag_action: str = "start") -> dict[str, Any]:
    ti = SimpleNamespace(
        dag_id=f"{JOB}.{dag_action}",
        run_id="manual__trust",
        task_id=task_id,
        map_index=-1,
        try_number=1,
        xcom_push=lambda **_kwargs: None,
    )
    return {"ti": ti}


class Launched(Exception):  # noqa: N818 - the sentinel a test's launch raises
    """The operator got as far as launching: what an accepted launch looks like here."""


def _no_launch(monkeypatch: pytest.MonkeyPatch, cls: type) -> list[Any]:
    seen: list[Any] = []

    def launch(self: Any, request: Any, context: Any) -> Any:
        seen.append(request)
        raise Launched(request)

    monkeypatch.setattr(cls, "start", launch)
    return seen


def _listing(folder: Path) -> dict[str, int]:
    return {p.relative_to(folder).as_posix(): p.stat().st_size for p in folder.rglob("*")}


def _start(place: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> Any:
    from streamkeeper_airflow.operators.start import StartJobOperator

    _no_launch(monkeypatch, StartJobOperator)
    options: dict[str, Any] = {"job": JOB, "spec_path": str(place.spec), "conn_id": CONN_ID}
    options.update(kwargs)
    operator = StartJobOperator(task_id="start", **options)
    before = _listing(place.base)
    try:
        operator.execute(_context("start"))
    except Launched as launched:
        return launched.args[0]
    finally:
        if before != _listing(place.base):
            pytest.fail("the refused start changed files")
    raise AssertionError("the start neither launched nor refused")


def _refused(call: Any) -> str:
    from airflow.sdk.exceptions import AirflowFailException

    with pytest.raises(AirflowFailException) as refused:
        call()
    return str(refused.value)


def test_a_start_with_allowed_overrides_launches(
    place: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = _start(
        place, monkeypatch, overrides={"checkpoint.interval": "2s", "spark.master": "local[2]"}
    )
    assert request.overrides["checkpoint.interval"] == "2s"
    assert request.spec_path == str(place.spec.resolve())


@pytest.mark.parametrize(("given", "takeover"), [("False", False), ("true", True), (False, False)])
def test_takeover_as_text_means_what_it_says(
    place: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, given: object, takeover: bool
) -> None:
    """A DAG without native rendering hands the operator the text "False": bool() of it
    is True, a takeover that fences the running job."""
    assert _start(place, monkeypatch, takeover=given).takeover is takeover


def test_takeover_neither_true_nor_false_is_refused(
    place: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    message = _refused(lambda: _start(place, monkeypatch, takeover="no"))
    assert "takeover" in message and "'no'" in message


def test_a_start_with_jvm_code_overrides_is_refused(
    place: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    for overrides in (
        {"spark.conf.spark.jars": "/tmp/evil.jar", "spark.conf.spark.plugins": "evil.Plugin"},
        {"spark.conf.spark.driver.extraJavaOptions": "-javaagent:/tmp/evil.jar"},
        {"storage.endpoint_url": "http://203.0.113.9:9000"},
        {"transform": "evil:build"},
    ):
        message = _refused(lambda o=overrides: _start(place, monkeypatch, overrides=o))
        assert repr(next(iter(overrides))) in message, message


def test_the_spec_declares_what_its_triggers_may_override(
    place: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = yaml.safe_load(place.spec.read_text())
    data["airflow"]["trigger_overrides"] = ["source.path"]
    place.spec.write_text(yaml.safe_dump(data))
    request = _start(place, monkeypatch, overrides={"source.path": str(place.base / "in")})
    assert request.overrides["source.path"] == str(place.base / "in")
    message = _refused(
        lambda: _start(place, monkeypatch, overrides={"checkpoint.dir": str(place.base)})
    )
    assert "'checkpoint.dir'" in message and "source.path" in message


def test_the_operator_config_extends_the_allow_list(
    place: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__STREAMKEEPER__TRIGGER_OVERRIDES", "source.path, checkpoint.dir")
    request = _start(place, monkeypatch, overrides={"checkpoint.dir": str(place.base / "ck")})
    assert request.overrides["checkpoint.dir"] == str(place.base / "ck")


def test_a_credential_in_an_override_value_never_reaches_the_command_line(
    place: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__STREAMKEEPER__TRIGGER_OVERRIDES", "source.*")
    message = _refused(
        lambda: _start(
            place, monkeypatch, overrides={"source.url": "nats://u:hunter2pass@10.0.0.5:4222"}
        )
    )
    assert "'source.url'" in message and "hunter2pass" not in message
    assert not (place.root / "jobs").exists()  # no launch record either


def test_a_spec_path_outside_the_jobs_folder_is_refused(
    place: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    for bad in (str(place.outside), str(place.jobs / ".." / "elsewhere" / "job.yaml")):
        message = _refused(lambda b=bad: _start(place, monkeypatch, spec_path=b))
        assert bad in message and str(place.jobs) in message, message


def test_a_master_not_allowed_is_refused(
    place: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    message = _refused(lambda: _start(place, monkeypatch, spark_master="spark://203.0.113.9:7077"))
    assert "'spark://203.0.113.9:7077'" in message and "spark_masters" in message
    message = _refused(
        lambda: _start(place, monkeypatch, overrides={"spark.master": "spark://203.0.113.9:7077"})
    )
    assert "'spark://203.0.113.9:7077'" in message
    monkeypatch.setenv("AIRFLOW__STREAMKEEPER__SPARK_MASTERS", "spark://gw:7077")
    request = _start(place, monkeypatch, spark_master="spark://gw:7077", launcher="spark_submit")
    assert request.master == "spark://gw:7077"


# -- a restart: the launch record is read from storage ---------------------------------------


def _failed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The job's status says FAILED (what makes the monitor restart it)."""
    from streamkeeper_airflow.hooks.streamkeeper import StreamkeeperHook

    report = SimpleNamespace(job=JOB, state="FAILED", reason="driver died", head=None)
    monkeypatch.setattr(StreamkeeperHook, "status", lambda self, job, missing_ok=False: report)


def _launch_record(place: SimpleNamespace, **request: Any) -> dict[str, Any]:
    from streamkeeper_airflow.starts import LaunchRecord

    described = {
        "spec_path": str(place.spec.resolve()),
        "workdir": str(place.base / "work"),
        "overrides": {"checkpoint.interval": "2s"},
        "checkpoint_dir": None,
        "master": None,
    }
    described.update(request)
    record = LaunchRecord(
        token="af-earlier",
        job=JOB,
        state="launched",
        requested_at=time.time() - 600,
        host="gateway-1",
        after_epoch=1,
        baseline_seq=3,
        launcher="embedded",
        request=described,
    )
    LocalStore(place.root).write_json(f"jobs/{JOB}/launch.json", record.to_json())
    return record.to_json()


def _restart(place: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> Any:
    from streamkeeper_airflow.operators.restart import RestartJobOperator

    _failed(monkeypatch)
    _no_launch(monkeypatch, RestartJobOperator)
    operator = RestartJobOperator(
        task_id="restart",
        job=JOB,
        spec_path=str(place.spec),
        conn_id=CONN_ID,
        launcher="embedded",
        backoff=0,
        max_backoff=0,
    )
    before = _listing(place.base)
    try:
        operator.execute(_context("restart", "monitor"))
    except Launched as launched:
        return launched.args[0]
    finally:
        if before != _listing(place.base):
            pytest.fail("the refused restart changed files (restarts.json?)")
    raise AssertionError("the restart neither launched nor refused")


def test_a_restart_launches_as_recorded_when_the_record_is_sound(
    place: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    _launch_record(place, overrides={"checkpoint.interval": "2s"})
    request = _restart_request(place, monkeypatch)
    assert request.overrides["checkpoint.interval"] == "2s"
    assert request.spec_path == str(place.spec.resolve())


@pytest.mark.parametrize(
    "tampered",
    [
        {"spec_path": "ELSEWHERE"},
        {"overrides": {"spark.conf.spark.plugins": "evil.Plugin"}},
        {"overrides": {"spark.conf.spark.driver.extraJavaOptions": "-javaagent:/x.jar"}},
        {"overrides": {"storage.endpoint_url": "http://203.0.113.9:9000"}},
        {"master": "spark://203.0.113.9:7077"},
    ],
    ids=["spec-path", "plugins", "java-options", "endpoint", "master"],
)
def test_a_tampered_launch_record_is_refused_before_the_restart_is_counted(
    tampered: dict[str, Any], place: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    if tampered.get("spec_path") == "ELSEWHERE":
        tampered = {"spec_path": str(place.outside)}
    _launch_record(place, **tampered)
    message = _refused(lambda: _restart(place, monkeypatch))
    assert f"jobs/{JOB}/launch.json" in message, message
    assert f"{JOB}.start" in message, message
    assert not (place.root / "jobs" / JOB / "restarts.json").exists()


def _restart_request(place: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> Any:
    from streamkeeper_airflow.operators.restart import RestartJobOperator

    _failed(monkeypatch)
    _no_launch(monkeypatch, RestartJobOperator)
    operator = RestartJobOperator(
        task_id="restart", job=JOB, spec_path=str(place.spec), conn_id=CONN_ID
    )
    with pytest.raises(Launched) as launched:
        operator.execute(_context("restart", "monitor"))
    return launched.value.args[0]


def test_a_restart_on_another_worker_finds_the_spec_in_its_own_jobs_folder(
    place: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start ran on a worker whose DAG bundle sat elsewhere (another path, another
    bundle version's folder): the restart resolves the spec inside this worker's jobs
    folder by its recorded place there, not by the other worker's absolute path."""
    relative = str(place.spec.resolve().relative_to(place.jobs.resolve()))
    _launch_record(
        place,
        spec_path="/srv/airflow/dag_bundles/jobs/versions/3f9c2e/" + relative,
        spec_in_jobs_folder=relative,
    )
    assert _restart_request(place, monkeypatch).spec_path == str(place.spec.resolve())


def test_a_recorded_place_that_climbs_out_of_the_jobs_folder_is_not_taken(
    place: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    climbing = f"../{place.outside.parent.name}/{place.outside.name}"
    _launch_record(place, spec_path=str(place.outside), spec_in_jobs_folder=climbing)
    message = _refused(lambda: _restart(place, monkeypatch))
    assert f"jobs/{JOB}/launch.json" in message and str(place.outside) in message


def test_a_start_records_the_specs_place_in_the_jobs_folder(
    place: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = _start(place, monkeypatch)
    expected = str(place.spec.resolve().relative_to(place.jobs.resolve()))
    assert request.spec_in_jobs_folder == expected


def test_a_restart_takes_no_working_directory_from_the_record(
    place: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    _launch_record(place, workdir=str(place.outside.parent))
    request = _restart_request(place, monkeypatch)
    assert request.workdir == str((place.base / "work").resolve())


# -- upgrade and rollback Params ------------------------------------------------------------


def test_an_upgrade_to_a_green_spec_outside_the_jobs_folder_is_refused(
    place: SimpleNamespace,
) -> None:
    from streamkeeper_airflow.operators.upgrade import BeginUpgradeOperator

    operator = BeginUpgradeOperator(
        task_id="begin", job=JOB, conn_id=CONN_ID, green_spec_path=str(place.outside)
    )
    message = _refused(lambda: operator.execute(_context("begin", "upgrade")))
    assert str(place.outside) in message and str(place.jobs) in message
    assert not (place.root / "jobs").exists()


def test_an_expectations_path_outside_the_jobs_folder_is_refused(place: SimpleNamespace) -> None:
    from streamkeeper_airflow.errors import LaunchPolicyError
    from streamkeeper_airflow.operators.upgrade import expectations_file

    suite = place.outside.parent / "expectations.yaml"
    shutil.copy(SAMPLE / "expectations.yaml", suite)
    record = SimpleNamespace(green={"spec_path": str(place.spec)}, blue={})
    with pytest.raises(LaunchPolicyError) as refused:
        expectations_file(str(suite), record)  # type: ignore[arg-type]
    assert str(suite) in str(refused.value) and "expectations_path" in str(refused.value)
    inside = place.jobs / "keyed_totals" / "expectations.yaml"
    assert expectations_file(str(inside), record) == inside.resolve()  # type: ignore[arg-type]


def _refused_rollback(place: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, spec: Path) -> str:
    """A rollback that must be refused before it stops the job: the refusal's message."""
    from streamkeeper_airflow.operators.upgrade import RollbackOperator

    def no_stop(*_args: Any, **_kwargs: Any) -> None:
        raise AssertionError("the rollback stopped the running job")

    monkeypatch.setattr(RollbackOperator, "_stop_running", no_stop)
    monkeypatch.setattr(RollbackOperator, "check_savepoint", lambda self: None)
    operator = RollbackOperator(
        task_id="rollback",
        job=JOB,
        conn_id=CONN_ID,
        savepoint_id="sp-20240101T000000-deadbeef",
        spec_path=str(spec),
    )
    return _refused(lambda: operator.execute(_context("rollback", "rollback")))


def test_a_rollback_with_a_spec_outside_the_jobs_folder_stops_nothing(
    place: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    message = _refused_rollback(place, monkeypatch, place.outside)
    assert str(place.outside) in message


def test_the_dag_factory_confines_its_operators_to_its_jobs_folder(place: SimpleNamespace) -> None:
    from streamkeeper.spec import load_spec
    from streamkeeper_airflow import dag_factory

    entry = dag_factory.JobEntry(place.spec.resolve(), load_spec(place.spec))
    confined = {}
    for action in ("start", "monitor", "upgrade", "rollback"):
        dag = getattr(dag_factory, f"{action}_dag")(entry)
        for task in dag.tasks:
            if getattr(task, "jobs_folder", None) is not None:
                confined[f"{action}.{task.task_id}"] = Path(task.jobs_folder)
    expected = ["start.start", "monitor.restart", "upgrade.begin", "upgrade.start_green"]
    expected += ["upgrade.validate", "upgrade.probation", "upgrade.rollback", "rollback.rollback"]
    assert set(expected) <= set(confined), sorted(confined)
    assert set(confined.values()) == {place.jobs.resolve()}


# -- checkpoint folders read from records ---------------------------------------------------


def test_a_recorded_checkpoint_folder_must_be_the_one_a_spec_resolves_to(tmp_path: Path) -> None:
    from streamkeeper.spec import load_spec
    from streamkeeper_airflow.errors import LaunchPolicyError
    from streamkeeper_airflow.launch_policy import (
        check_recorded_checkpoint_dir,
        spec_checkpoint_dir,
    )

    spec = load_spec(SAMPLE / "job.yaml")
    live = spec_checkpoint_dir(spec, tmp_path)
    assert live == (tmp_path / ".streamkeeper" / "checkpoints" / spec.lineage_id).resolve()
    assert check_recorded_checkpoint_dir(str(live), [live], what="folder") == live
    sneaky = f"{live}/../../../../etc"
    assert check_recorded_checkpoint_dir(None, [live], what="folder") is None
    for planted in ("/etc", str(tmp_path), sneaky, f"{live}.old"):
        with pytest.raises(LaunchPolicyError) as refused:
            check_recorded_checkpoint_dir(planted, [live], what="blue's checkpoint folder")
        assert planted in str(refused.value) and str(live) in str(refused.value)


def _job_record(place: SimpleNamespace, checkpoint_dir: str) -> None:
    record = {"job": JOB, "lineage": JOB, "root": str(place.root), "checkpoint_dir": checkpoint_dir}
    LocalStore(place.root).write_json(f"jobs/{JOB}/job.json", record)


def test_a_rollback_sets_aside_only_the_folder_the_spec_resolves_to(
    place: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job record planted under the storage root names a folder of the Airflow host: the
    rollback must refuse before it stops the job, restores a table or moves that folder."""
    victim = place.base / "precious"
    victim.mkdir()
    (victim / "data.txt").write_text("keep me")
    _job_record(place, str(victim))

    message = _refused_rollback(place, monkeypatch, place.spec)
    assert str(victim) in message and "checkpoint.dir" in message
    assert (victim / "data.txt").read_text() == "keep me"
    assert [p.name for p in place.base.iterdir() if p.name.startswith("precious")] == ["precious"]


def _green_record(place: SimpleNamespace, checkpoint_dir: str, upgrade_id: str) -> str:
    from streamkeeper.upgrade.record import UpgradeRecord, UpgradeRecords

    record = UpgradeRecord(
        id=upgrade_id,
        job=JOB,
        lineage=JOB,
        phase="shadow",
        blue={"spec_path": str(place.spec), "checkpoint_dir": checkpoint_dir, "launch": {}},
        green={"spec_path": str(place.spec), "shadow_job": f"{JOB}--{upgrade_id}"},
    )
    UpgradeRecords(LocalStore(place.root), JOB).create(record)
    return record.id


def test_green_takes_over_only_the_folder_blues_spec_resolves_to(
    place: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    from streamkeeper.spec import load_spec
    from streamkeeper_airflow.launch_policy import spec_checkpoint_dir
    from streamkeeper_airflow.operators.upgrade import StartGreenOperator

    _no_launch(monkeypatch, StartGreenOperator)
    planted = _green_record(place, str(place.base / "precious"), "up-planted")
    operator = StartGreenOperator(task_id="green", job=JOB, conn_id=CONN_ID, upgrade_id=planted)
    message = _refused(lambda: operator.execute(_context("start_green", "upgrade")))
    assert str(place.base / "precious") in message

    live = spec_checkpoint_dir(load_spec(place.spec), place.base / "work")
    sound = _green_record(place, str(live), "up-sound")
    operator = StartGreenOperator(task_id="green", job=JOB, conn_id=CONN_ID, upgrade_id=sound)
    with pytest.raises(Launched) as launched:
        operator.execute(_context("start_green", "upgrade"))
    assert launched.value.args[0].checkpoint_dir == str(live)
