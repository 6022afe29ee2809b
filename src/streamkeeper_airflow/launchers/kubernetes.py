"""The Kubernetes launcher: a SparkApplication of the Apache Spark Kubernetes Operator.

    launcher_for("kubernetes", namespace="streaming", image="registry/streamkeeper:0.1.0",
                 service_account="spark")

The driver runs in a pod the operator (apache/spark-kubernetes-operator, CRD
`sparkapplications.spark.apache.org/v1`) creates from one custom resource, never on the
Airflow worker: the task creates the resource and returns. Its name comes from the run
token (`app_name`), so a retried task finds its own launch (a 409 with its token is that
launch; with another token, an error). The driver runs `streamkeeper run SPEC --root ROOT
--run-token TOKEN ...` (`LaunchRequest.run_args`), and is found and followed through the
control plane (heartbeat, run token, epoch), never by a pid: the launched driver's pid
is 0 and its host `k8s:{namespace}/{driver pod}`, which no worker's host name equals.

Credentials never appear in the SparkApplication (anyone who may read it would read
them): the connection's storage settings (`LaunchRequest.env`) go into a Secret named
after the application, labelled with the job and run token and owned by the application
(Kubernetes deletes it with the application), and reach the driver and the executors
through `envFrom`. With a `service_account` whose cloud identity reaches the storage
(IRSA, EKS Pod Identity, GKE Workload Identity), `pod_identity=True` ships none of the
connection's keys at all.

`spark_submit_conf` renders the same launch as `spark-submit --deploy-mode cluster`
properties for a `k8s://` master (the spark_submit launcher's cluster mode): the driver
pod named from the run token, the image, the secret's keys as `secretKeyRef`s.

Defaults of every option come from `[streamkeeper] kubernetes_options` (a JSON object),
so DAGs generated from a spec with `airflow.launcher: kubernetes` need no code;
`launcher_options` override them. Rendered and unit-tested only: no Kubernetes API
server runs where this was written (docs/deploying-kubernetes.md).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from streamkeeper_airflow.errors import LaunchError
from streamkeeper_airflow.launchers.base import AWS_KEY_NAMES, LaunchedDriver, LaunchRequest

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

log = logging.getLogger(__name__)

GROUP = "spark.apache.org"
VERSION = "v1"
PLURAL = "sparkapplications"
KIND = "SparkApplication"
API_VERSION = f"{GROUP}/{VERSION}"

# The entry file in the image: the spark_submit launcher's DRIVER_ENTRY (two lines that run
# `python -m streamkeeper`), at this path unless `py_file` says otherwise.
DEFAULT_PY_FILE = "local:///opt/streamkeeper/streamkeeper_driver.py"
DEFAULT_SPARK_VERSION = "4.2.0"  # requirements.txt's pyspark
IN_CLUSTER_MASTER = "k8s://https://kubernetes.default.svc"
DRIVER_CONTAINER = "spark-kubernetes-driver"  # Spark's own container names
EXECUTOR_CONTAINER = "spark-kubernetes-executor"
DEPLOY_MODE_VARIABLE = "STREAMKEEPER_DEPLOY_MODE"  # "cluster" in a driver pod

LABEL_JOB = "streamkeeper.io/job"
LABEL_TOKEN = "streamkeeper.io/run-token"  # the token, or a hash of it (label_value)
ANNOTATION_TOKEN = "streamkeeper.io/run-token"  # the token itself
MANAGED_BY = ("app.kubernetes.io/managed-by", "streamkeeper")

# The operator names the driver pod `{name}-{attempt}-driver` while `{name}-{attempt}` has
# at most 46 characters (SparkAppSubmissionWorker.DEFAULT_ID_LENGTH_LIMIT), else a hash:
# 44 keeps it predictable for attempt 0 (the only one: restartPolicy Never).
MAX_APP_NAME = 44
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_AIRFLOW_TOKEN = re.compile(r"^af-[0-9a-f]{24}$")  # starts.run_token_for
_MEMORY = re.compile(r"^[1-9][0-9]*[kmgtp]?b?$", re.IGNORECASE)
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
SETTINGS_KEY = "kubernetes_options"


# -- names ----------------------------------------------------------------------------


def app_name(job: str, run_token: str) -> str:
    """The SparkApplication's (and its Secret's) name: `sk-{job}-{10 characters of the
    token}`, a DNS-1123 label of at most 44 characters, the same for every try of a task.

    Airflow's tokens (`af-` and 24 hex digits) give their last 10 digits, so the name shows
    which token it runs; any other token gives 10 hex digits of its SHA-256.
    """
    if _AIRFLOW_TOKEN.match(run_token):
        suffix = run_token[-10:]
    else:
        suffix = hashlib.sha256(run_token.encode()).hexdigest()[:10]
    job_part = re.sub(r"[^a-z0-9-]+", "-", job.lower()).strip("-")
    job_part = job_part[: MAX_APP_NAME - len("sk--") - len(suffix)].rstrip("-")
    return f"sk-{job_part}-{suffix}" if job_part else f"sk-{suffix}"


def application_driver_pod(name: str) -> str:
    """The driver pod the operator creates for SparkApplication `name` (attempt 0)."""
    return f"{name}-0-driver"


def submit_driver_pod(name: str) -> str:
    """The driver pod of `spark-submit --deploy-mode cluster` (named by our conf)."""
    return f"{name}-driver"


def label_value(value: str) -> str:
    """`value` if Kubernetes takes it as a label value, else `h-` and 40 hex digits of its
    SHA-256 (run tokens may hold ':' and reach 128 characters; label values may not)."""
    if len(value) <= 63 and LABEL_VALUE.match(value):
        return value
    return "h-" + hashlib.sha256(value.encode()).hexdigest()[:40]


def labels(job: str, run_token: str) -> dict[str, str]:
    return {
        MANAGED_BY[0]: MANAGED_BY[1],
        LABEL_JOB: label_value(job),
        LABEL_TOKEN: label_value(run_token),
    }


def token_of(metadata: dict[str, Any] | None) -> str | None:
    """The run token an object of ours was created for (its annotation), or None."""
    return ((metadata or {}).get("annotations") or {}).get(ANNOTATION_TOKEN)


# -- options ----------------------------------------------------------------------------


@dataclass(frozen=True)
class KubernetesOptions:
    """The launcher's options (`launcher_options`, over `[streamkeeper] kubernetes_options`).

    Attributes:
        namespace: where the SparkApplication, its Secret and its pods live.
        image: the driver's and executors' image: streamkeeper[spark], the job's code,
            the entry file at `py_file`, and the jobs folder at `driver_spec_path`.
        image_pull_policy: Always | IfNotPresent | Never (default: Kubernetes').
        service_account: the pods' service account (the driver creates executor pods as
            it: it needs RBAC for pods, services and configmaps in the namespace).
        pod_identity: the pods reach the storage through their service account's cloud
            identity (IRSA, EKS Pod Identity, GKE Workload Identity): the connection's
            keys are not shipped. Explicit, not implied by service_account, which the
            driver needs anyway to create its executors.
        py_file: the entry file in the image (`local://` URI).
        driver_spec_path: the job's spec in the image (default: the request's path: the
            image holds the jobs folder where the workers do).
        working_dir: the driver container's working directory (relative spec paths).
        master: the driver's `--master` (default: the request's, else the API server
            as seen from inside the cluster).
        spark_version: the operator's `runtimeVersions.sparkVersion`.
        driver_cores, driver_memory, executor_instances, executor_cores,
        executor_memory: the usual Spark resources.
        conf: more Spark properties (never a credential: the resource shows them).
        kubeconfig, context: the Kubernetes client's configuration file and context
            (default: $KUBECONFIG or ~/.kube/config, its current context).
        in_cluster: use the worker pod's own service account instead.
    """

    namespace: str = "default"
    image: str | None = None
    image_pull_policy: str | None = None
    service_account: str | None = None
    pod_identity: bool = False
    py_file: str = DEFAULT_PY_FILE
    driver_spec_path: str | None = None
    working_dir: str | None = None
    master: str | None = None
    spark_version: str = DEFAULT_SPARK_VERSION
    driver_cores: int | None = None
    driver_memory: str | None = None
    executor_instances: int | None = None
    executor_cores: int | None = None
    executor_memory: str | None = None
    conf: dict[str, str] = field(default_factory=dict)
    kubeconfig: str | None = None
    context: str | None = None
    in_cluster: bool = False

    @classmethod
    def of(cls, options: dict[str, Any]) -> KubernetesOptions:
        """`options` over `[streamkeeper] kubernetes_options`, checked.

        Raises:
            ValueError: an unknown option or a bad value (named, with the fix).
        """
        merged = {**settings_options(), **options}
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(merged) - known)
        if unknown:
            raise ValueError(
                f"unknown kubernetes launcher option(s) {', '.join(map(repr, unknown))}; "
                f"expected some of {', '.join(sorted(known))}"
            )
        made = cls(**merged)
        made.check()
        return made

    def check(self) -> None:
        """Raises ValueError naming the bad option and what it takes."""
        _check_names(self)
        _check_resources(self)
        if self.image_pull_policy is not None and self.image_pull_policy not in PULL_POLICIES:
            raise ValueError(
                f"image_pull_policy {self.image_pull_policy!r} is not one of "
                f"{', '.join(PULL_POLICIES)}"
            )
        if not self.py_file.startswith(("local://", "s3a://", "s3://", "https://", "http://")):
            raise ValueError(
                f"py_file {self.py_file!r} is not a URI the driver pod can read; expected "
                f"e.g. {DEFAULT_PY_FILE!r} (a file in the image)"
            )
        for flag in ("pod_identity", "in_cluster"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag} {getattr(self, flag)!r} is not true or false")
        if self.in_cluster and (self.kubeconfig or self.context):
            raise ValueError("in_cluster excludes kubeconfig and context: pass one or the other")


def _check_names(options: KubernetesOptions) -> None:
    if not DNS1123_LABEL.match(options.namespace) or len(options.namespace) > 63:
        raise ValueError(
            f"namespace {options.namespace!r} is not a Kubernetes namespace name (1-63 of "
            "a-z, 0-9 and '-', starting and ending with a letter or digit)"
        )
    if not options.image:
        raise ValueError(
            "the kubernetes launcher needs an image (launcher_options image=..., or "
            f"'image' in [streamkeeper] {SETTINGS_KEY}): streamkeeper[spark] with the job's "
            f"code and the entry file {options.py_file}"
        )
    account = options.service_account
    if account is not None and (not DNS1123_SUBDOMAIN.match(account) or len(account) > 253):
        raise ValueError(f"service_account {account!r} is not a Kubernetes object name")


def _check_resources(options: KubernetesOptions) -> None:
    for name in ("driver_cores", "executor_instances", "executor_cores"):
        value = getattr(options, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{name} {value!r} is not a whole number")
        if value is not None and value < 1:
            raise ValueError(f"{name} {value!r} is below 1")
    for name in ("driver_memory", "executor_memory"):
        value = getattr(options, name)
        if value is not None and not _MEMORY.match(str(value)):
            raise ValueError(f"{name} {value!r} is not a Spark memory size such as '2g' or '512m'")
    for key, value in options.conf.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ValueError(f"conf {key!r}: keys and values are strings")


def settings_options() -> dict[str, Any]:
    """`[streamkeeper] kubernetes_options`: a JSON object of default options ({} if unset).

    Raises:
        ValueError: not a JSON object.
    """
    from streamkeeper_airflow import settings

    text = settings.option("kubernetes_options")  # SETTINGS_KEY, declared in provider.py
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ValueError(
            f"[streamkeeper] {SETTINGS_KEY} is not a JSON object; expected e.g. "
            '{"namespace": "streaming", "image": "registry/streamkeeper:0.1.0"}'
        )
    return value


# -- rendering (pure) -------------------------------------------------------------------


def shipped_env(request: LaunchRequest, options: KubernetesOptions) -> dict[str, str]:
    """What of the connection's settings the pods get (through the Secret): all of them,
    less the keys when the pods have a cloud identity of their own."""
    if options.pod_identity:
        return {k: v for k, v in request.env.items() if k not in AWS_KEY_NAMES}
    return dict(request.env)


def driver_args(request: LaunchRequest, options: KubernetesOptions) -> list[str]:
    """`COMMAND SPEC --root ROOT --run-token TOKEN ... --master M`: the entry file's
    arguments, with the spec's path in the image and the master the driver must use."""
    master = request.master or options.master or IN_CLUSTER_MASTER
    spec_path = options.driver_spec_path or request.spec_path
    driver_request = replace(request, spec_path=spec_path, master=master, env={})
    return [driver_request.command, *driver_request.run_args()]


