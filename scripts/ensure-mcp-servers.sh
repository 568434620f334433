#!/usr/bin/env bash
# Installs the real, unmodified MCP servers the toolhost-mcp tests run against, pinned to exact
# versions, into a cache directory (default ~/.cache/toolhost/mcp-servers; override with
# TOOLHOST_MCP_SERVERS). Idempotent: a server already installed at its pinned version is kept.
# Prints the cache directory on stdout.
#
#   <cache>/time/bin/mcp-server-time                     mcp-server-time from PyPI, in a venv (stdio)
#   <cache>/everything/node_modules/.bin/mcp-server-everything   server-everything from npm
#
# Needs python3 (with venv) and npm (Node.js 18 or newer).
set -euo pipefail

TIME_VERSION="2026.10.19"
EVERYTHING_VERSION="2026.8.31"
cache="${TOOLHOST_MCP_SERVERS:-${XDG_CACHE_HOME:-$HOME/.cache}/toolhost/mcp-servers}"
mkdir -p "$cache"

need() {
    command -v "$1" >/dev/null 2>&1 || { echo "$1 is missing: $2" >&2; exit 1; }
}

install_time() {
    "$(dirname "$0")/ensure-venv.sh" "$cache/time" "mcp-server-time==$TIME_VERSION" >/dev/null
}

install_everything() {
    local dir="$cache/everything" stamp="$cache/everything/.installed-$EVERYTHING_VERSION"
    [ -f "$stamp" ] && [ -x "$dir/node_modules/.bin/mcp-server-everything" ] && return 0
    need npm "install Node.js 18 or newer with npm"
    echo "installing @modelcontextprotocol/server-everything@$EVERYTHING_VERSION into $dir" >&2
    rm -rf "$dir"
    mkdir -p "$dir"
    (cd "$dir" && echo '{"private": true}' >package.json \
        && npm install --silent --no-audit --no-fund --save-exact \
            "@modelcontextprotocol/server-everything@$EVERYTHING_VERSION" >&2)
    touch "$stamp"
}

install_time
install_everything
echo "$cache"
