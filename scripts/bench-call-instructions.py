#!/usr/bin/env python3
"""Instructions a toolhost daemon executes per echo call, under valgrind's callgrind.

On a shared machine time per call moves with the neighbours; instructions do not. For each
build and mode a fresh `redis-server` starts, then the daemon under callgrind (`toolhost serve`,
its defaults but for the log level: `warn`, as `toolhost-bench` runs it, unless `--log-level`
says otherwise; at `info` it logs a line per call), with telemetry off or exporting spans over
OTLP/HTTP at a sampler ratio to a receiver in this script that reads each export and answers it
with an empty success. The daemon answers 300 warm-up calls, then N echo requests of 100 bytes
added at once, and is stopped; a second daemon, which answers only the warm-up, is counted the
same way and subtracted, so that start, warm-up and stop cancel out. Everything the daemon's
threads did in user space for the calls is counted (the kernel's share, the send of the export
included, is not): the group reads, the calls, the answers, and with telemetry the spans, their
encoding and the export thread's posts.

Prints, per build and mode, instructions per call, and the inclusive instructions per call of
the span entry points (`call_span`, `end_span` with the encoding, the child spans' ends and
starts) and of `Telemetry::invocation` (the metrics of each call).

Usage: scripts/bench-call-instructions.py [--calls N] [--modes off,1] [--log-level L] NAME=BINARY [...]
Example (docs/PERFORMANCE.md, telemetry round 7):
  scripts/bench-call-instructions.py --calls 20000 before=/tmp/toolhost-before after=target/release/toolhost
"""

import argparse
import http.server
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(*args):
    out = b"*%d\r\n" % len(args)
    for arg in args:
        arg = arg.encode() if isinstance(arg, str) else arg
        out += b"$%d\r\n%s\r\n" % (len(arg), arg)
    return out


def redis_cli(port, *args):
    return subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True, text=True).stdout.strip()


def send_requests(port, n):
    """Adds n echo requests to action-requests in one pipelined write, reading the replies."""
    payload = "x" * 100
    buf = bytearray()
    for _ in range(n):
        entry = uuid.uuid4().hex
        data = '{"id":"%s","type":"echo.requested","data":{"request_id":"%s","message":"%s"}}' % (
            entry, uuid.uuid4(), payload)
        buf += command("XADD", "action-requests", "*", "id", entry, "payload", data)
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(buf)
        # Each reply is a bulk string, two CRLFs; a CRLF may be split between two reads.
        crlfs, carried = 0, b""
        while crlfs < 2 * n:
            chunk = s.recv(1 << 16)
            if not chunk:
                raise RuntimeError("redis closed the connection")
            data = carried + chunk
            crlfs += data.count(b"\r\n")
            carried = data[-1:] if data.endswith(b"\r") else b""


