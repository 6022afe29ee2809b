#!/usr/bin/env bash
# Set up, then run the sample job end to end on embedded defaults (local storage, local Spark).
set -euo pipefail
cd "$(dirname "$0")/.."
bash infra/setup.sh
VENV="${STREAMKEEPER_VENV:-.venv}"
SPARK_LOCAL_IP=127.0.0.1 "$VENV/bin/python" infra/quickstart.py "$@"
