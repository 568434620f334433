#!/usr/bin/env python3
"""Instructions Redis executes per answered request, summed over the nodes, under valgrind's callgrind.

The fleet bench (`toolhost-bench --fleet`) measures Redis's CPU time per request, which on a
shared two-core machine also counts what the processes' fight for the cores costs (context
switches, cold caches); a machine with a core per node would not pay that. Instructions do not
move with the load: this counts them (issue 35, docs/PERFORMANCE.md round 13).

For each row, fresh `redis-server`s start under callgrind (`--collect-atstart=yes`): one plain
server, or a cluster of cluster-mode servers (`cluster-node-timeout` 60000, so nothing fails
over while valgrind slows the cluster bus), its slots split as `redis-cli --cluster create`
splits them (`CLUSTER ADDSLOTSRANGE` on each node, then `CLUSTER MEET`), one master taking every
slot itself. Two replicas of the real daemon (`toolhost serve`, not under valgrind) serve it,
configured as `toolhost-bench --fleet --replicas 2 --split-shards --shard-results
--ledger-format 2` configures them (crates/bench/src/fleet.rs; `--ledger-format 3` here for format
3's string claims): `REDIS_URL`,
`TOOLHOST__REDIS__CLUSTER_NODES` on a cluster, `TOOLHOST__STREAMS__SHARDS`,
`TOOLHOST__DISPATCH__LEDGER_FORMAT`, and with more than one shard `TOOLHOST__STREAMS__READ_SHARDS`
(replica i of R reads the shards k with k mod R = i).

The load is the fleet bench's (crates/bench/src/load.rs, `run_sharded`): echo requests of 100
bytes shaped as the harness's generator shapes them, each `XADD ... MAXLEN ~ 100000` to the
stream of its shard (CRC16 of the request id mod the shard count, crates/bench/src/shards.rs) on
one connection per node, each naming its shard's results topic `results:bench:{<tag>}`
(`results:bench` with one shard); one connection per results topic reads the answers with
`XREAD COUNT 1024 BLOCK 100`. A window of 64 requests (--in-flight) stays in flight: whenever answers are
read, as many new requests are sent, pipelined per node, as the bench's 64 lanes do over their
shared multiplexed connections.

After 1,000 warm-up requests, each measured window zeroes every node's counters
(`callgrind_control -z`), sends N requests, waits for every answer, and dumps the counters
(`callgrind_control -d`). Then, with no load, the counters are zeroed, the script sleeps
--idle-s seconds and dumps them again: what the nodes do per second for no request at all
(`serverCron`, `clusterCron`, the replicas' heartbeats and blocking reads timing out). Under
valgrind a window lasts 30 to 50 times longer than it would at full speed, so that background
counts far more per request than it would; the net figure subtracts it, window time times the
idle rate, per node. `INFO commandstats` is read before each zero and after each dump (so its
own instructions are not counted): calls per request by command and node.

Prints, per row, instructions per request per node and summed (gross and net of the idle
background), each window's sum (repeatability), the ratio to the first row, what the nodes
spent in a few functions (callgrind_annotate, inclusive, gross) and where that leaves the
instructions, read and write system calls per request (`/proc/<pid>/io`: the kernel's part,
which callgrind does not see), and commands per request. Writes every window's
callgrind_annotate output (inclusive, then self) and each row's figures (`<row>.json`) to
--out-dir; --report-only prints the report of rows measured before.

With --cpu the same rows run without valgrind and the figures are each process's CPU time per
request from /proc (user and system apart, Redis per node, the replicas, this generator), the
Redis nodes' context switches and system calls per request: the fleet bench's measure, beside
the instructions, under this script's load (a Python generator, slower than the bench's).

Usage: scripts/bench-redis-instructions.py [--requests N] [--windows W] [--in-flight F] [--rows ROW,...]
           [--cpu] [--report-only] [--out-dir DIR] TOOLHOST
  ROW is single-1, single-6, cluster1-6 or cluster3-6 (topology, masters, shards).
Example (docs/PERFORMANCE.md, round 13; each row alone under the bench lock's shared side):
  for row in single-1 single-6 cluster1-6 cluster3-6; do
      flock -s /work/notes/quiet.lock scripts/bench-redis-instructions.py --rows $row target/release/toolhost
  done
"""

import argparse
import datetime
import glob
import json
import os
import queue
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid

