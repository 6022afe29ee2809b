#!/usr/bin/env bash
# Create .venv with the pinned requirements and the streamkeeper package (idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null || PYTHON=python3
if ! command -v java >/dev/null; then
  echo "error: Java 17 is required by Spark; install it (e.g. apt-get install openjdk-17-jre-headless)" >&2
  exit 1
fi
# Debian server packages the tests start themselves, on 127.0.0.1 or a test host's own
# address: installed with a policy-rc.d that forbids starting their services, so no
# system sshd, PostgreSQL or Redis ever listens on every interface of the machine.
install_servers() {
  local guard=/usr/sbin/policy-rc.d placed=""
  if [ ! -e "$guard" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$guard" && chmod +x "$guard" && placed=1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
  if [ -n "$placed" ]; then rm -f "$guard"; fi
}
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  wanted=()
  # PostgreSQL: the production profile's test (Airflow's metadata DB on Postgres).
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || wanted+=(postgresql)
  # sshd: the SSH gateway launcher's tests (tests/support/sshd.py).
  [ -x /usr/sbin/sshd ] || wanted+=(openssh-server)
  # Redis: the Celery broker of the distributed Airflow topology test (tests/topology/).
  command -v redis-server >/dev/null || wanted+=(redis-server)
  if [ "${#wanted[@]}" -gt 0 ]; then install_servers "${wanted[@]}"; fi
fi
# The operations page's browser tests drive Debian's Chromium (no browser download here).
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium chromium-driver
  else
    echo "warning: chromium and chromedriver are missing; the browser tests will fail" \
      "(apt-get install chromium chromium-driver)" >&2
  fi
fi
VENV="${STREAMKEEPER_VENV:-.venv}"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
STAMP="$VENV/.requirements.sha256"
WANT="$(cat requirements.txt pyproject.toml provider/pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --upgrade pip
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -r requirements.txt
  # The runtime and the provider are two distributions (provider/pyproject.toml).
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps -e . -e ./provider
  # The build leaves egg-info folders in the source trees, which are on sys.path in an
  # editable install: importlib would then see each distribution twice and Airflow would
  # load the plugin twice ("already registered"). The installed dist-info is the record.
  rm -rf src/*.egg-info provider/src/*.egg-info
  echo "$WANT" > "$STAMP"
fi
export SPARK_LOCAL_IP=127.0.0.1
