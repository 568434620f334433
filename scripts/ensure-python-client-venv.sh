#!/usr/bin/env bash
# Makes the venv of the Python client's tests: redis-py, pytest, mypy, build, twine and the
# OpenAI Agents SDK, pinned, in a cache directory (default ~/.cache/toolhost/venv-python-client;
# override with TOOLHOST_PYTHON_VENV), and installs clients/python into it (editable, so the
# tests see the checkout). Idempotent (see scripts/ensure-venv.sh). Prints the venv's directory
# on stdout.
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
venv="$(scripts/ensure-venv.sh "${TOOLHOST_PYTHON_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/toolhost/venv-python-client}" "${PINS[@]}")"
"$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e clients/python >&2
echo "$venv"
