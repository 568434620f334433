#!/usr/bin/env bash
# Installs the official TypeScript MCP clients the MCP door's end-to-end tests drive, pinned to
# exact versions, into a cache directory (default ~/.cache/toolhost/mcp-ts-clients; override
# with TOOLHOST_MCP_TS_CLIENTS). Idempotent: an install already at the pinned versions is kept.
# Prints the cache directory on stdout.
#
#   <cache>/node_modules/@modelcontextprotocol/sdk      the `initialize` generations (up to 2025-11-25)
#   <cache>/node_modules/@modelcontextprotocol/client   2026-07-28 (server/discover, no session)
#
# Needs npm (Node.js 20 or newer).
set -euo pipefail

SDK_VERSION="1.32.2"
CLIENT_VERSION="2.4.0"
cache="${TOOLHOST_MCP_TS_CLIENTS:-${XDG_CACHE_HOME:-$HOME/.cache}/toolhost/mcp-ts-clients}"
stamp="$cache/.installed-sdk-$SDK_VERSION-client-$CLIENT_VERSION"

if [ -f "$stamp" ] && [ -d "$cache/node_modules/@modelcontextprotocol/client" ]; then
    echo "$cache"
    exit 0
fi
command -v npm >/dev/null 2>&1 || { echo "npm is missing: install Node.js 20 or newer with npm" >&2; exit 1; }
echo "installing @modelcontextprotocol/sdk@$SDK_VERSION and @modelcontextprotocol/client@$CLIENT_VERSION into $cache" >&2
rm -rf "$cache"
mkdir -p "$cache"
(cd "$cache" && echo '{"private": true, "type": "module"}' >package.json \
    && npm install --silent --no-audit --no-fund --save-exact \
        "@modelcontextprotocol/sdk@$SDK_VERSION" "@modelcontextprotocol/client@$CLIENT_VERSION" >&2)
touch "$stamp"
echo "$cache"