ROWS = {
    # name: (label, cluster masters or 0 for a plain server, shards)
    "single-1": ("one server, 1 shard", 0, 1),
    "single-6": ("one server, 6 shards", 0, 6),
    "cluster1-6": ("cluster, 1 master, 6 shards", 1, 6),
    "cluster3-6": ("cluster, 3 masters, 6 shards", 3, 6),
}
REPLICAS = 2
WARMUP = 1000
MAXLEN = "100000"

# Functions whose inclusive instructions are reported (callgrind_annotate --inclusive=yes).
FUNCTIONS = [
    ("call", "a command's execution, scripts and the commands they run included"),
    ("evalGenericCommand", "scripts (EVALSHA)"),
    ("xaddCommand", "XADD, the generator's and the scripts'"),
    ("xreadCommand", "XREAD and XREADGROUP"),
    ("processCommand", "a command's dispatch, `call` included"),
    ("getNodeByQuery", "cluster: the slot and node of a command's keys"),
    ("readQueryFromClient", "reading and parsing requests, their processing included"),
    ("beforeSleep", "the event loop's before-sleep, replies written and blocked reads served"),
    ("writeToClient", "replies written"),
    ("handleClientsBlockedOnKeys", "blocked reads served after a command woke them"),
    ("serverCron", "serverCron"),
    ("clusterCron", "cluster: clusterCron"),
    ("clusterBeforeSleep", "cluster: clusterBeforeSleep"),
    ("clusterReadHandler", "cluster bus: reading packets"),
]


# --- the Redis protocol ------------------------------------------------------------------------

class RedisError(Exception):
    pass


