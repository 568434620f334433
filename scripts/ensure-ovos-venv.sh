#!/usr/bin/env bash
# Makes the venv of the OpenVoiceOS end-to-end tests: the real messagebus server
# (ovos-messagebus), its client (ovos-bus-client) and the ToolBox template of
# ovos-plugin-manager (a pre-release: 2.2.0, the default install, lacks it), pinned to exact
# versions, in a cache directory (default ~/.cache/toolhost/venv-ovos; override with
# TOOLHOST_OVOS_VENV). Idempotent: a venv already holding the pinned versions is kept (see
# scripts/ensure-venv.sh). Prints the venv's directory on stdout.
#
# Needs python3 3.10 or newer with the venv module.
set -euo pipefail

exec "$(dirname "$0")/ensure-venv.sh" \
    "${TOOLHOST_OVOS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/toolhost/venv-ovos}" \
    "ovos-messagebus==0.0.10" \
    "ovos-bus-client==1.5.0" \
    "ovos-plugin-manager==3.1.0a1"