def render_secret(
    request: LaunchRequest, options: KubernetesOptions, name: str
) -> dict[str, Any] | None:
    """The Secret holding what `shipped_env` ships (None: nothing to ship)."""
    env = shipped_env(request, options)
    if not env:
        return None
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": _metadata(request, options, name),
        "stringData": dict(sorted(env.items())),
    }


def _metadata(request: LaunchRequest, options: KubernetesOptions, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": options.namespace,
        "labels": labels(request.job, request.run_token),
        "annotations": {ANNOTATION_TOKEN: request.run_token},
    }


def _pod_template(
    request: LaunchRequest,
    options: KubernetesOptions,
    container: str,
    secret_name: str | None,
    *,
    driver: bool,
) -> dict[str, Any]:
    spec_container: dict[str, Any] = {"name": container}
    if secret_name:
        spec_container["envFrom"] = [{"secretRef": {"name": secret_name, "optional": False}}]
    if driver:
        spec_container["env"] = [{"name": DEPLOY_MODE_VARIABLE, "value": "cluster"}]
        if options.working_dir:
            spec_container["workingDir"] = options.working_dir
    return {
        "metadata": {
            "labels": labels(request.job, request.run_token),
            "annotations": {ANNOTATION_TOKEN: request.run_token},
        },
        "spec": {"containers": [spec_container]},  # the service account: sparkConf
    }


