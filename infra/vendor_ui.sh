#!/usr/bin/env bash
# Vendor the operations page's browser libraries into the provider package.
#
# The page loads only its own files (its Content-Security-Policy allows nothing else,
# and Airflow often runs on a closed network), so the chart library ships inside the
# package as files in the tree: CI and installs never need npm. This script is how a
# maintainer upgrades it:
#
#   cd src/streamkeeper_airflow/ui/web && npm install --save-exact uplot@NEW_VERSION
#   infra/vendor_ui.sh
#   .venv/bin/python -m pytest tests/unit/test_ui_vendor.py   # banner == pinned version
#
# It installs exactly what package-lock.json pins (`npm ci`) and copies the dist files
# and the license into src/streamkeeper_airflow/ui/static/vendor/.
set -euo pipefail
cd "$(dirname "$0")/.."
WEB=src/streamkeeper_airflow/ui/web
VENDOR=src/streamkeeper_airflow/ui/static/vendor
command -v npm >/dev/null || { echo "error: npm is required (apt-get install npm)" >&2; exit 1; }
(cd "$WEB" && npm ci --no-audit --no-fund --ignore-scripts)
UPLOT="$WEB/node_modules/uplot"
VERSION="$(node -p "require('./$UPLOT/package.json').version")"
mkdir -p "$VENDOR"
cp "$UPLOT/dist/uPlot.iife.min.js" "$VENDOR/uPlot.iife.min.js"
# The stylesheet has no banner of its own: give it one, so a test can tell its version.
{ echo "/*! https://github.com/leeoniya/uPlot (v$VERSION) */"; cat "$UPLOT/dist/uPlot.min.css"; } \
  > "$VENDOR/uPlot.min.css"
cp "$UPLOT/LICENSE" "$VENDOR/uPlot.LICENSE"
echo "vendored uPlot $VERSION into $VENDOR"
