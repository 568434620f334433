#!/usr/bin/env bash
# Measures what oversized entries cost (issue 12, item 3): starts its own redis-server and the
# given toolhost binary, sends ten 8 MiB entries (over the default 1 MiB max_payload_bytes) and
# one valid request after them, waits until the group settled and the request was answered, then
# prints the daemon's peak RSS (VmHWM) and the size of the dead letters they left.
# With PAUSED=1 the daemon is stopped (SIGSTOP) while the entries are added, so it finds them all
# at once in one read batch instead of one by one.
# Usage: [PAUSED=1] bench-large-entries.sh [TOOLHOST_BINARY] [ENTRIES] [MIB]
set -euo pipefail

binary="${1:-./target/release/toolhost}"
entries="${2:-10}"
mib="${3:-8}"
work="$(mktemp -d)"
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
cli() { redis-cli -p "$port" "$@"; }

cleanup() {
    [ -n "${daemon:-}" ] && kill "$daemon" 2>/dev/null || true
    cli shutdown nosave >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" >/dev/null &
for _ in $(seq 100); do cli ping >/dev/null 2>&1 && break; sleep 0.05; done

env -i PATH="$PATH" REDIS_URL="redis://127.0.0.1:$port" TOOLHOST__HTTP__LISTEN=127.0.0.1:0 \
    "$binary" serve >"$work/toolhost.log" 2>&1 &
daemon=$!
for _ in $(seq 400); do grep -q '"message":"ready"' "$work/toolhost.log" && break; sleep 0.05; done
grep -q '"message":"ready"' "$work/toolhost.log" || { cat "$work/toolhost.log" >&2; exit 1; }

# A JSON request whose message is MIB MiB long: well-formed, only too large.
python3 - "$work/big.json" "$mib" <<'EOF'
import sys
size = int(sys.argv[2]) * 1024 * 1024
head = '{"type":"echo.requested","data":{"message":"'
with open(sys.argv[1], "w") as out:
    out.write(head + "x" * (size - len(head) - 3) + '"}}')
EOF
[ "${PAUSED:-0}" = 1 ] && kill -STOP "$daemon"
for n in $(seq "$entries"); do
    cli -x XADD action-requests '*' id "big-$n" payload <"$work/big.json" >/dev/null
done
cli XADD action-requests '*' id after payload \
    '{"type":"echo.requested","data":{"request_id":"after","message":"still served"}}' >/dev/null
[ "${PAUSED:-0}" = 1 ] && kill -CONT "$daemon"

deadline=$((SECONDS + 120))
until [ "$(cli XPENDING action-requests toolhost | head -1)" = 0 ] &&
    [ "$(cli XLEN dlq:toolhost)" -ge "$entries" ] &&
    cli --raw XRANGE action-results - + | grep -q '"request_id":"after"'; do
    [ "$SECONDS" -lt "$deadline" ] || { echo "did not settle within 120 s" >&2; exit 1; }
    sleep 0.1
done

hwm_kib="$(awk '/^VmHWM:/ {print $2}' "/proc/$daemon/status")"
letter_bytes="$(cli EVAL "local n = 0
for _, e in ipairs(redis.call('XRANGE', KEYS[1], '-', '+')) do
  for i = 1, #e[2], 2 do if e[2][i] == 'payload' then n = n + #e[2][i + 1] end end
end
return n" 1 dlq:toolhost)"
memory_usage="$(cli MEMORY USAGE dlq:toolhost)"
printf '%s%s: %s entries of %s MiB: peak RSS %s MiB, %s dead letters, %s bytes of letter payloads, MEMORY USAGE dlq:toolhost %s bytes\n' \
    "$binary" "$([ "${PAUSED:-0}" = 1 ] && echo ' (paused while adding)')" "$entries" "$mib" "$((hwm_kib / 1024))" "$(cli XLEN dlq:toolhost)" "$letter_bytes" "$memory_usage"
