#!/usr/bin/env bash
# Start SeaweedFS's all-in-one server (`weed mini`: master, volume, filer and
# S3 gateway in one process) in the foreground, bound to 127.0.0.1 only.
#
# Usage:
#   AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... \
#     infra/seaweedfs.sh DATA_DIR PORT BUCKET
#
#   DATA_DIR  directory for volumes and filer metadata (created if missing)
#   PORT      S3 port. The other components take ports derived from it, so that
#             two instances with different PORTs never collide:
#               PORT      S3 HTTP
#               PORT+1    master HTTP     PORT+10001  master gRPC
#               PORT+2    volume HTTP     PORT+10002  volume gRPC
#               PORT+3    filer HTTP      PORT+10003  filer gRPC
#                                         PORT+10007  S3 gRPC
#               PORT+8    admin HTTP      PORT+10008  admin gRPC
#             i.e. PORT..PORT+8 and PORT+10001..PORT+10008 must be free, so
#             PORT must be <= 55527. gRPC ports follow SeaweedFS's own
#             "HTTP port + 10000" convention because the embedded maintenance
#             worker dials the admin server at admin port + 10000 regardless of
#             -admin.port.grpc.
#             WebDAV, the admin UI, the Iceberg and Lance catalogs and telemetry
#             are disabled.
#   BUCKET    S3 bucket created on start-up (3-63 chars) if it does not exist.
#
# Environment (required):
#   AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY
#       The S3 gateway turns these into its admin identity and then checks
#       every request's signature against them: requests signed with any other
#       key pair, and anonymous requests, are rejected (403).
#   WEED_BIN (optional) path to the `weed` binary (default: `weed` on PATH).
#   SEAWEED_IAM_CONFIG (optional) an advanced IAM config (JSON: STS signing key, roles
#       with trust policies, policies): the S3 port then also serves STS AssumeRole.
set -euo pipefail

if [[ $# -ne 3 ]]; then
    echo "usage: $0 DATA_DIR PORT BUCKET" >&2
    exit 2
fi
data_dir=$1
port=$2
bucket=$3

if [[ -z "${AWS_ACCESS_KEY_ID:-}" || -z "${AWS_SECRET_ACCESS_KEY:-}" ]]; then
    echo "$0: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set" >&2
    exit 2
fi
if ! [[ "$port" =~ ^[0-9]+$ ]] || (( port < 1024 || port > 55527 )); then
    echo "$0: PORT must be an integer in 1024..55527 (got '$port')" >&2
    exit 2
fi

weed=${WEED_BIN:-weed}
mkdir -p "$data_dir"
data_dir=$(cd "$data_dir" && pwd)
cd "$data_dir"

exec "$weed" mini \
    -dir="$data_dir" \
    -ip=127.0.0.1 \
    -ip.bind=127.0.0.1 \
    -webdav=false \
    -admin.ui=false \
    -bucket="$bucket" \
    -s3.port="$port" \
    -s3.port.grpc=$((port + 10007)) \
    -s3.port.iceberg=0 \
    -s3.port.lance=0 \
    -master.port=$((port + 1)) \
    -master.port.grpc=$((port + 10001)) \
    -volume.port=$((port + 2)) \
    -volume.port.grpc=$((port + 10002)) \
    -filer.port=$((port + 3)) \
    -filer.port.grpc=$((port + 10003)) \
    -admin.port=$((port + 8)) \
    -admin.port.grpc=$((port + 10008)) \
    -master.telemetry=false \
    ${SEAWEED_IAM_CONFIG:+-s3.iam.config="$SEAWEED_IAM_CONFIG"}
