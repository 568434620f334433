#!/usr/bin/env bash
# Makes the venv of the MCP door's end-to-end tests: the official MCP Python SDK and the OpenAI
# Agents SDK, pinned to exact versions, in a cache directory (default
# ~/.cache/toolhost/venv-mcp-door; override with TOOLHOST_MCP_DOOR_VENV). Idempotent: a venv
# already holding the pinned versions is kept. Prints the venv's directory on stdout.
#
# Needs python3 3.10 or newer with the venv module.
set -euo pipefail

MCP_VERSION="2.3.0"
AGENTS_VERSION="0.24.0"
venv="${TOOLHOST_MCP_DOOR_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/toolhost/venv-mcp-door}"
stamp="$venv/.installed-mcp-$MCP_VERSION-agents-$AGENTS_VERSION"

if [ ! -f "$stamp" ] || [ ! -x "$venv/bin/python" ]; then
    command -v python3 >/dev/null 2>&1 || { echo "python3 is missing: install Python 3.10 or newer" >&2; exit 1; }
    echo "installing mcp==$MCP_VERSION and openai-agents==$AGENTS_VERSION into $venv" >&2
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check \
        "mcp==$MCP_VERSION" "openai-agents==$AGENTS_VERSION" >&2
    touch "$stamp"
fi
echo "$venv"
