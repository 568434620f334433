#!/usr/bin/env bash
# The first hour, as a newcomer meets it, for CI (`./x quickstart-check`):
#
# 1. `./x redis_port=P run` on a free port P: Redis is started there and the daemon serves
#    against it (its `ready` line names the URL), logging JSON because stdout is not a terminal;
# 2. the README's blocks marked `<!-- quickstart-check -->` run against it as written, with
#    `redis-cli` pointed at P and REDIS_URL set for Python (redis-py in a venv under target/);
# 3. the README's client lines (`toolhost call`, `toolhost tools`);
# 4. on a terminal (`script`), `serve` logs in the human format;
# 5. `./x redis_port=P stop` stops that Redis, and only that one;
# 6. `systemd-analyze verify` accepts deploy/toolhost.service, in a scratch root holding the binary;
# 7. deploy/kubernetes.yaml and docker-compose.yml validate against the Kubernetes API schemas
#    (kubernetes-validate) and the Compose specification (check-jsonschema), both offline.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "quickstart-check: $*" >&2; exit 1; }
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

scripts/ensure-redis.sh install
command -v systemd-analyze >/dev/null 2>&1 || {
    echo "quickstart-check: installing systemd for systemd-analyze" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd >/dev/null
}

work="$(mktemp -d /tmp/toolhost-quickstart.XXXXXX)"
port=$(free_port)
http=$(free_port)
run_pid=""
cleanup() {
    [ -z "$run_pid" ] || kill -INT -- "-$run_pid" 2>/dev/null || true
    ./x redis_port="$port" stop >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

# 1. `./x run` in a session of its own, so the whole recipe can be stopped like Ctrl-C does.
TOOLHOST__HTTP__LISTEN="127.0.0.1:$http" setsid ./x redis_port="$port" run >"$work/run.log" 2>&1 &
run_pid=$!
# `./x run` builds the release profile first: from a fresh clone it served after 8 min 29 s on 2
# cores shared with other builds (load 3 to 5), and should take about 5 minutes on idle ones
# (docs/PERFORMANCE.md, "Build profiles"). It gets 20 minutes; QUICKSTART_WAIT_S gives it more.
wait_s="${QUICKSTART_WAIT_S:-1200}"
deadline=$(( $(date +%s) + wait_s ))
while [ "$(date +%s)" -lt "$deadline" ]; do
    grep -qs '"message":"ready"' "$work/run.log" && break
    kill -0 "$run_pid" 2>/dev/null || { cat "$work/run.log" >&2; die "./x run exited"; }
    sleep 0.5
done
ready=$(grep '"message":"ready"' "$work/run.log") \
    || { tail -20 "$work/run.log" >&2; die "./x run was not ready within $wait_s s (QUICKSTART_WAIT_S)"; }
echo "$ready" | grep -q "\"redis\":\"redis://127.0.0.1:$port\"" || die "./x run serves against the wrong Redis: $ready"
echo "./x redis_port=$port run: ready, serving redis://127.0.0.1:$port, JSON logs off a terminal"

# 2. The README's marked blocks, as written.
python3 - README.md "$work" <<'EOF'
import pathlib, re, sys
text = pathlib.Path(sys.argv[1]).read_text()
blocks = re.findall(r"<!-- quickstart-check -->\n```(\w+)\n(.*?)```", text, re.S)
assert blocks, "README.md has no <!-- quickstart-check --> blocks"
for index, (language, body) in enumerate(blocks):
    suffix = {"sh": "sh", "python": "py"}[language]
    pathlib.Path(sys.argv[2], f"block-{index}.{suffix}").write_text(body)
EOF
python3 -m venv "$work/venv" && "$work/venv/bin/pip" install --quiet --disable-pip-version-check \
    'redis>=5' 'kubernetes-validate==1.37.0' 'check-jsonschema==0.39.0'
for block in "$work"/block-*; do
    case "$block" in
        *.sh) sed "s/redis-cli /redis-cli -p $port /" "$block" | bash -euo pipefail >"$block.out" ;;
        *.py) REDIS_URL="redis://127.0.0.1:$port" "$work/venv/bin/python" "$block" >"$block.out" ;;
    esac
    echo "README block $(basename "$block") ran:"
    sed 's/^/    /' "$block.out" | cut -c1-160