def wait_for(what, probe, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if probe():
            return
        time.sleep(0.2)
    raise RuntimeError("timed out waiting for " + what)


class Receiver(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver that reads each export and keeps nothing."""
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


ENTRY_POINTS = [
    ("call_span", r"toolhost::telemetry::Telemetry::call_span$"),
    ("end_span", r"toolhost::call::end_span$"),
    ("child ends", r"core::ptr::drop_in_place<toolhost::telemetry::spans::ChildSpan>$"),
    ("run", r"toolhost::telemetry::spans::CallSpan::run$"),
    ("admit", r"toolhost::telemetry::spans::CallSpan::admit$"),
    ("settle", r"toolhost::telemetry::spans::CallSpan::settle$"),
    ("invocation", r"toolhost::telemetry::Telemetry::invocation$"),
]


def inclusive(dump):
    out = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", dump],
                         capture_output=True, text=True).stdout
    total, found = 0, {}
    for line in out.splitlines():
        m = re.match(r"^\s*([\d,]+) \(\s*[\d.]+%\)\s+(.*)$", line)
        if not m:
            continue
        count = int(m.group(1).replace(",", ""))
        name = re.sub(r"\s*\[/.*\]$", "", m.group(2)).split(":", 1)[-1].strip()
        if "PROGRAM TOTALS" in m.group(2):
            total = count
        for label, pattern in ENTRY_POINTS:
            if re.search(pattern, name):
                found[label] = found.get(label, 0) + count
    return total, found


def run_daemon(binary, mode, calls, receiver_port, workdir, log_level):
    """Counts of one daemon under callgrind that answered 300 warm-up calls and then `calls` more,
    from its start to its exit (SIGTERM)."""
    port = free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # The caller's environment without toolhost's and OpenTelemetry's own variables.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLHOST", "OTEL_", "REDIS_"))}
    env.update({"REDIS_URL": "redis://127.0.0.1:%d" % port, "TOOLHOST__HTTP__LISTEN": "127.0.0.1:0",
                "TOOLHOST__LOG__LEVEL": log_level})
    if mode != "off":
        env.update({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:%d" % receiver_port,
                    "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": mode})
    dump = os.path.join(workdir, "callgrind.out.%d" % port)
    log = open(os.path.join(workdir, "toolhost.%d.log" % port), "w")
    daemon = subprocess.Popen(["valgrind", "--tool=callgrind", "--callgrind-out-file=" + dump, binary, "serve"],
                              env=env, stdout=log, stderr=log)
    try:
        wait_for("redis", lambda: redis_cli(port, "ping") == "PONG", 10)
        wait_for("the daemon's consumer group",
                 lambda: "toolhost" in redis_cli(port, "xinfo", "groups", "action-requests"), 120)
        answered = lambda n: int(redis_cli(port, "xlen", "action-results") or 0) >= n
        send_requests(port, 300)
        wait_for("the warm-up's answers", lambda: answered(300), 120)
        if calls:
            send_requests(port, calls)
            wait_for("the answers", lambda: answered(300 + calls), 900)
        daemon.terminate()
        daemon.wait(timeout=120)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        redis.terminate()
        redis.wait()
        log.close()
    return inclusive(dump)


def measure(binary, mode, calls, receiver_port, workdir, log_level):
    """Per call: a daemon that answers `calls` more than another, the difference divided by
    `calls`, so that start, warm-up and stop cancel out."""
    base_total, base = run_daemon(binary, mode, 0, receiver_port, workdir, log_level)
    total, found = run_daemon(binary, mode, calls, receiver_port, workdir, log_level)
    return total - base_total, {k: v - base.get(k, 0) for k, v in found.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--modes", default="off,1", help="off and/or sampler ratios, comma separated")
    parser.add_argument("--log-level", default="warn",
                        help="the daemons' log level: warn, as toolhost-bench runs them (info logs a line per call)")
    parser.add_argument("builds", nargs="+", metavar="NAME=BINARY")
    args = parser.parse_args()
    receiver = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    rows = []
    with tempfile.TemporaryDirectory(prefix="call-instructions.") as workdir:
        for build in args.builds:
            name, binary = build.split("=", 1)
            for mode in args.modes.split(","):
                total, found = measure(os.path.abspath(binary), mode, args.calls, receiver.server_port, workdir,
                                       args.log_level)
                rows.append((name, mode, total / args.calls, {k: v / args.calls for k, v in found.items()}))
                print("%s, telemetry %s: %.0f instructions per call" % (name, mode, total / args.calls), file=sys.stderr)
    labels = [label for label, _ in ENTRY_POINTS]
    spans = labels[:6]
    print("| build | telemetry | instructions per call | spans (sum of the six) | " + " | ".join(labels) + " |")
    print("|---|---|---:|---:|" + "---:|" * len(labels))
    for name, mode, total, found in rows:
        cells = ["%.0f" % found.get(label, 0) for label in labels]
        print("| %s | %s | %.0f | %.0f | %s |" % (name, mode, total, sum(found.get(l, 0) for l in spans),
                                                 " | ".join(cells)))


if __name__ == "__main__":
    main()
