#!/usr/bin/env bash
# Set up, then run the sample job's lifecycle through Airflow on embedded defaults (local
# storage, local Spark, Airflow on SQLite, all on 127.0.0.1): start, savepoint, blue-green
# upgrade. `--exit` stops after the story; `--runtime-only` runs the job once without Airflow.
set -euo pipefail
cd "$(dirname "$0")/.."
bash infra/setup.sh
VENV="${STREAMKEEPER_VENV:-.venv}"
export SPARK_LOCAL_IP=127.0.0.1
if [ "${1:-}" = "--runtime-only" ]; then
  shift
  exec "$VENV/bin/python" infra/quickstart.py "$@"
fi
exec "$VENV/bin/python" infra/quickstart_airflow.py "$@"