def resp(*args):
    """One command in the Redis protocol."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        arg = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(out)


class Connection:
    """One connection to one node, RESP2, replies read in order."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.pos = 0

    def close(self):
        self.sock.close()

    def _line(self):
        while True:
            end = self.buf.find(b"\r\n", self.pos)
            if end >= 0:
                line = self.buf[self.pos:end]
                self.pos = end + 2
                return line
            self._fill()

    def _fill(self):
        chunk = self.sock.recv(1 << 16)
        if not chunk:
            raise RedisError("the connection was closed")
        self.buf = self.buf[self.pos:] + chunk
        self.pos = 0

    def _bytes(self, n):
        while len(self.buf) - self.pos < n + 2:
            self._fill()
        out = self.buf[self.pos:self.pos + n]
        self.pos += n + 2
        return out

    def reply(self):
        """The next reply; an error reply is returned as a RedisError, not raised."""
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest
        if kind == b"-":
            return RedisError(rest.decode(errors="replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self._bytes(n)
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.reply() for _ in range(n)]
        raise RedisError("unexpected reply %r" % line)

    def pipeline(self, commands):
        self.sock.sendall(b"".join(resp(*c) for c in commands))
        return [self.reply() for _ in commands]

    def call(self, *args):
        out = self.pipeline([args])[0]
        if isinstance(out, RedisError):
            raise out
        return out


def ask(port, *args):
    """One command on a connection of its own."""
    conn = Connection(port)
    try:
        return conn.call(*args)
    finally:
        conn.close()


# --- the shard rule and the cluster's key hash (crates/bench/src/shards.rs) ---------------------

ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def crc16(data):
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
            crc &= 0xFFFF
    return crc


def candidate(n):
    out = []
    while True:
        out.append(ALPHABET[n % len(ALPHABET)])
        n //= len(ALPHABET)
        if n == 0:
            return "".join(out)
        n -= 1


def shard_stream(k, count):
    if count <= 1:
        return "action-requests"
    lo, hi = k * 16384 // count, (k + 1) * 16384 // count
    quarter = (hi - lo) // 4
    n = 0
    while not (lo + quarter <= crc16(candidate(n).encode()) % 16384 < hi - quarter):
        n += 1
    return "action-requests:{%s}" % candidate(n)


def results_topic(stream):
    """The results topic of a shard's stream in its slot, as the fleet bench names it."""
    _, sep, tag = stream.partition(":")
    return "results:bench:" + tag if sep else "results:bench"


def key_slot(key):
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            key = key[start + 1:end]
    return crc16(key.encode()) % 16384


def slot_ranges(masters):
    """The slots of each of `masters` nodes, split as `redis-cli --cluster create` splits them."""
    per_node, first, cursor, out = 16384 / masters, 0, 0.0, []
    for i in range(masters):
        last = int(cursor + per_node - 1 + 0.5)
        if last > 16384 or i == masters - 1:
            last = 16383
        last = max(last, first)
        out.append((first, last))
        first, cursor = last + 1, cursor + per_node
    return out


def test_shard_rule():
    """The documented table (crates/bench/src/shards.rs)."""
    tags = lambda count: [shard_stream(k, count)[len("action-requests:{"):-1] for k in range(count)]
    assert tags(6) == ["3", "j", "c", "1", "h", "a"], tags(6)
    assert tags(8) == ["e0", "b", "20", "c", "g0", "d", "00", "a"], tags(8)
    assert crc16(b"123456789") % 6 == 1
    assert slot_ranges(3) == [(0, 5460), (5461, 10922), (10923, 16383)], slot_ranges(3)


# --- processes ---------------------------------------------------------------------------------

def free_port(cluster=False):
    """A free loopback port; for a cluster node one below 55535 whose bus port (+10000) is free too."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if not cluster:
            return port
        port = 20000 + port % 30000
        try:
            for candidate_port in (port, port + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", candidate_port))
            return port
        except OSError:
            continue


def wait_for(what, probe, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if probe():
                return
        except (OSError, RedisError):
            pass
        time.sleep(0.2)
    raise RuntimeError("timed out waiting for " + what)


class Node:
    """A redis-server under callgrind (or, with `valgrind` false, alone)."""

    def __init__(self, name, workdir, cluster, valgrind=True):
        self.name = name
        self.port = free_port(cluster)
        self.dump = os.path.join(workdir, "callgrind.out." + name)
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--loglevel", "warning"]
        if cluster:
            node_dir = os.path.join(workdir, name)
            os.makedirs(node_dir)
            args += ["--cluster-enabled", "yes", "--cluster-config-file", os.path.join(node_dir, "nodes.conf"),
                     "--cluster-node-timeout", "60000", "--dir", node_dir]
        self.log = open(os.path.join(workdir, name + ".log"), "w")
        tool = ["valgrind", "--tool=callgrind", "--collect-atstart=yes", "--callgrind-out-file=" + self.dump]
        self.proc = subprocess.Popen((tool if valgrind else []) + args, stdout=self.log, stderr=self.log)
        self.dumps = 0
        def up():
            if self.proc.poll() is not None:
                raise RuntimeError("%s exited; see %s" % (name, self.log.name))
            return ask(self.port, "PING") == b"PONG"
        wait_for(name, up, 120)

    def control(self, flag):
        subprocess.run(["callgrind_control", flag, str(self.proc.pid)], check=True, capture_output=True)

    def zero(self):
        self.control("-z")

    def dump_now(self):
        """Dumps the counters and returns the dump's file once callgrind has written it."""
        self.control("-d")
        self.dumps += 1
        path = "%s.%d" % (self.dump, self.dumps)
        wait_for("the dump " + path, lambda: os.path.exists(path) and "\ntotals:" in open(path).read()[-4096:], 60)
        return path

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def summary(path):
    with open(path) as f:
        for line in f:
            if line.startswith("summary:"):
                return int(line.split()[1])
    raise RuntimeError("no summary in " + path)


def annotate(path, out_path):
    """Inclusive instructions of FUNCTIONS in a dump; writes callgrind_annotate's output."""
    out = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", path],
                         capture_output=True, text=True).stdout
    selfish = subprocess.run(["callgrind_annotate", "--inclusive=no", "--threshold=100", path],
                             capture_output=True, text=True).stdout
    with open(out_path, "w") as f:
        f.write("# inclusive\n" + out + "\n# self\n" + selfish)
    found = {}
    for line in out.splitlines():
        m = re.match(r"^\s*([\d,]+) \(\s*[\d.]+%\)\s+(.*)$", line)
        if not m:
            continue
        name = re.sub(r"\s*\[.*\]$", "", m.group(2)).split(":", 1)[-1].strip()
        for label, _ in FUNCTIONS:
            if name == label:
                found[label] = found.get(label, 0) + int(m.group(1).replace(",", ""))
    return found


def syscalls(pid):
    """Read and write system calls the process has made (/proc/<pid>/io: syscr, syscw)."""
    with open("/proc/%d/io" % pid) as f:
        fields = dict(line.split(":") for line in f.read().splitlines())
    return int(fields["syscr"]), int(fields["syscw"])


