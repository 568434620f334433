#!/usr/bin/env bash
# deploy/toolhost.service under a real systemd (`./x unit-check`, run by CI): boots a Debian 12
# with systemd in systemd-nspawn, installs the binary of the profile given (dist, as deployed, by
# default; CI gives release, the build its quickstart check made) and the unit as the unit's header
# says, and checks that
#
# 1. a configuration error stops the unit: failed, exit status 64, no restart, and the message
#    naming the bad key in the journal;
# 2. with a good configuration the unit serves (under all its hardening) against a Redis on the
#    host, answers `toolhost call echo`, and stops cleanly.
#
# Needs root. The systemd root is made with debootstrap (about two minutes) and kept in
# /var/tmp/toolhost-unit-root between runs.
set -euo pipefail
cd "$(dirname "$0")/.."
profile="${1:-dist}"

die() { echo "unit-check: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (systemd-nspawn)"
missing=()
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
command -v systemd-nspawn >/dev/null 2>&1 || missing+=(systemd-container)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
if [ ${#missing[@]} -gt 0 ]; then
    echo "unit-check: installing ${missing[*]} with apt-get" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

root=/var/tmp/toolhost-unit-root
if [ ! -e "$root/.complete" ]; then
    rm -rf "$root"
    echo "unit-check: debootstrap a Debian 12 with systemd into $root (about two minutes)" >&2
    debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus bookworm "$root" \
        "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >/dev/null
    touch "$root/.complete"
fi
cargo build --profile "$profile" --locked -p toolhost --bin toolhost

# Installed as the unit's header says: the binary, the unit, /etc/toolhost/{toolhost.toml,toolhost.env}.
install -m 0755 "target/$profile/toolhost" "$root/usr/local/bin/toolhost"
# UNIT_FILE: another unit to check instead, e.g. an older version to see it fail.
install -m 0644 "${UNIT_FILE:-deploy/toolhost.service}" "$root/etc/systemd/system/toolhost.service"
mkdir -p "$root/etc/toolhost"
rm -rf "$root/result" && mkdir -p "$root/result"

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
work="$(mktemp -d /tmp/toolhost-unit-check.XXXXXX)"
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" >/dev/null 2>&1 &
redis_pid=$!
trap 'kill "$redis_pid" 2>/dev/null || true; rm -rf "$work"' EXIT
printf 'REDIS_URL=redis://127.0.0.1:%s\n' "$port" >"$root/etc/toolhost/toolhost.env"
chmod 0600 "$root/etc/toolhost/toolhost.env"

# Runs inside the container once it has booted, then powers it off.
cat >"$root/usr/local/bin/toolhost-unit-check" <<'EOF'
#!/bin/sh
exec >/result/log.txt 2>&1
show() { systemctl show toolhost -p ActiveState -p Result -p NRestarts -p ExecMainStatus >"/result/$1.txt"; }

printf '[dispatch]\nmax_inflight = 8\n' >/etc/toolhost/toolhost.toml
systemctl start toolhost.service
# RestartSec=2s: a unit that restarted on exit 64 would have done so a few times by now.
sleep 7
show bad
journalctl -b -u toolhost --no-pager -o cat >/result/bad-journal.txt

# The container shares the host's network: no fixed HTTP port.
printf '[http]\nlisten = "127.0.0.1:0"\n' >/etc/toolhost/toolhost.toml
systemctl reset-failed toolhost.service
systemctl start toolhost.service
for _ in $(seq 100); do
    journalctl -b -u toolhost --no-pager -o cat | grep -q '"message":"ready"' && break
    sleep 0.2
done
show serving
set -a; . /etc/toolhost/toolhost.env; set +a
toolhost call echo --config /etc/toolhost/toolhost.toml --args '{"message":"hello from systemd"}' >/result/call.txt
systemctl stop toolhost.service
show stopped
journalctl -b -u toolhost --no-pager -o cat >/result/good-journal.txt
systemctl poweroff
EOF
chmod 0755 "$root/usr/local/bin/toolhost-unit-check"
cat >"$root/etc/systemd/system/toolhost-unit-check.service" <<'EOF'
[Unit]
Description=Checks toolhost.service, then powers off
After=multi-user.target
[Service]
Type=oneshot
ExecStart=/usr/local/bin/toolhost-unit-check
[Install]
WantedBy=multi-user.target
EOF
mkdir -p "$root/etc/systemd/system/multi-user.target.wants"
ln -sf /etc/systemd/system/toolhost-unit-check.service \
    "$root/etc/systemd/system/multi-user.target.wants/toolhost-unit-check.service"

timeout 180 systemd-nspawn --quiet --register=no --keep-unit -D "$root" --boot >"$work/boot.log" 2>&1 \
    || { tail -20 "$work/boot.log" >&2; die "the container did not boot and power off"; }
[ -e "$root/result/stopped.txt" ] || { cat "$root/result/log.txt" "$work/boot.log" >&2; die "the checks did not finish"; }

expect() { grep -qx "$2" "$root/result/$1.txt" || die "$1: expected $2, got: $(tr '\n' ' ' <"$root/result/$1.txt")"; }
expect bad ActiveState=failed
expect bad ExecMainStatus=64
expect bad NRestarts=0
grep -q "dispatch.max_inflight: unknown field" "$root/result/bad-journal.txt" \
    || die "the journal lacks the configuration error: $(cat "$root/result/bad-journal.txt")"
echo "bad configuration: the unit failed with status 64, was not restarted, and the journal says:"
grep "max_inflight" "$root/result/bad-journal.txt" | sed 's/^/    /'
expect serving ActiveState=active
[ "$(cat "$root/result/call.txt")" = '{"message":"hello from systemd"}' ] \
    || die "toolhost call echo answered: $(cat "$root/result/call.txt")"
expect stopped ActiveState=inactive
expect stopped ExecMainStatus=0
echo "good configuration: the hardened unit served, answered toolhost call echo, and stopped with status 0"
echo "unit check passed"
