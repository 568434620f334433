#!/usr/bin/env bash
# Installs redis-server when missing, starts one on a port when none answers, and stops the one
# it started. Usage: ensure-redis.sh install | start PORT | stop PORT
set -euo pipefail

install() {
    if command -v redis-server >/dev/null 2>&1; then
        return 0
    fi
    if command -v apt-get >/dev/null 2>&1; then
        local sudo=""
        if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
        echo "redis-server is missing; installing it with apt-get" >&2
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server >/dev/null
        return 0
    fi
    echo "redis-server is missing and apt-get is not available: install Redis 7 (redis-server) and retry" >&2
    exit 1
}

answers() {
    if command -v redis-cli >/dev/null 2>&1; then
        redis-cli -p "$1" ping >/dev/null 2>&1
    else
        (exec 3<>"/dev/tcp/127.0.0.1/$1" && printf 'PING\r\n' >&3 && head -c 5 <&3 | grep -q PONG) 2>/dev/null
    fi
}

case "${1:-}" in
    install) install ;;
    start)
        install
        port="${2:-6379}"
        if answers "$port"; then exit 0; fi
        echo "no Redis on 127.0.0.1:$port; starting one (no persistence, logs in target/redis-$port.log; \`just stop\` stops it)" >&2
        mkdir -p target
        redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
            --logfile "$PWD/target/redis-$port.log" --pidfile "$PWD/target/redis-$port.pid"
        for _ in $(seq 50); do answers "$port" && exit 0; sleep 0.1; done
        echo "redis-server did not answer on port $port; see target/redis-$port.log" >&2
        exit 1
        ;;
    stop)
        # Only the server `start` started, known by its pid file: a Redis someone else runs on
        # the port is left alone.
        port="${2:-6379}"
        pidfile="target/redis-$port.pid"
        pid="$(cat "$pidfile" 2>/dev/null || true)"
        if [ -z "$pid" ] || [ "$(cat "/proc/$pid/comm" 2>/dev/null)" != redis-server ]; then
            rm -f "$pidfile"
            echo "no Redis started by \`just run\` on port $port" >&2
            exit 0
        fi
        kill "$pid"
        for _ in $(seq 50); do
            [ -d "/proc/$pid" ] || { rm -f "$pidfile"; echo "stopped the Redis on port $port" >&2; exit 0; }
            sleep 0.1
        done
        echo "redis-server (pid $pid) did not stop" >&2
        exit 1
        ;;
    *) echo "usage: $0 install | start PORT | stop PORT" >&2; exit 2 ;;
esac