def spark_conf(request: LaunchRequest, options: KubernetesOptions) -> dict[str, str]:
    """The SparkApplication's sparkConf: the image, the service account, the resources,
    the options' `conf` and the request's (OpenLineage's parent run)."""
    conf: dict[str, str] = {
        "spark.app.name": f"streamkeeper-{request.job}",
        "spark.kubernetes.container.image": str(options.image),
    }
    if options.image_pull_policy:
        conf["spark.kubernetes.container.image.pullPolicy"] = options.image_pull_policy
    if options.service_account:
        conf["spark.kubernetes.authenticate.driver.serviceAccountName"] = options.service_account
        conf["spark.kubernetes.authenticate.executor.serviceAccountName"] = options.service_account
    resources = {
        "spark.driver.cores": options.driver_cores,
        "spark.driver.memory": options.driver_memory,
        "spark.executor.instances": options.executor_instances,
        "spark.executor.cores": options.executor_cores,
        "spark.executor.memory": options.executor_memory,
    }
    conf.update({k: str(v) for k, v in resources.items() if v is not None})
    return {**conf, **options.conf}


def render_application(
    request: LaunchRequest, options: KubernetesOptions, name: str, secret_name: str | None
) -> dict[str, Any]:
    """The SparkApplication (`spark.apache.org/v1`) that runs the request's driver.

    restartPolicy Never: Airflow's monitor restarts a failed job (a new run token, a new
    application), so two drivers of one token never follow each other.
    """
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": _metadata(request, options, name),
        "spec": {
            "deploymentMode": "ClusterMode",
            "pyFiles": options.py_file,
            "driverArgs": driver_args(request, options),
            "sparkConf": spark_conf(request, options),
            "applicationTolerations": {
                "restartConfig": {"restartPolicy": "Never"},
                "resourceRetainPolicy": "OnFailure",
            },
            "runtimeVersions": {"sparkVersion": options.spark_version},
            "driverSpec": {
                "podTemplateSpec": _pod_template(
                    request, options, DRIVER_CONTAINER, secret_name, driver=True
                )
            },
            "executorSpec": {
                "podTemplateSpec": _pod_template(
                    request, options, EXECUTOR_CONTAINER, secret_name, driver=False
                )
            },
        },
    }


