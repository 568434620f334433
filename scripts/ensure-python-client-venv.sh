#!/usr/bin/env bash
# Makes the venv of the Python client's tests: redis-py, pytest, mypy, build, twine and the
# OpenAI Agents SDK, pinned, in a cache directory (default ~/.cache/toolhost/venv-python-client;
# override with TOOLHOST_PYTHON_VENV), and installs clients/python into it (editable, so the
# tests see the checkout). Idempotent. Prints the venv's directory on stdout.
#
# Needs python3 3.10 or newer with the venv module.
set -euo pipefail
cd "$(dirname "$0")/.."

PINS=(
    "redis==6.4.0"
    "pytest==8.4.2"
    "pytest-asyncio==1.2.0"
    "mypy==1.18.2"
    "build==1.3.0"
    "twine==6.2.0"
    "setuptools==80.9.0"
    "openai-agents==0.24.0"
)
venv="${TOOLHOST_PYTHON_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/toolhost/venv-python-client}"
stamp="$venv/.installed-$(printf '%s\n' "${PINS[@]}" | sha1sum | cut -c1-12)"

if [ ! -f "$stamp" ] || [ ! -x "$venv/bin/python" ]; then
    command -v python3 >/dev/null 2>&1 || { echo "python3 is missing: install Python 3.10 or newer" >&2; exit 1; }
    echo "installing the Python client's test tools into $venv" >&2
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "${PINS[@]}" >&2
    touch "$stamp"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e clients/python >&2
echo "$venv"
