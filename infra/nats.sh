#!/usr/bin/env bash
# Start a single NATS server with JetStream in the foreground, bound to
# 127.0.0.1 only (no monitoring, cluster or leafnode listeners).
#
# Usage:
#   infra/nats.sh DATA_DIR PORT
#
#   DATA_DIR  JetStream storage directory (created if missing)
#   PORT      client port
#
# Environment (optional):
#   NATS_SERVER_BIN  path to the `nats-server` binary (default: on PATH)
set -euo pipefail

if [[ $# -ne 2 ]]; then
    echo "usage: $0 DATA_DIR PORT" >&2
    exit 2
fi
data_dir=$1
port=$2

if ! [[ "$port" =~ ^[0-9]+$ ]] || (( port < 1 || port > 65535 )); then
    echo "$0: PORT must be an integer in 1..65535 (got '$port')" >&2
    exit 2
fi

mkdir -p "$data_dir"
exec "${NATS_SERVER_BIN:-nats-server}" -js -a 127.0.0.1 -p "$port" -sd "$data_dir"
