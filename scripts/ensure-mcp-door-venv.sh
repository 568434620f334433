#!/usr/bin/env bash
# Makes the venv of the MCP door's end-to-end tests: the official MCP Python SDK and the OpenAI
# Agents SDK, pinned to exact versions, in a cache directory (default
# ~/.cache/toolhost/venv-mcp-door; override with TOOLHOST_MCP_DOOR_VENV). Idempotent: a venv
# already holding the pinned versions is kept (see scripts/ensure-venv.sh). Prints the venv's
# directory on stdout.
#
# Needs python3 3.10 or newer with the venv module.
set -euo pipefail

exec "$(dirname "$0")/ensure-venv.sh" \
    "${TOOLHOST_MCP_DOOR_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/toolhost/venv-mcp-door}" \
    "mcp==2.3.0" \
    "openai-agents==0.24.0"
