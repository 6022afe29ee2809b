#!/usr/bin/env bash
# Set up, lint, then run every test (unit, integration with real services, chaos).
set -euo pipefail
cd "$(dirname "$0")/.."
bash infra/setup.sh
VENV="${STREAMKEEPER_VENV:-.venv}"
export SPARK_LOCAL_IP=127.0.0.1 PYSPARK_PYTHON="$PWD/$VENV/bin/python"
"$VENV/bin/ruff" check src tests benchmarks jobs infra
"$VENV/bin/ruff" format --check src tests benchmarks jobs infra
# Two workers: most of the time goes to drivers starting up, which a second one overlaps.
# `load` deals the first quarter of the tests out in turn, so the long chaos tests (collected
# first) split across both workers instead of queueing on one (as `worksteal` left them).
"$VENV/bin/python" -m pytest -p no:cacheprovider -n 2 --dist load --durations=25 "$@"
