#!/usr/bin/env bash
# Run one Spark standalone daemon (master or worker) in the foreground, from
# the pyspark wheel's `spark-class`, bound to 127.0.0.1 only.
#
# Usage:
#   infra/spark_standalone.sh master PORT WEBUI_PORT
#   infra/spark_standalone.sh worker MASTER_URL WEBUI_PORT CORES MEMORY
#
#   PORT        master RPC port (the master URL is spark://127.0.0.1:PORT)
#   WEBUI_PORT  web UI port (the master's UI serves cluster state at /json/)
#   MASTER_URL  e.g. spark://127.0.0.1:7077
#   CORES       cores the worker offers, e.g. 2
#   MEMORY      memory the worker offers, e.g. 2g
#
# Environment (optional):
#   SPARK_WORKER_DIR  worker scratch/work directory (executor logs, app jars);
#                     default: $SPARK_HOME/work
#   SPARK_CLASS       path to `spark-class` (default: on PATH)
#   SPARK_MASTER_OPTS / SPARK_WORKER_OPTS  extra -D options, as usual.
#
# SPARK_LOCAL_IP is forced to 127.0.0.1. The worker's own RPC port is chosen
# by Spark (random free port on 127.0.0.1). The master's REST submission
# server (fixed port 6066) is disabled so that several clusters can run side
# by side.
set -euo pipefail

usage() {
    echo "usage: $0 master PORT WEBUI_PORT" >&2
    echo "       $0 worker MASTER_URL WEBUI_PORT CORES MEMORY" >&2
    exit 2
}

export SPARK_LOCAL_IP=127.0.0.1
export SPARK_LOCAL_HOSTNAME=127.0.0.1
spark_class=${SPARK_CLASS:-spark-class}

role=${1:-}
case "$role" in
    master)
        [[ $# -eq 3 ]] || usage
        export SPARK_MASTER_OPTS="${SPARK_MASTER_OPTS:-} -Dspark.master.rest.enabled=false"
        exec "$spark_class" org.apache.spark.deploy.master.Master \
            --host 127.0.0.1 --port "$2" --webui-port "$3"
        ;;
    worker)
        [[ $# -eq 5 ]] || usage
        args=(--host 127.0.0.1 --webui-port "$3" --cores "$4" --memory "$5")
        if [[ -n "${SPARK_WORKER_DIR:-}" ]]; then
            mkdir -p "$SPARK_WORKER_DIR"
            args+=(--work-dir "$SPARK_WORKER_DIR")
        fi
        exec "$spark_class" org.apache.spark.deploy.worker.Worker "${args[@]}" "$2"
        ;;
    *)
        usage
        ;;
esac
