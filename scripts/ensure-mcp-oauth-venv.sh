#!/usr/bin/env bash
# Makes the venv of the MCP door's test authorization server (tests/mcp_door/auth_server.py):
# joserfc, for its keys and JWTs, pinned to an exact version, in a cache directory (default
# ~/.cache/toolhost/venv-mcp-oauth; override with TOOLHOST_MCP_OAUTH_VENV). Idempotent: a venv
# already holding the pinned version is kept (see scripts/ensure-venv.sh). Prints the venv's
# directory on stdout.
#
# Needs python3 3.10 or newer with the venv module.
set -euo pipefail

exec "$(dirname "$0")/ensure-venv.sh" \
    "${TOOLHOST_MCP_OAUTH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/toolhost/venv-mcp-oauth}" \
    "joserfc==1.8.0"