def spark_submit_conf(
    request: LaunchRequest,
    *,
    name: str,
    namespace: str,
    image: str,
    secret_name: str | None = None,
    secret_keys: tuple[str, ...] = (),
    service_account: str | None = None,
    image_pull_policy: str | None = None,
) -> dict[str, str]:
    """`--conf` pairs of `spark-submit --deploy-mode cluster --master k8s://...` for the
    request: the driver pod named from the run token, labels with the job and the token,
    spark-submit leaving once the driver is submitted, and each of `secret_keys` from
    Secret `secret_name` as an environment variable of the driver and the executors
    (`secretKeyRef`: the command line names the keys, never their values)."""
    conf = {
        "spark.kubernetes.namespace": namespace,
        "spark.kubernetes.container.image": image,
        "spark.kubernetes.driver.pod.name": submit_driver_pod(name),
        "spark.kubernetes.submission.waitAppCompletion": "false",
        f"spark.kubernetes.driverEnv.{DEPLOY_MODE_VARIABLE}": "cluster",
        f"spark.kubernetes.driver.annotation.{ANNOTATION_TOKEN}": request.run_token,
    }
    for key, value in labels(request.job, request.run_token).items():
        conf[f"spark.kubernetes.driver.label.{key}"] = value
        conf[f"spark.kubernetes.executor.label.{key}"] = value
    if image_pull_policy:
        conf["spark.kubernetes.container.image.pullPolicy"] = image_pull_policy
    if service_account:
        conf["spark.kubernetes.authenticate.driver.serviceAccountName"] = service_account
        conf["spark.kubernetes.authenticate.executor.serviceAccountName"] = service_account
    if secret_keys and not secret_name:
        raise ValueError("secret_keys need the secret_name that holds them")
    for key in sorted(secret_keys):
        conf[f"spark.kubernetes.driver.secretKeyRef.{key}"] = f"{secret_name}:{key}"
        conf[f"spark.kubernetes.executor.secretKeyRef.{key}"] = f"{secret_name}:{key}"
    return conf


