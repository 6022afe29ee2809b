#!/usr/bin/env bash
# Set up, lint, then run every test (unit, integration with real services, chaos).
set -euo pipefail
cd "$(dirname "$0")/.."
bash infra/setup.sh
VENV="${STREAMKEEPER_VENV:-.venv}"
export SPARK_LOCAL_IP=127.0.0.1 PYSPARK_PYTHON="$PWD/$VENV/bin/python"
# Drivers start in about 10 s instead of 17 (a class-data archive): the chaos tests start hundreds.
source infra/driver_jvm.sh
"$VENV/bin/ruff" check src tests benchmarks jobs infra dags plugins
# Bytecode for this tree, once: with PYTHONDONTWRITEBYTECODE set (as on CI machines) every
# driver, task process and test worker would otherwise compile what it imports from source.
"$VENV/bin/python" -m compileall -q src provider/src tests jobs dags plugins infra benchmarks >/dev/null
"$VENV/bin/ruff" format --check src tests benchmarks jobs infra dags plugins
# Three workers on two cores: with two, a quarter of the CPU sat idle while tests waited on
# Airflow's scheduler, the triggerer and drivers' intervals (tests/airflow: 614 s with two
# workers, 20 % idle; 529 s with three, 4 % idle).
# `loadgroup` hands out one test at a time to whichever worker is free (`load` sends each
# worker a block of consecutive tests up front, which put every long chaos test, collected
# first, on one worker); with the longest collected first this is longest-first scheduling.
"$VENV/bin/python" -m pytest -p no:cacheprovider -n 3 --dist loadgroup --durations=60 "$@"
