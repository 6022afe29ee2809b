"""The Kubernetes launch paths, rendered and checked without a cluster (none can run here).

What is rendered is checked structurally: the SparkApplication against the operator's CRD
schema (a trimmed copy of its openAPIV3Schema, tests/unit/fixtures) with Kubernetes'
strict field validation (no field the schema does not declare), the Secret and the pod
templates round-trip through the kubernetes client's models unchanged, every name is a
DNS-1123 label, labels carry the run token, and no credential appears anywhere but in
the Secret. The API calls are made against a mocked client (CoreV1Api,
CustomObjectsApi): creation, the 409 of a retried launch (same run token: launched) and
the 409 of another launch (an error). spark-submit's cluster mode: refused on a
standalone or local master, its Kubernetes properties, and a submission through a
stand-in spark-submit script.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any
from unittest import mock

import jsonschema
import kubernetes
import pytest
import yaml
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from streamkeeper_airflow import settings
from streamkeeper_airflow.errors import LaunchError
from streamkeeper_airflow.launchers import LAUNCHERS, launcher_for
from streamkeeper_airflow.launchers import kubernetes as k8s
from streamkeeper_airflow.launchers.base import AWS_KEY_NAMES, LaunchRequest
from streamkeeper_airflow.launchers.spark_submit import NO_PYTHON_CLUSTER_MODE, SparkSubmitLauncher

SCHEMA = Path(__file__).parent / "fixtures" / "sparkapplication-v1-openapi-schema.yaml"
TOKEN = "af-0123456789abcdef01234567"
KEYS = {
    "AWS_ACCESS_KEY_ID": "AKIASTREAMKEEPERTEST",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG+bPxRfiCYsecret",
    "AWS_SESSION_TOKEN": "FwoGZXIvYXdzEXAMPLEsessiontoken",
}
SETTINGS = {
    "AWS_REGION": "eu-central-7",
    "AWS_ALLOW_HTTP": "false",
    "AWS_ENDPOINT_URL": "https://objects.internal.example:8443",
}
IMAGE = "registry.example/streamkeeper:0.1.0"


@pytest.fixture(autouse=True)
def no_airflow_settings(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """`[streamkeeper]` options from a dict, not Airflow's configuration."""
    values: dict[str, str] = {}
    monkeypatch.setattr(settings, "option", lambda key, fallback=None: values.get(key, fallback))
    return values


def request(**changes: Any) -> LaunchRequest:
    fields: dict[str, Any] = {
        "job": "keyed-totals",
        "spec_path": "/opt/airflow/jobs/keyed_totals/job.yaml",
        "root": "s3://streamkeeper/prod",
        "run_token": TOKEN,
        "workdir": "/var/lib/streamkeeper",
        "overrides": {"source.path": "s3://streamkeeper/events"},
        "from_checkpoint": "latest",
        "env": {**KEYS, **SETTINGS},
        "spark_conf": {"spark.openlineage.parentRunId": "0190-run"},
    }
    return LaunchRequest(**{**fields, **changes})


def launcher(**options: Any) -> k8s.KubernetesLauncher:
    return k8s.KubernetesLauncher(**{"namespace": "streaming", "image": IMAGE, **options})


def every_value(env: dict[str, str]) -> list[str]:
    """The values to look for: all but a flag's (`AWS_ALLOW_HTTP=false` is no secret, and
    "false" is in many properties)."""
    return [v for v in env.values() if v and v not in ("true", "false")]


# -- names ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("job", "token"),
    [
        ("keyed-totals", TOKEN),
        ("a", TOKEN),
        ("j" * 63, TOKEN),
        ("x-" * 31 + "y", TOKEN),  # truncation must not end on '-'
        ("keyed-totals", "manual:2026-08-18T10:00:00+00:00"),
        ("keyed-totals", "T" * 128),
    ],
)
def test_names_are_dns1123_labels_short_enough_for_the_operator(job: str, token: str) -> None:
    name = k8s.app_name(job, token)
    assert k8s.DNS1123_LABEL.match(name) and len(name) <= k8s.MAX_APP_NAME, name
    assert name == k8s.app_name(job, token), "a retry must find the same name"
    for pod in (k8s.application_driver_pod(name), k8s.submit_driver_pod(name)):
        assert k8s.DNS1123_LABEL.match(pod) and len(pod) <= 63
    # The operator's driver service name `{name}-0-driver-svc` is a DNS-1035 label too.
    assert name[0].isalpha() and len(f"{name}-0-driver-svc") <= 63
    for value in k8s.labels(job, token).values():
        assert k8s.LABEL_VALUE.match(value) and len(value) <= 63