def check_no_secret_values(rendered: Any, env: dict[str, str], what: str) -> None:
    """Refuse a rendering that carries a key of the connection outside the Secret (through
    `conf`, an override): names the variable, never its value.

    Raises:
        LaunchError: a key's value appears in `rendered`.
    """
    text = json.dumps(rendered)
    for key in AWS_KEY_NAMES:
        value = env.get(key)
        if value and value in text:
            raise LaunchError(
                f"{what} would carry the value of {key} (through conf or an override); "
                "credentials reach the pods through their Secret only: remove it"
            )


# -- the Kubernetes API -----------------------------------------------------------------


def api_client(kubeconfig: str | None, context: str | None, in_cluster: bool) -> ApiClient:
    """A client of its own (the library's global configuration is left alone).

    Raises:
        LaunchError: no configuration found (names where it looked).
    """
    from kubernetes import client, config

    try:
        if in_cluster:
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)
            return client.ApiClient(configuration)
        return config.new_client_from_config(
            config_file=kubeconfig, context=context, persist_config=False
        )
    except config.ConfigException as error:
        where = "the pod's service account" if in_cluster else (kubeconfig or "$KUBECONFIG")
        raise LaunchError(
            f"no Kubernetes client configuration from {where}: {error}; pass kubeconfig "
            "(and context) or in_cluster=True in launcher_options"
        ) from None


def _api_error(error: Exception, what: str, secrets: list[str]) -> LaunchError:
    from streamkeeper_airflow.secrets import redact

    status = getattr(error, "status", None)
    reason = getattr(error, "reason", None) or type(error).__name__
    body = redact(str(getattr(error, "body", "") or ""), secrets)[:500]
    hint = {
        401: "the client's credentials were refused",
        403: "the client may not do this: see the RBAC in docs/deploying-kubernetes.md",
        404: "is the operator's CRD installed, and does the namespace exist?",
    }.get(status or 0, "")
    return LaunchError(f"could not {what}: {status} {reason}. {hint} {body}".strip())


def unreachable(error: Exception, api: ApiClient | None = None) -> LaunchError:
    """The API server could not be reached (no answer, TLS): names it, and the fix."""
    host = getattr(getattr(api, "configuration", None), "host", None) or "the API server"
    return LaunchError(
        f"could not reach the Kubernetes API server {host}: {type(error).__name__}: {error}; "
        "check kubeconfig/context (or in_cluster) in launcher_options"
    )


def _is_conflict(error: Exception) -> bool:
    return getattr(error, "status", None) == 409


def create_secret(api: ApiClient, secret: dict[str, Any], token: str) -> None:
    """Create the Secret; one of the same run token already there is this launch's, from
    an earlier try: its data is brought up to date (a rotated key). Another token's is an
    error.

    Raises:
        LaunchError: the API refused, or the name is another launch's.
    """
    from kubernetes.client import CoreV1Api
    from kubernetes.client.exceptions import ApiException

    core = CoreV1Api(api)
    meta = secret["metadata"]
    secrets = list(secret.get("stringData", {}).values())
    what = f"create Secret {meta['namespace']}/{meta['name']}"
    try:
        core.create_namespaced_secret(meta["namespace"], secret)
        return
    except ApiException as error:
        if not _is_conflict(error):
            raise _api_error(error, what, secrets) from None
    try:
        existing = core.read_namespaced_secret(meta["name"], meta["namespace"])
        _check_same_launch(api.sanitize_for_serialization(existing).get("metadata"), meta, token)
        core.patch_namespaced_secret(
            meta["name"], meta["namespace"], {"stringData": secret["stringData"]}
        )
    except ApiException as error:
        what = f"update Secret {meta['namespace']}/{meta['name']}"
        raise _api_error(error, what, secrets) from None