TICK_US = 1e6 / os.sysconf("SC_CLK_TCK")


def process_cpu(pid):
    """User and system CPU time (µs) and voluntary and involuntary context switches of a process."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    with open("/proc/%d/status" % pid) as f:
        status = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
    return (int(fields[11]) * TICK_US, int(fields[12]) * TICK_US,
            int(status["voluntary_ctxt_switches"]), int(status["nonvoluntary_ctxt_switches"]))


def commandstats(port):
    info = ask(port, "INFO", "commandstats").decode()
    out = {}
    for line in info.splitlines():
        m = re.match(r"^cmdstat_([^:]+):calls=(\d+)", line)
        if m:
            out[m.group(1)] = int(m.group(2))
    return out


class Redis:
    """One plain server or a cluster of `masters` nodes, every node under callgrind."""

    def __init__(self, masters, workdir, valgrind=True):
        self.masters = masters
        self.nodes = []
        try:
            if not masters:
                self.nodes.append(Node("redis-0", workdir, False, valgrind))
                self.ranges = [(0, 16383)]
                return
            for i in range(masters):
                self.nodes.append(Node("redis-%d" % i, workdir, True, valgrind))
            self.ranges = slot_ranges(masters)
            for node, (lo, hi) in zip(self.nodes, self.ranges):
                ask(node.port, "CLUSTER", "ADDSLOTSRANGE", lo, hi)
            for node in self.nodes[1:]:
                ask(self.nodes[0].port, "CLUSTER", "MEET", "127.0.0.1", node.port)

            def ok():
                for node in self.nodes:
                    info = ask(node.port, "CLUSTER", "INFO").decode()
                    if ("cluster_state:ok" not in info or "cluster_slots_assigned:16384" not in info
                            or "cluster_known_nodes:%d\r" % masters not in info):
                        return False
                    if len(ask(node.port, "CLUSTER", "SLOTS")) != masters:
                        return False
                return True
            wait_for("the cluster's state ok on every node", ok, 180)
        except BaseException:
            self.stop()
            raise

    def node_of(self, key):
        slot = key_slot(key)
        for node, (lo, hi) in zip(self.nodes, self.ranges):
            if lo <= slot <= hi:
                return node
        raise RuntimeError("no node holds slot %d" % slot)

    def env(self):
        urls = ["redis://127.0.0.1:%d" % node.port for node in self.nodes]
        env = {"REDIS_URL": urls[0]}
        if self.masters:
            env["TOOLHOST__REDIS__CLUSTER_NODES"] = ",".join(urls)
        return env

    def stop(self):
        for node in self.nodes:
            node.stop()


# --- the load ----------------------------------------------------------------------------------

def now_rfc3339():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class Load:
    """The fleet bench's closed loop, `in_flight` requests outstanding."""

    def __init__(self, redis, shards, in_flight):
        self.in_flight = in_flight
        self.shards = [shard_stream(k, shards) for k in range(shards)]
        self.topics = [results_topic(stream) for stream in self.shards]
        self.shard_node = [redis.node_of(stream) for stream in self.shards]
        self.publishers = {node.port: Connection(node.port) for node in redis.nodes}
        self.answers = queue.Queue()
        self.stop_flag = threading.Event()
        self.readers = []
        for topic in self.topics:
            thread = threading.Thread(target=self._read, args=(redis.node_of(topic).port, topic), daemon=True)
            thread.start()
            self.readers.append(thread)
        self.failed = 0

    def _read(self, port, topic):
        conn = Connection(port)
        newest = conn.call("XREVRANGE", topic, "+", "-", "COUNT", 1)
        last = newest[0][0] if newest else b"0-0"
        while not self.stop_flag.is_set():
            reply = conn.call("XREAD", "COUNT", 1024, "BLOCK", 100, "STREAMS", topic, last)
            if not reply:
                continue
            got = []
            for _, entries in reply:
                for entry_id, fields in entries:
                    last = entry_id
                    values = dict(zip(fields[::2], fields[1::2]))
                    data = json.loads(values.get(b"payload", b"{}")).get("data", {})
                    got.append((data.get("request_id"), data.get("success") is True))
            self.answers.put(got)
        conn.close()

    def _send(self, count):
        """Sends `count` requests, pipelined per node; returns their request ids."""
        by_node, ids = {}, []
        for _ in range(count):
            entry, request_id = str(uuid.uuid4()), str(uuid.uuid4())
            shard = crc16(request_id.encode()) % len(self.shards)
            payload = json.dumps({
                "id": entry, "source": "bench:loadgen", "specversion": "1.0", "type": "echo.requested",
                "topic": "action-requests", "time": now_rfc3339(), "correlation_id": request_id,
                "response_topic": self.topics[shard],
                "data": {"request_id": request_id, "message": "x" * 100},
            }, separators=(",", ":"))
            by_node.setdefault(self.shard_node[shard].port, []).append(
                ("XADD", self.shards[shard], "MAXLEN", "~", MAXLEN, "*", "id", entry, "payload", payload))
            ids.append(request_id)
        for port, commands in by_node.items():
            for reply in self.publishers[port].pipeline(commands):
                if isinstance(reply, RedisError):
                    raise reply
        return ids

    def run(self, n):
        """Sends n requests, `in_flight` at a time, and returns once every one is answered."""
        outstanding = set(self._send(min(self.in_flight, n)))
        sent = len(outstanding)
        answered = 0
        while answered < n:
            try:
                got = self.answers.get(timeout=120)
            except queue.Empty:
                raise RuntimeError("no answer within 120 s (%d of %d answered)" % (answered, n))
            while True:
                for request_id, success in got:
                    if request_id in outstanding:
                        outstanding.discard(request_id)
                        answered += 1
                        self.failed += not success
                try:
                    got = self.answers.get_nowait()
                except queue.Empty:
                    break
            more = min(self.in_flight - len(outstanding), n - sent)
            if more > 0:
                outstanding.update(self._send(more))
                sent += more

    def close(self):
        self.stop_flag.set()
        for thread in self.readers:
            thread.join(timeout=5)
        for conn in self.publishers.values():
            conn.close()


