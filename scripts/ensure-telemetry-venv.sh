#!/usr/bin/env bash
# Makes the venv of the telemetry end-to-end tests (tests/tests/telemetry.rs): the OTLP receiver
# built on the official opentelemetry-proto definitions, the OpenTelemetry SDK and its OTLP/HTTP
# exporter for the callers and the hosted MCP server, the official MCP Python SDK, and redis-py
# for toolhost's Python client (which the tests take from clients/python/src, so the venv serves
# any checkout). Pinned to exact versions, in a cache
# directory (default ~/.cache/toolhost/venv-telemetry; override with TOOLHOST_TELEMETRY_VENV).
# Idempotent (see scripts/ensure-venv.sh). Prints the venv's directory on stdout.
#
# Needs python3 3.10 or newer with the venv module.
set -euo pipefail
cd "$(dirname "$0")/.."

PINS=(
    "mcp==2.3.0"
    "opentelemetry-api==1.45.2"
    "opentelemetry-sdk==1.45.2"
    "opentelemetry-proto==1.45.2"
    "opentelemetry-exporter-otlp-proto-http==1.45.2"
    "redis==6.4.0"
)
exec scripts/ensure-venv.sh "${TOOLHOST_TELEMETRY_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/toolhost/venv-telemetry}" "${PINS[@]}"
