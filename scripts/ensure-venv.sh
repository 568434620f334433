#!/usr/bin/env bash
# Makes a Python venv holding exactly the given pinned requirements, the shared step of the
# ensure-*-venv.sh scripts and of scripts/ensure-mcp-servers.sh:
#
#   scripts/ensure-venv.sh <venv directory> <requirement>...   e.g. "selenium==4.52.0"
#
# Idempotent: a venv whose stamp names the same requirements (a digest of them) is kept; any
# other is made anew, so changing a pin in a caller rebuilds its venv once. pip's output goes to
# stderr. Prints the venv's directory on stdout.
#
# Needs python3 3.10 or newer with the venv module.
set -euo pipefail

if [ "$#" -lt 2 ]; then
    echo "usage: $0 <venv directory> <requirement>..." >&2
    exit 2
fi
venv="$1"
shift
stamp="$venv/.installed-$(printf '%s\n' "$@" | sha1sum | cut -c1-12)"

if [ ! -f "$stamp" ] || [ ! -x "$venv/bin/python" ]; then
    command -v python3 >/dev/null 2>&1 || { echo "python3 is missing: install Python 3.10 or newer" >&2; exit 1; }
    echo "installing $* into $venv" >&2
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "$@" >&2
    touch "$stamp"
fi
echo "$venv"