# --- one row -----------------------------------------------------------------------------------

# `[dispatch] ledger_format` of the replicas (`--ledger-format`).
LEDGER_FORMAT = "2"


def start_replicas(binary, redis, shards, workdir):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLHOST", "OTEL_", "REDIS_"))}
    env.update(redis.env())
    env.update({"TOOLHOST__STREAMS__SHARDS": str(shards), "TOOLHOST__DISPATCH__LEDGER_FORMAT": LEDGER_FORMAT,
                "TOOLHOST__HTTP__LISTEN": "127.0.0.1:0", "TOOLHOST__LOG__LEVEL": "warn"})
    replicas = []
    for index in range(REPLICAS):
        mine = dict(env)
        if shards > 1 and shards >= REPLICAS:
            mine["TOOLHOST__STREAMS__READ_SHARDS"] = ",".join(str(k) for k in range(shards) if k % REPLICAS == index)
        log = open(os.path.join(workdir, "toolhost-%d.log" % index), "w")
        replicas.append((subprocess.Popen([binary, "serve"], env=mine, stdout=log, stderr=log), log))
    return replicas


def ready(redis, shards):
    beats = sum(len(ask(node.port, "KEYS", "toolhost:heartbeat:*")) for node in redis.nodes)
    if beats < REPLICAS:
        return False
    for k in range(shards):
        stream = shard_stream(k, shards)
        groups = ask(redis.node_of(stream).port, "XINFO", "GROUPS", stream)
        if not any(b"toolhost" in group for group in groups):
            return False
    return True