def test_names_differ_by_token_and_show_airflow_tokens() -> None:
    other = "af-fedcba9876543210fedcba98"
    assert k8s.app_name("keyed-totals", TOKEN) == "sk-keyed-totals-" + TOKEN[-10:]
    assert k8s.app_name("keyed-totals", TOKEN) != k8s.app_name("keyed-totals", other)
    assert k8s.app_name("j" * 63, TOKEN) != k8s.app_name("j" * 63, other)


# -- the SparkApplication against the operator's CRD -------------------------------------


def _schema() -> dict[str, Any]:
    return yaml.safe_load(SCHEMA.read_text())


def undeclared_fields(instance: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Fields Kubernetes' strict field validation would reject: not in the schema's
    `properties` where it declares no `additionalProperties`."""
    found: list[str] = []
    if isinstance(instance, dict):
        declared = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key, value in instance.items():
            if key in declared:
                found += undeclared_fields(value, declared[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                found += undeclared_fields(value, extra, f"{path}.{key}")
            elif not schema.get("x-kubernetes-preserve-unknown-fields"):
                found.append(f"{path}.{key}")
    elif isinstance(instance, list) and "items" in schema:
        for i, item in enumerate(instance):
            found += undeclared_fields(item, schema["items"], f"{path}[{i}]")
    return found


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"service_account": "spark", "pod_identity": True, "image_pull_policy": "IfNotPresent"},
        {
            "driver_cores": 1,
            "driver_memory": "2g",
            "executor_instances": 3,
            "executor_cores": 2,
            "executor_memory": "4g",
            "working_dir": "/opt/streamkeeper",
            "conf": {"spark.sql.shuffle.partitions": "8"},
        },
    ],
)
def test_the_application_validates_against_the_operators_crd_schema(
    options: dict[str, Any],
) -> None:
    _, app = launcher(**options).manifests(request())
    schema = _schema()
    jsonschema.validate(app, schema)
    body = {k: v for k, v in app.items() if k not in ("apiVersion", "kind", "metadata")}
    assert undeclared_fields(body, schema) == []
    assert app["apiVersion"] == "spark.apache.org/v1" and app["kind"] == "SparkApplication"
    spec = app["spec"]
    assert spec["runtimeVersions"] == {"sparkVersion": "4.2.0"}
    assert spec["pyFiles"] == k8s.DEFAULT_PY_FILE and spec["deploymentMode"] == "ClusterMode"
    assert spec["applicationTolerations"]["restartConfig"] == {"restartPolicy": "Never"}
    assert spec["sparkConf"]["spark.kubernetes.container.image"] == IMAGE
    # The metadata is an ObjectMeta the API server accepts as it is.
    assert _round_trip(app["metadata"], "V1ObjectMeta") == app["metadata"]


def test_the_schema_check_catches_a_misspelt_field() -> None:
    _, app = launcher().manifests(request())
    app["spec"]["mainApplicationFile"] = "local:///app.py"  # kubeflow's field, not this CRD's
    app["spec"]["driverSpec"]["podTemplateSpec"]["spec"]["containers"][0]["envfrom"] = []
    app["spec"]["applicationTolerations"]["restartConfig"]["restartPolicy"] = "never"
    body = {k: v for k, v in app.items() if k not in ("apiVersion", "kind", "metadata")}
    assert sorted(undeclared_fields(body, _schema())) == [
        ".spec.driverSpec.podTemplateSpec.spec.containers[0].envfrom",
        ".spec.mainApplicationFile",
    ]
    with pytest.raises(jsonschema.ValidationError, match="'never' is not one of"):
        jsonschema.validate(app, _schema())


def test_the_driver_runs_streamkeeper_run_with_the_run_token_and_no_credential() -> None:
    _, app = launcher(driver_spec_path="/opt/streamkeeper/jobs/keyed_totals/job.yaml").manifests(
        request()
    )
    args = app["spec"]["driverArgs"]
    assert args[:6] == [
        "run",
        "/opt/streamkeeper/jobs/keyed_totals/job.yaml",
        "--root",
        "s3://streamkeeper/prod",
        "--run-token",
        TOKEN,
    ]
    assert args[-2:] == ["--master", k8s.IN_CLUSTER_MASTER]
    assert ["--set", "source.path=s3://streamkeeper/events"] == args[6:8]
    assert "--set" in args and "spark.conf.spark.openlineage.parentRunId=0190-run" in args
    assert ["--from-checkpoint", "latest"] == args[args.index("--from-checkpoint") :][:2]
    # a master the request names wins (a pod running Spark locally, or another API address)
    _, local = launcher().manifests(request(master="local[2]"))
    assert local["spec"]["driverArgs"][-2:] == ["--master", "local[2]"]


# -- the Secret and the pod templates through the client's models ------------------------


def _round_trip(data: dict[str, Any], model: str) -> Any:
    """`data` read as the client's model and written back: a misspelt or misplaced field
    is dropped (so the comparison fails), a missing required one raises."""
    client = ApiClient()
    return client.sanitize_for_serialization(client._ApiClient__deserialize(data, model))


def test_secret_and_pod_templates_round_trip_through_the_client_models() -> None:
    secret, app = launcher().manifests(request())
    assert secret is not None
    assert _round_trip(secret, "V1Secret") == secret
    for side in ("driverSpec", "executorSpec"):
        template = app["spec"][side]["podTemplateSpec"]
        assert _round_trip(template, "V1PodTemplateSpec") == template
        (container,) = template["spec"]["containers"]
        assert container["envFrom"] == [
            {"secretRef": {"name": secret["metadata"]["name"], "optional": False}}
        ]
    names = {
        app["spec"][s]["podTemplateSpec"]["spec"]["containers"][0]["name"]
        for s in (
            "driverSpec",
            "executorSpec",
        )
    }
    assert names == {k8s.DRIVER_CONTAINER, k8s.EXECUTOR_CONTAINER}


def test_credentials_are_only_in_the_secret() -> None:
    env = {**KEYS, **SETTINGS}
    secret, app = launcher(service_account="spark").manifests(request())
    assert secret is not None and secret["stringData"] == env
    assert "data" not in secret and secret["type"] == "Opaque"
    text = json.dumps(app)
    assert not [v for v in every_value(env) if v in text], "a setting outside the Secret"
    conf = k8s.spark_submit_conf(
        request(),
        name="sk-x",
        namespace="streaming",
        image=IMAGE,
        secret_name="sk-x",
        secret_keys=tuple(env),
    )
    assert not [v for v in every_value(env) if v in json.dumps(conf)]


def test_pod_identity_ships_no_key() -> None:
    secret, app = launcher(service_account="spark", pod_identity=True).manifests(request())
    assert secret is not None and set(secret["stringData"]) == set(SETTINGS)
    assert not set(secret["stringData"]) & set(AWS_KEY_NAMES)
    conf = app["spec"]["sparkConf"]
    assert conf["spark.kubernetes.authenticate.driver.serviceAccountName"] == "spark"
    assert conf["spark.kubernetes.authenticate.executor.serviceAccountName"] == "spark"
    # Nothing left to ship: no Secret, and no pod reads one.
    none, bare = launcher(pod_identity=True).manifests(request(env=dict(KEYS)))
    assert none is None
    assert "envFrom" not in json.dumps(bare)


def test_a_key_smuggled_through_conf_is_refused_without_being_named() -> None:
    leaky = launcher(conf={"spark.hadoop.fs.s3a.secret.key": KEYS["AWS_SECRET_ACCESS_KEY"]})
    with pytest.raises(LaunchError, match="AWS_SECRET_ACCESS_KEY") as refused:
        leaky.manifests(request())
    assert KEYS["AWS_SECRET_ACCESS_KEY"] not in str(refused.value)


def test_labels_and_annotations_carry_the_job_and_the_run_token() -> None:
    secret, app = launcher().manifests(request())
    assert secret is not None
    templates = [app["spec"][s]["podTemplateSpec"] for s in ("driverSpec", "executorSpec")]
    for meta in (app["metadata"], secret["metadata"], *(t["metadata"] for t in templates)):
        assert meta["labels"][k8s.LABEL_TOKEN] == TOKEN
        assert meta["labels"][k8s.LABEL_JOB] == "keyed-totals"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "streamkeeper"
        assert meta["annotations"][k8s.ANNOTATION_TOKEN] == TOKEN
    assert app["metadata"]["name"] == secret["metadata"]["name"]
    assert app["metadata"]["namespace"] == secret["metadata"]["namespace"] == "streaming"
    # A token no label may hold is hashed in the label, kept whole in the annotation.
    odd = "manual:2026-08-18T10:00:00+00:00"
    _, app = launcher().manifests(request(run_token=odd))
    assert app["metadata"]["labels"][k8s.LABEL_TOKEN].startswith("h-")
    assert app["metadata"]["annotations"][k8s.ANNOTATION_TOKEN] == odd


# -- options ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"image": None}, "needs an image"),
        ({"namespace": "Streaming_1"}, "'Streaming_1' is not a Kubernetes namespace"),
        ({"driver_memory": "lots"}, "driver_memory 'lots' is not a Spark memory size"),
        ({"executor_instances": 0}, "executor_instances 0 is below 1"),
        ({"image_pull_policy": "always"}, "image_pull_policy 'always' is not one of"),
        ({"py_file": "/opt/app.py"}, "py_file '/opt/app.py' is not a URI"),
        ({"service_account": "Spark SA"}, "service_account 'Spark SA'"),
        ({"pod_identity": "yes"}, "pod_identity 'yes' is not true or false"),
        ({"in_cluster": True, "kubeconfig": "/k"}, "in_cluster excludes kubeconfig"),
        ({"imagePullPolicy": "Always"}, "unknown kubernetes launcher option"),
    ],
)
def test_bad_options_are_refused_by_name(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        launcher(**options)


def test_defaults_come_from_the_airflow_setting(no_airflow_settings: dict[str, str]) -> None:
    no_airflow_settings["kubernetes_options"] = json.dumps(
        {"namespace": "streaming", "image": IMAGE, "service_account": "spark"}
    )
    from_settings = launcher_for("kubernetes")
    assert isinstance(from_settings, k8s.KubernetesLauncher) and "kubernetes" in LAUNCHERS
    assert from_settings.options.image == IMAGE
    assert from_settings.options.service_account == "spark"
    overridden = launcher_for("kubernetes", namespace="other")
    assert overridden.options.namespace == "other" and overridden.options.image == IMAGE
    no_airflow_settings["kubernetes_options"] = "namespace=streaming"
    with pytest.raises(ValueError, match="kubernetes_options is not a JSON object"):
        launcher_for("kubernetes")


# -- the API calls, against a mocked client ------------------------------------------------


class FakeCluster:
    """CoreV1Api and CustomObjectsApi stand-ins holding objects by name, with 409s."""

    def __init__(self) -> None:
        self.secrets: dict[str, Any] = {}
        self.apps: dict[str, dict[str, Any]] = {}
        self.core = mock.MagicMock(name="CoreV1Api")
        self.custom = mock.MagicMock(name="CustomObjectsApi")
        self.core.create_namespaced_secret.side_effect = self._create_secret
        self.core.read_namespaced_secret.side_effect = lambda name, ns: self.secrets[name]
        self.custom.create_namespaced_custom_object.side_effect = self._create_app
        self.custom.get_namespaced_custom_object.side_effect = lambda name, **where: self.apps[name]

    def _create_secret(self, namespace: str, body: dict[str, Any]) -> Any:
        name = body["metadata"]["name"]
        if name in self.secrets:
            raise ApiException(status=409, reason="Conflict")
        self.secrets[name] = ApiClient()._ApiClient__deserialize(body, "V1Secret")
        return self.secrets[name]

    def _create_app(self, body: dict[str, Any], **where: Any) -> dict[str, Any]:
        assert where == {
            "group": "spark.apache.org",
            "version": "v1",
            "namespace": body["metadata"]["namespace"],
            "plural": "sparkapplications",
        }
        name = body["metadata"]["name"]
        if name in self.apps:
            raise ApiException(status=409, reason="Conflict")
        self.apps[name] = {**body, "metadata": {**body["metadata"], "uid": f"uid-{name}"}}
        return self.apps[name]


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> FakeCluster:
    fake = FakeCluster()
    configs: list[dict[str, Any]] = []

    def new_client_from_config(**kwargs: Any) -> ApiClient:
        configs.append(kwargs)
        return ApiClient()

    monkeypatch.setattr(kubernetes.config, "new_client_from_config", new_client_from_config)
    monkeypatch.setattr(kubernetes.client, "CoreV1Api", lambda api: fake.core)
    monkeypatch.setattr(kubernetes.client, "CustomObjectsApi", lambda api: fake.custom)
    fake.configs = configs  # type: ignore[attr-defined]
    return fake


def test_launch_creates_the_secret_then_the_application_and_owns_the_secret(
    cluster: FakeCluster,
) -> None:
    driver = launcher(kubeconfig="/etc/k8s/config", context="prod").launch(request())
    name = k8s.app_name("keyed-totals", TOKEN)
    assert cluster.configs == [  # type: ignore[attr-defined]
        {"config_file": "/etc/k8s/config", "context": "prod", "persist_config": False}
    ]
    assert driver.launcher == "kubernetes" and driver.pid == 0
    assert driver.host == f"k8s:streaming/{name}-0-driver"
    assert driver.process_started_at is None and driver.log and "kubectl" in driver.log
    namespace, body = cluster.core.create_namespaced_secret.call_args.args
    assert namespace == "streaming" and body["stringData"] == {**KEYS, **SETTINGS}
    assert cluster.apps[name]["spec"]["driverArgs"][5] == TOKEN
    (owner_patch,) = cluster.core.patch_namespaced_secret.call_args_list
    assert owner_patch.args[:2] == (name, "streaming")
    (owner,) = owner_patch.args[2]["metadata"]["ownerReferences"]
    assert owner == {
        "apiVersion": "spark.apache.org/v1",
        "kind": "SparkApplication",
        "name": name,
        "uid": f"uid-{name}",
        "blockOwnerDeletion": False,
        "controller": False,
    }
    assert _round_trip(owner, "V1OwnerReference") == owner


def test_a_retried_launch_with_the_same_token_is_launched_once(cluster: FakeCluster) -> None:
    first = launcher().launch(request())
    rotated = {**KEYS, "AWS_SECRET_ACCESS_KEY": "rotated-secret-value"}
    again = launcher().launch(request(env={**rotated, **SETTINGS}))
    assert again == first
    assert cluster.custom.create_namespaced_custom_object.call_count == 2  # the second: 409
    assert len(cluster.apps) == 1 and len(cluster.secrets) == 1
    # The Secret of the earlier try gets this try's values (a rotated key).
    name = k8s.app_name("keyed-totals", TOKEN)
    update = [
        c.args[2]
        for c in cluster.core.patch_namespaced_secret.call_args_list
        if "stringData" in c.args[2]
    ]
    assert update == [{"stringData": {**rotated, **SETTINGS}}]
    assert cluster.core.read_namespaced_secret.call_args.args == (name, "streaming")


def test_a_409_of_another_token_is_an_error(cluster: FakeCluster) -> None:
    name = k8s.app_name("keyed-totals", TOKEN)
    stale = "af-aaaaaaaaaaaaaaaaaaaaaaaa"
    _, foreign = launcher().manifests(request(run_token=stale))
    cluster.apps[name] = {**foreign, "metadata": {**foreign["metadata"], "name": name}}
    with pytest.raises(LaunchError, match=f"exists with run token {stale}, not {TOKEN}"):
        launcher().launch(request(env={}))
    # The Secret's name held by something that is not ours at all:
    cluster.apps.clear()
    cluster.secrets[name] = ApiClient()._ApiClient__deserialize(
        {"metadata": {"name": name, "namespace": "streaming"}}, "V1Secret"
    )
    with pytest.raises(LaunchError, match="exists with no streamkeeper run token"):
        launcher().launch(request())
    assert not cluster.apps, "no application after its Secret was refused"


def test_api_refusals_name_the_fix_and_never_a_credential(cluster: FakeCluster) -> None:
    secret_value = KEYS["AWS_SECRET_ACCESS_KEY"]
    cluster.core.create_namespaced_secret.side_effect = ApiException(status=403, reason="Forbidden")
    cluster.core.create_namespaced_secret.side_effect.body = (
        f'{{"message": "secrets is forbidden", "echo": "{secret_value}"}}'
    )
    with pytest.raises(LaunchError, match="403 Forbidden. .*RBAC") as refused:
        launcher().launch(request())
    assert secret_value not in str(refused.value)
    cluster.core.create_namespaced_secret.side_effect = None
    cluster.custom.create_namespaced_custom_object.side_effect = ApiException(
        status=404, reason="Not Found"
    )
    with pytest.raises(LaunchError, match="is the operator's CRD installed"):
        launcher().launch(request())


def test_an_owner_that_cannot_be_set_does_not_fail_the_launch(cluster: FakeCluster) -> None:
    cluster.core.patch_namespaced_secret.side_effect = ApiException(status=403, reason="no")
    assert launcher().launch(request()).pid == 0


def _kubeconfig(tmp_path: Path, server: str) -> str:
    config = tmp_path / "kubeconfig"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "kube-token"}}],
                "contexts": [{"name": "prod", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "prod",
            }
        )
    )
    return str(config)


def test_client_configuration_from_a_kubeconfig_file(tmp_path: Path) -> None:
    with k8s.api_client(_kubeconfig(tmp_path, "https://127.0.0.1:6443"), "prod", False) as api:
        assert api.configuration.host == "https://127.0.0.1:6443"
    with pytest.raises(LaunchError, match="no Kubernetes client configuration from /nowhere"):
        k8s.api_client("/nowhere", None, False)


def test_an_unreachable_api_server_is_a_launch_error(tmp_path: Path) -> None:
    """The real client (no mock) against a closed port of this host."""
    config = _kubeconfig(tmp_path, "https://127.0.0.1:1")
    with pytest.raises(LaunchError, match="could not reach the Kubernetes API server") as e:
        launcher(kubeconfig=config).launch(request())
    assert "https://127.0.0.1:1" in str(e.value)
    assert not [v for v in every_value(KEYS) if v in str(e.value)]


# -- spark-submit's cluster mode -----------------------------------------------------------


@pytest.mark.parametrize("master", ["spark://gateway:7077", "local[*]", "local"])
def test_cluster_mode_is_refused_on_standalone_and_local_masters(master: str) -> None:
    submit = SparkSubmitLauncher(deploy_mode="cluster", py_file=k8s.DEFAULT_PY_FILE)
    with pytest.raises(LaunchError) as refused:
        submit.launch(request(master=master))
    assert f"master {master!r}" in str(refused.value)
    assert NO_PYTHON_CLUSTER_MODE in str(refused.value)
    assert (
        "Spark does not support cluster deploy mode for Python applications on "
        "standalone clusters; use client mode on a gateway host (launcher 'ssh' or "
        "'spark_submit' in client mode) or a Kubernetes/YARN master" in str(refused.value)
    )


def test_cluster_mode_needs_py_file_and_a_known_deploy_mode() -> None:
    with pytest.raises(LaunchError, match="pass py_file, the entry file where the driver runs"):
        SparkSubmitLauncher(deploy_mode="cluster").cluster_launch(
            request(master="k8s://https://api.example:6443")
        )
    with pytest.raises(ValueError, match="deploy_mode 'server' is not one of client, cluster"):
        SparkSubmitLauncher(deploy_mode="server")
    with pytest.raises(LaunchError, match="spark.kubernetes.container.image"):
        SparkSubmitLauncher(deploy_mode="cluster", py_file=k8s.DEFAULT_PY_FILE).cluster_launch(
            request(master="k8s://https://api.example:6443")
        )


def _k8s_submit(**options: Any) -> SparkSubmitLauncher:
    return SparkSubmitLauncher(
        deploy_mode="cluster",
        py_file=k8s.DEFAULT_PY_FILE,
        conf={
            "spark.kubernetes.container.image": IMAGE,
            "spark.kubernetes.namespace": "streaming",
            "spark.kubernetes.authenticate.driver.serviceAccountName": "spark",
        },
        **options,
    )


def test_cluster_mode_on_kubernetes_renders_the_pod_from_the_run_token() -> None:
    submit = _k8s_submit(spark_submit="/opt/spark/bin/spark-submit")
    req = request(master="k8s://https://api.example:6443")
    plan = submit.cluster_launch(req)
    name = k8s.app_name("keyed-totals", TOKEN)
    assert plan.host == f"k8s:streaming/{name}-driver" and plan.entry == k8s.DEFAULT_PY_FILE
    conf = plan.conf
    assert conf["spark.kubernetes.driver.pod.name"] == f"{name}-driver"
    assert conf["spark.kubernetes.submission.waitAppCompletion"] == "false"
    assert conf["spark.kubernetes.driver.label.streamkeeper.io/run-token"] == TOKEN
    assert conf["spark.kubernetes.executor.label.streamkeeper.io/job"] == "keyed-totals"
    for key in (*KEYS, *SETTINGS):
        assert conf[f"spark.kubernetes.driver.secretKeyRef.{key}"] == f"{name}:{key}"
        assert conf[f"spark.kubernetes.executor.secretKeyRef.{key}"] == f"{name}:{key}"
    assert plan.secret is not None and plan.secret["stringData"] == {**KEYS, **SETTINGS}
    command = submit.command(req, plan.entry, plan.conf)
    assert command[:6] == [
        "/opt/spark/bin/spark-submit",
        "--master",
        "k8s://https://api.example:6443",
        "--deploy-mode",
        "cluster",
        "--name",
    ]
    assert command[command.index(k8s.DEFAULT_PY_FILE) + 1 :][:2] == ["run", req.spec_path]
    assert not [v for v in every_value(req.env) if v in json.dumps(command)]


def _fake_spark_submit(tmp_path: Path, code: int, output: str) -> str:
    script = tmp_path / "spark-submit"
    script.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/args\necho '{output}'\nexit {code}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_cluster_mode_submits_and_returns_a_driver_followed_by_its_token(
    tmp_path: Path, cluster: FakeCluster
) -> None:
    submit = _k8s_submit(
        spark_submit=_fake_spark_submit(tmp_path, 0, "submitted"),
        driver_spec_path="/opt/streamkeeper/jobs/keyed_totals/job.yaml",
    )
    req = request(master="k8s://https://api.example:6443", workdir=str(tmp_path))
    driver = submit.launch(req)
    name = k8s.app_name("keyed-totals", TOKEN)
    assert driver.pid == 0 and driver.host == f"k8s:streaming/{name}-driver"
    assert driver.launcher == "spark_submit" and driver.process_started_at is None
    args = (tmp_path / "args").read_text()
    assert "--deploy-mode cluster" in args and "/opt/streamkeeper/jobs/keyed_totals" in args
    assert not [v for v in every_value(req.env) if v in args]
    (created,) = cluster.secrets.values()
    assert created.metadata.name == name and created.string_data == {**KEYS, **SETTINGS}


def test_a_refused_submission_fails_the_launch_with_a_redacted_log(
    tmp_path: Path, cluster: FakeCluster
) -> None:
    secret_value = KEYS["AWS_SECRET_ACCESS_KEY"]
    submit = _k8s_submit(
        spark_submit=_fake_spark_submit(tmp_path, 1, f"Forbidden, key {secret_value}")
    )
    req = request(master="k8s://https://api.example:6443", workdir=str(tmp_path))
    with pytest.raises(LaunchError, match=r"could not submit job 'keyed-totals'.*\(exit 1\)") as e:
        submit.launch(req)
    assert "Forbidden" in str(e.value) and secret_value not in str(e.value)


def test_cluster_mode_on_yarn_refuses_keys_on_the_command_line() -> None:
    submit = SparkSubmitLauncher(deploy_mode="cluster", py_file="hdfs:///apps/driver.py")
    with pytest.raises(LaunchError, match="AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY"):
        submit.cluster_launch(request(master="yarn"))
    plan = submit.cluster_launch(request(master="yarn", env=dict(SETTINGS)))
    assert plan.conf["spark.yarn.submit.waitAppCompletion"] == "false"
    assert TOKEN in plan.conf["spark.yarn.tags"] and plan.host == "yarn:streamkeeper-keyed-totals"


def test_client_mode_is_unchanged(tmp_path: Path) -> None:
    submit = SparkSubmitLauncher(spark_submit="/bin/spark-submit")
    command = submit.command(request(master="spark://gateway:7077"), tmp_path / "entry.py")
    assert command[3:5] == ["--deploy-mode", "client"]
    assert command[command.index(str(tmp_path / "entry.py")) + 1] == "run"
