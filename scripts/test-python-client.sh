#!/usr/bin/env bash
# The Python client's checks (`just test-python`, after the daemon's debug build): pytest against
# a real daemon and redis-server, mypy --strict over the package and its tests, and the sdist and
# wheel built and checked with twine.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$(scripts/ensure-python-client-venv.sh)"
cd clients/python
"$venv/bin/mypy" --strict src tests
"$venv/bin/pytest" -q
dist="$(mktemp -d /tmp/toolhost-python-dist.XXXXXX)"
trap 'rm -rf "$dist"; rm -rf build src/toolhost.egg-info' EXIT
"$venv/bin/python" -m build --no-isolation --outdir "$dist" . >/dev/null
"$venv/bin/twine" check --strict "$dist"/*
ls "$dist"