def measure_row(row, binary, args, out_dir):
    label, masters, shards = ROWS[row]
    workdir = tempfile.mkdtemp(prefix="redis-instructions.")
    redis = replicas = load = None
    result = {"row": row, "label": label, "requests": args.requests, "in_flight": args.in_flight, "windows": []}
    started = time.time()
    try:
        redis = Redis(masters, workdir)
        replicas = start_replicas(binary, redis, shards, workdir)
        wait_for("the replicas' heartbeats and groups", lambda: ready(redis, shards), 120)
        load = Load(redis, shards, args.in_flight)
        load.run(WARMUP)
        time.sleep(1)
        for window in range(args.windows):
            before = [commandstats(node.port) for node in redis.nodes]
            io_before = [syscalls(node.proc.pid) for node in redis.nodes]
            zeroed = []
            for node in redis.nodes:
                node.zero()
                zeroed.append(time.time())
            t0 = time.time()
            load.run(args.requests)
            seconds = time.time() - t0
            spans, paths = [], []
            for node, z in zip(redis.nodes, zeroed):
                spans.append(time.time() - z)
                paths.append(node.dump_now())
            io = [[(a - b) / args.requests for a, b in zip(syscalls(node.proc.pid), before)]
                  for node, before in zip(redis.nodes, io_before)]
            counts = [summary(path) for path in paths]
            functions = [annotate(path, os.path.join(out_dir, "%s-%s-window-%d.txt" % (row, node.name, window + 1)))
                         for node, path in zip(redis.nodes, paths)]
            after = [commandstats(node.port) for node in redis.nodes]
            commands = [{c: (a[c] - b.get(c, 0)) / args.requests for c in a if a[c] > b.get(c, 0)}
                        for a, b in zip(after, before)]
            result["windows"].append({"counts": counts, "seconds": spans, "load_seconds": seconds,
                                      "functions": functions, "commands": commands, "syscalls": io})
            print("bench: %s, window %d: %d requests in %.1f s, %.0f instructions per request over %d node(s)"
                  % (row, window + 1, args.requests, seconds, sum(counts) / args.requests, len(counts)),
                  file=sys.stderr)
        for node in redis.nodes:
            node.zero()
        t0 = time.time()
        time.sleep(args.idle_s)
        idle = []
        for node in redis.nodes:
            elapsed = time.time() - t0
            idle.append(summary(node.dump_now()) / elapsed)
        result["idle_per_s"] = idle
        result["failed"] = load.failed
    finally:
        stop_all(load, replicas, redis)
        if args.keep:
            print("bench: kept " + workdir, file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    result["run_seconds"] = time.time() - started
    return result


def stop_all(load, replicas, redis):
    """Stops what a row started: the load's connections, the replicas, then the Redis nodes."""
    if load:
        load.close()
    for proc, log in replicas or []:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    if redis:
        redis.stop()


def measure_row_cpu(row, binary, args, out_dir):
    """The same row without valgrind: each process's CPU time per request, for comparison."""
    label, masters, shards = ROWS[row]
    workdir = tempfile.mkdtemp(prefix="redis-cpu.")
    redis = replicas = load = None
    result = {"row": row, "label": label, "requests": args.requests, "in_flight": args.in_flight, "mode": "cpu",
              "windows": []}
    started = time.time()
    try:
        redis = Redis(masters, workdir, valgrind=False)
        replicas = start_replicas(binary, redis, shards, workdir)
        wait_for("the replicas' heartbeats and groups", lambda: ready(redis, shards), 120)
        load = Load(redis, shards, args.in_flight)
        load.run(WARMUP * 5)
        time.sleep(1)
        for window in range(args.windows):
            before = [commandstats(node.port) for node in redis.nodes]
            pids = [node.proc.pid for node in redis.nodes]
            snap = lambda: ([process_cpu(pid) for pid in pids], [syscalls(pid) for pid in pids],
                            [process_cpu(proc.pid) for proc, _ in replicas], process_cpu(os.getpid()),
                            os.getloadavg()[0])
            first = snap()
            t0 = time.time()
            load.run(args.requests)
            seconds = time.time() - t0
            last = snap()
            after = [commandstats(node.port) for node in redis.nodes]
            n = args.requests
            per = lambda a, b: [(x - y) / n for x, y in zip(a, b)]
            result["windows"].append({
                "seconds": seconds,
                "redis": [per(a, b) for a, b in zip(last[0], first[0])],
                "syscalls": [per(a, b) for a, b in zip(last[1], first[1])],
                "toolhost": [per(a, b) for a, b in zip(last[2], first[2])],
                "generator": per(last[3], first[3]),
                "load_average": first[4],
                "commands": [{c: (a[c] - b.get(c, 0)) / n for c in a if a[c] > b.get(c, 0)}
                             for a, b in zip(after, before)],
            })
            w = result["windows"][-1]
            print("bench: %s without valgrind, window %d: %d requests in %.1f s, Redis %.1f µs per request"
                  % (row, window + 1, n, seconds, sum(r[0] + r[1] for r in w["redis"])), file=sys.stderr)
        result["failed"] = load.failed
    finally:
        stop_all(load, replicas, redis)
        shutil.rmtree(workdir, ignore_errors=True)
    result["run_seconds"] = time.time() - started
    return result


def report_cpu(results):
    lines = ["| row | req/s | Redis user µs/req (per node) | Redis system µs/req | Redis CPU µs/req | × row 1 | "
             "context switches/req, voluntary + involuntary | read + write system calls/req | "
             "toolhost CPU µs/req | generator CPU µs/req | windows' Redis CPU µs/req | load average |",
             "|---|---:|---|---:|---:|---:|---|---:|---:|---:|---|---|"]
    reference = None
    for result in results:
        windows = result["windows"]
        mean = lambda get: sum(get(w) for w in windows) / len(windows)
        user = [mean(lambda w: w["redis"][i][0]) for i in range(len(windows[0]["redis"]))]
        system = mean(lambda w: sum(r[1] for r in w["redis"]))
        total = sum(user) + system
        if reference is None:
            reference = total
        lines.append("| %s | %.0f | %.1f (%s) | %.1f | %.1f | %.2f× | %.2f + %.2f | %.2f | %.1f | %.1f | %s | %s |" % (
            result["label"], result["requests"] / mean(lambda w: w["seconds"]), sum(user),
            " + ".join("%.1f" % u for u in user), system, total, total / reference,
            mean(lambda w: sum(r[2] for r in w["redis"])), mean(lambda w: sum(r[3] for r in w["redis"])),
            mean(lambda w: sum(sum(s) for s in w["syscalls"])),
            mean(lambda w: sum(t[0] + t[1] for t in w["toolhost"])),
            mean(lambda w: w["generator"][0] + w["generator"][1]),
            ", ".join("%.1f" % sum(r[0] + r[1] for r in w["redis"]) for w in windows),
            ", ".join("%.1f" % w["load_average"] for w in windows)))
    lines += ["", "| row | node | commands per request (the first window) |", "|---|---|---|"]
    for result in results:
        for i, commands in enumerate(result["windows"][0]["commands"]):
            cells = ", ".join("`%s` %.2f" % (c, v) for c, v in sorted(commands.items()) if v >= 0.005)
            lines.append("| %s | redis-%d | %s |" % (result["label"], i, cells))
    return "\n".join(lines)


# --- the report --------------------------------------------------------------------------------

def per_request(result):
    """Per node: gross and net instructions per request, the mean over the windows."""
    n = result["requests"]
    windows = result["windows"]
    nodes = len(windows[0]["counts"])
    gross = [sum(w["counts"][i] for w in windows) / len(windows) / n for i in range(nodes)]
    net = [sum(w["counts"][i] - result["idle_per_s"][i] * w["seconds"][i] for w in windows) / len(windows) / n
           for i in range(nodes)]
    return gross, net


def report(results):
    lines = ["| row | instructions per request, per node (net) | sum, net | × row 1 | sum, gross | × row 1 | "
             "each window's sum, gross | idle background per node, instructions/s | window s | failed |",
             "|---|---|---:|---:|---:|---:|---|---|---:|---:|"]
    reference = None
    for result in results:
        gross, net = per_request(result)
        n = result["requests"]
        if reference is None:
            reference = (sum(net), sum(gross))
        sums = ", ".join("%.0f" % (sum(w["counts"]) / n) for w in result["windows"])
        lines.append("| %s | %s | %.0f | %.2f× | %.0f | %.2f× | %s | %s | %s | %d |" % (
            result["label"], " + ".join("%.0f" % v for v in net), sum(net), sum(net) / reference[0],
            sum(gross), sum(gross) / reference[1], sums,
            " + ".join("%.0f" % v for v in result["idle_per_s"]),
            ", ".join("%.1f" % w["load_seconds"] for w in result["windows"]), result["failed"]))
    lines += ["", "Inclusive instructions per request by function, summed over the nodes (gross, mean of the windows):", "",
              "| function | what | " + " | ".join(r["label"] for r in results) + " |",
              "|---|---|" + "---:|" * len(results)]
    for label, what in FUNCTIONS:
        cells = []
        for result in results:
            windows = result["windows"]
            total = sum(sum(f.get(label, 0) for f in w["functions"]) for w in windows) / len(windows) / result["requests"]
            cells.append("%.0f" % total)
        lines.append("| `%s` | %s | %s |" % (label, what, " | ".join(cells)))
    lines += ["", "Where the instructions go, per request summed over the nodes (gross, mean of the windows; "
              "from the inclusive counts above, each part counted once):", "",
              "| part | " + " | ".join(r["label"] for r in results) + " |", "|---|" + "---:|" * len(results)]
    parts = {}
    for result in results:
        windows = result["windows"]
        f = lambda label: sum(sum(fn.get(label, 0) for fn in w["functions"]) for w in windows) / len(windows) \
            / result["requests"]
        total = sum(sum(w["counts"]) for w in windows) / len(windows) / result["requests"]
        blocked = f("handleClientsBlockedOnKeys")
        crons = f("serverCron") + f("clusterCron") + f("clusterBeforeSleep") + f("clusterReadHandler")
        parts[result["row"]] = [
            ("scripts (`evalGenericCommand`)", f("evalGenericCommand")),
            ("other commands (`call` less the scripts)", f("call") - f("evalGenericCommand")),
            ("blocked reads served (`handleClientsBlockedOnKeys`)", blocked),
            ("cluster: key slots and nodes (`getNodeByQuery`)", f("getNodeByQuery")),
            ("crons and the cluster bus (`serverCron`, `clusterCron`, `clusterBeforeSleep`, `clusterReadHandler`)",
             crons),
            ("the rest: reading, parsing and dispatching commands, writing replies, the event loop",
             total - f("call") - blocked - f("getNodeByQuery") - crons),
            ("total", total),
        ]
    for i, (label, _) in enumerate(next(iter(parts.values()))):
        lines.append("| %s | %s |" % (label, " | ".join("%.0f" % parts[r["row"]][i][1] for r in results)))
    lines += ["", "System calls per request by node (read + write, `/proc/<pid>/io` syscr and syscw, the first "
              "window; the kernel's work, which callgrind does not count):", ""]
    for result in results:
        io = result["windows"][0].get("syscalls", [])
        lines.append("- %s: %s; sum %.2f" % (result["label"], ", ".join(
            "redis-%d %.2f + %.2f" % (i, r, w) for i, (r, w) in enumerate(io)), sum(r + w for r, w in io)))
    lines += ["", "Commands per request by node (`INFO commandstats`, the first window; a script's commands "
              "counted under their own names too):", "", "| row | node | commands |", "|---|---|---|"]
    for result in results:
        for i, commands in enumerate(result["windows"][0]["commands"]):
            cells = ", ".join("`%s` %.2f" % (c, v) for c, v in sorted(commands.items()) if v >= 0.005)
            lines.append("| %s | redis-%d | %s |" % (result["label"], i, cells))
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=5000, help="requests per measured window")
    parser.add_argument("--in-flight", type=int, default=64, help="requests in flight")
    parser.add_argument("--windows", type=int, default=2, help="measured windows per row")
    parser.add_argument("--idle-s", type=float, default=10.0, help="length of the idle measurement")
    parser.add_argument("--rows", default=",".join(ROWS), help="rows, comma separated: " + ", ".join(ROWS))
    parser.add_argument("--out-dir", default="target/bench/redis-instructions")
    parser.add_argument("--cpu", action="store_true",
                        help="no valgrind: each process's CPU time and context switches per request instead")
    parser.add_argument("--keep", action="store_true", help="keep the dumps and logs")
    parser.add_argument("--ledger-format", choices=["1", "2", "3"], default="2",
                        help="[dispatch] ledger_format of the replicas (default 2)")
    parser.add_argument("--report-only", action="store_true",
                        help="measure nothing: the report of the rows' results already in --out-dir")
    parser.add_argument("toolhost", nargs="?", default="target/release/toolhost", help="the toolhost binary")
    args = parser.parse_args()
    global LEDGER_FORMAT
    LEDGER_FORMAT = args.ledger_format
    test_shard_rule()
    rows = args.rows.split(",")
    for row in rows:
        if row not in ROWS:
            parser.error("unknown row " + row)
    os.makedirs(args.out_dir, exist_ok=True)
    binary = os.path.abspath(args.toolhost)
    results = []
    for row in rows:
        path = os.path.join(args.out_dir, row + ("-cpu" if args.cpu else "") + ".json")
        if args.report_only:
            with open(path) as f:
                results.append(json.load(f))
            continue
        result = (measure_row_cpu if args.cpu else measure_row)(row, binary, args, args.out_dir)
        results.append(result)
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
        print("bench: %s took %.0f s" % (row, result["run_seconds"]), file=sys.stderr)
    print(report_cpu(results) if args.cpu else report(results))


if __name__ == "__main__":
    main()