def create_application(api: ApiClient, app: dict[str, Any], token: str) -> dict[str, Any]:
    """Create the SparkApplication, or find this launch's (same run token) from an earlier
    try; returns the object as the API server holds it.

    Raises:
        LaunchError: the API refused, or the name is another launch's.
    """
    from kubernetes.client import CustomObjectsApi
    from kubernetes.client.exceptions import ApiException

    custom = CustomObjectsApi(api)
    meta = app["metadata"]
    where = dict(group=GROUP, version=VERSION, namespace=meta["namespace"], plural=PLURAL)
    what = f"create SparkApplication {meta['namespace']}/{meta['name']}"
    try:
        return custom.create_namespaced_custom_object(body=app, **where)
    except ApiException as error:
        if not _is_conflict(error):
            raise _api_error(error, what, []) from None
    try:
        existing = custom.get_namespaced_custom_object(name=meta["name"], **where)
    except ApiException as error:
        raise _api_error(error, f"read SparkApplication {meta['name']}", []) from None
    _check_same_launch(existing.get("metadata"), meta, token)
    log.info("SparkApplication %s exists for run token %s: launched before", meta["name"], token)
    return existing


def _check_same_launch(found: dict[str, Any] | None, wanted: dict[str, Any], token: str) -> None:
    theirs = token_of(found)
    if theirs != token:
        owner = f"run token {theirs}" if theirs else "no streamkeeper run token"
        raise LaunchError(
            f"{wanted['namespace']}/{wanted['name']} exists with {owner}, not {token}: "
            "another launch (or another tool) holds the name; delete it if it is stale"
        )


def own_secret(api: ApiClient, secret: dict[str, Any], app: dict[str, Any]) -> None:
    """Make the SparkApplication the Secret's owner: Kubernetes deletes the Secret with
    it. Best effort: without it, the labels still find the Secret (cleanup in the docs)."""
    from kubernetes.client import CoreV1Api
    from kubernetes.client.exceptions import ApiException

    meta = app.get("metadata") or {}
    if not meta.get("uid"):
        return
    owner = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "blockOwnerDeletion": False,
        "controller": False,
    }
    secret_meta = secret["metadata"]
    try:
        CoreV1Api(api).patch_namespaced_secret(
            secret_meta["name"],
            secret_meta["namespace"],
            {"metadata": {"ownerReferences": [owner]}},
        )
    except ApiException as error:
        log.warning(
            "Secret %s/%s keeps no owner (%s %s); its labels %s=%s find it for cleanup",
            secret_meta["namespace"],
            secret_meta["name"],
            error.status,
            error.reason,
            LABEL_TOKEN,
            secret_meta["labels"][LABEL_TOKEN],
        )


# -- the launcher -----------------------------------------------------------------------


class KubernetesLauncher:
    """Creates the Secret and the SparkApplication of a launch; the operator does the rest."""

    name = "kubernetes"

    def __init__(self, **options: Any) -> None:
        self.options = KubernetesOptions.of(options)

    def manifests(self, request: LaunchRequest) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """The Secret (None: nothing to ship) and the SparkApplication of `request`.

        Raises:
            LaunchError: a credential would appear outside the Secret.
        """
        name = app_name(request.job, request.run_token)
        secret = render_secret(request, self.options, name)
        app = render_application(request, self.options, name, None if secret is None else name)
        check_no_secret_values(app, request.env, f"SparkApplication {name}")
        return secret, app

    def launch(self, request: LaunchRequest) -> LaunchedDriver:
        secret, app = self.manifests(request)
        options = self.options
        from urllib3.exceptions import HTTPError

        with api_client(options.kubeconfig, options.context, options.in_cluster) as api:
            try:
                if secret is not None:
                    create_secret(api, secret, request.run_token)
                created = create_application(api, app, request.run_token)
                if secret is not None:
                    own_secret(api, secret, created)
            except HTTPError as error:
                raise unreachable(error, api) from None
        name = app["metadata"]["name"]
        pod = application_driver_pod(name)
        return LaunchedDriver(
            launcher=self.name,
            pid=0,  # no process of this host: followed by its heartbeat (run token)
            host=f"k8s:{options.namespace}/{pod}",
            process_started_at=None,
            log=f"kubectl -n {options.namespace} logs {pod}",
        )