done
# The first request's answer, whenever it came.
answered=""
for _ in $(seq 50); do
    if redis-cli -p "$port" XRANGE action-results - + | grep '"request_id":"r-1"' | grep -q '"success":true'; then
        answered=1; break
    fi
    sleep 0.1
done
[ -n "$answered" ] || die "the README's first request got no success answer on action-results"
grep -q "'success': True" "$work"/block-*.py.out || die "the README's Python snippet printed no success"

# 3. The built-in client, as the README shows it.
answer=$(REDIS_URL="redis://127.0.0.1:$port" ./target/release/toolhost call echo --args '{"message":"hello"}')
[ "$answer" = '{"message":"hello"}' ] || die "toolhost call echo: $answer"
REDIS_URL="redis://127.0.0.1:$port" ./target/release/toolhost tools --format openai | grep -q '"toolbox_id": "toolhost"' \
    || die "toolhost tools --format openai does not print the discovery answer"
echo "toolhost call and toolhost tools: ok"

# 4. A terminal gets the human format.
tty_http=$(free_port)
REDIS_URL="redis://127.0.0.1:$port" TOOLHOST__HTTP__LISTEN="127.0.0.1:$tty_http" \
    script -qfec "timeout -s INT 3 ./target/release/toolhost serve" /dev/null >"$work/tty.log" 2>&1 || true
grep -q 'ready' "$work/tty.log" || { cat "$work/tty.log" >&2; die "serve on a terminal logged no ready line"; }
if grep -q '"message":"ready"' "$work/tty.log"; then die "serve on a terminal logged JSON"; fi
echo "serve on a terminal: human-readable logs"

# 5. Stop the daemon as Ctrl-C would, then the Redis `run` started.
kill -INT -- "-$run_pid"
wait "$run_pid" || true
run_pid=""
grep -q '"message":"stopped"' "$work/run.log" || die "the daemon did not stop cleanly"
./x redis_port="$port" stop
if redis-cli -p "$port" ping >/dev/null 2>&1; then die "./x stop left Redis on port $port running"; fi
./x redis_port="$port" stop 2>&1 | grep -q "no Redis started" || die "a second ./x stop should find nothing to stop"
echo "./x stop: the Redis on port $port is gone"

# 6. The systemd unit, against the binary, in a scratch root with the system's units.
root="$work/root"
mkdir -p "$root/usr/local/bin" "$root/etc/systemd/system" "$root/usr/lib/systemd"
cp -a /usr/lib/systemd/system "$root/usr/lib/systemd/"
cp target/release/toolhost "$root/usr/local/bin/toolhost"
# ExecReload runs sh's kill.
mkdir -p "$root/bin"
cp "$(readlink -f /bin/sh)" "$root/bin/sh"
cp deploy/toolhost.service "$root/etc/systemd/system/"
out=$(systemd-analyze verify --root="$root" /etc/systemd/system/toolhost.service 2>&1) \
    || die "systemd-analyze verify: $out"
[ -z "$out" ] || die "systemd-analyze verify warns: $out"
# The unit's main process is what RestartPreventExitStatus=64 sees: bad configuration exits 64.
echo '[dispatch]
max_inflight = 8' >"$work/bad.toml"
code=0
./target/release/toolhost serve --config "$work/bad.toml" 2>"$work/bad.err" || code=$?
[ "$code" = 64 ] || die "serve with a bad key exited $code, not 64"
grep -q "dispatch.max_inflight" "$work/bad.err" || die "serve did not name the bad key: $(cat "$work/bad.err")"
echo "deploy/toolhost.service: systemd-analyze verify is clean; bad configuration exits 64, which the unit does not restart"
# 7. The manifests against their schemas.
"$work/venv/bin/kubernetes-validate" --strict --quiet deploy/kubernetes.yaml \
    || die "deploy/kubernetes.yaml does not validate"
"$work/venv/bin/check-jsonschema" --builtin-schema vendor.compose-spec docker-compose.yml >/dev/null \
    || die "docker-compose.yml does not validate against the Compose specification"
echo "deploy/kubernetes.yaml (Kubernetes 1.37 schemas, strict) and docker-compose.yml (Compose specification): valid"
echo "quickstart check passed"
