#!/usr/bin/env bash
# Installs what the console's browser tests (tests/tests/console.rs) need, on a Debian machine:
#
# - Debian's `chromium` and `chromium-driver` (/usr/bin/chromium, /usr/bin/chromedriver), with
#   apt-get, non-interactively, when either is missing: as root, or through `sudo -n`;
# - a venv with Selenium pinned from PyPI, in a cache directory (default
#   ~/.cache/toolhost/venv-console; override with TOOLHOST_CONSOLE_VENV), made by
#   scripts/ensure-venv.sh.
#
# Idempotent: what is there is kept. Prints the venv's directory on stdout.
#
# Needs python3 3.10 or newer with the venv module, and apt-get for the browser.
set -euo pipefail

SELENIUM_VERSION="4.51.0"

if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
    command -v apt-get >/dev/null 2>&1 || {
        echo "chromium or chromedriver is missing and there is no apt-get: install Chromium and its driver as /usr/bin/chromium and /usr/bin/chromedriver" >&2
        exit 1
    }
    as_root=()
    if [ "$(id -u)" -ne 0 ]; then
        sudo -n true 2>/dev/null || {
            echo "chromium or chromedriver is missing: run this as root (or with passwordless sudo), or apt-get install chromium chromium-driver" >&2
            exit 1
        }
        as_root=(sudo -n)
    fi
    echo "installing Debian's chromium and chromium-driver with apt-get" >&2
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        chromium chromium-driver >&2
fi

exec "$(dirname "$0")/ensure-venv.sh" \
    "${TOOLHOST_CONSOLE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/toolhost/venv-console}" \
    "selenium==$SELENIUM_VERSION"
