#!/usr/bin/env bash
# Makes the venv of the OpenVoiceOS end-to-end tests: the real messagebus server
# (ovos-messagebus), its client (ovos-bus-client) and the ToolBox template of
# ovos-plugin-manager (a pre-release: 2.2.0, the default install, lacks it), pinned to exact
# versions, in a cache directory (default ~/.cache/toolhost/venv-ovos; override with
# TOOLHOST_OVOS_VENV). Idempotent: a venv already holding the pinned versions is kept. Prints
# the venv's directory on stdout.
#
# Needs python3 3.10 or newer with the venv module.
set -euo pipefail

MESSAGEBUS_VERSION="0.0.10"
BUS_CLIENT_VERSION="1.5.0"
OPM_VERSION="3.1.0a1"
venv="${TOOLHOST_OVOS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/toolhost/venv-ovos}"
stamp="$venv/.installed-messagebus-$MESSAGEBUS_VERSION-bus-client-$BUS_CLIENT_VERSION-opm-$OPM_VERSION"

if [ ! -f "$stamp" ] || [ ! -x "$venv/bin/python" ]; then
    command -v python3 >/dev/null 2>&1 || { echo "python3 is missing: install Python 3.10 or newer" >&2; exit 1; }
    echo "installing ovos-messagebus==$MESSAGEBUS_VERSION, ovos-bus-client==$BUS_CLIENT_VERSION and ovos-plugin-manager==$OPM_VERSION into $venv" >&2
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check \
        "ovos-messagebus==$MESSAGEBUS_VERSION" "ovos-bus-client==$BUS_CLIENT_VERSION" \
        "ovos-plugin-manager==$OPM_VERSION" >&2
    touch "$stamp"
fi
echo "$venv"
