#!/usr/bin/env bash
# Makes the venv of kubernetes-validate (the Kubernetes resource schemas, from PyPI), which
# `just check-deploy` runs over the deploy/ manifests. Default directory
# ~/.cache/toolhost/venv-k8s-validate (override with TOOLHOST_K8S_VALIDATE_VENV). Idempotent (see
# scripts/ensure-venv.sh). Prints the venv's directory on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${TOOLHOST_K8S_VALIDATE_VENV:-$HOME/.cache/toolhost/venv-k8s-validate}"
exec scripts/ensure-venv.sh "$venv" "kubernetes-validate==1.37.0"
