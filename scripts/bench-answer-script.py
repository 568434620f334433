#!/usr/bin/env python3
"""Instructions Redis executes per answer of `answer_batch.lua` variants, under valgrind's callgrind.

On a shared machine time per call moves with the neighbours; instructions do not. For each variant
a fresh `redis-server` runs under callgrind, the script is loaded, 20 warm-up calls are sent,
the counters are zeroed (`callgrind_control -z`), N pipelined `EVALSHA` calls of B items each are
sent with `redis-cli --pipe` (echo's shape: a 100-byte answer payload, nothing kept, no call
record, a fresh request id and entry per item), and the counters are dumped
(`callgrind_control -d`). Everything Redis did for the calls is counted: reading and parsing them,
the script, the `XADD`s, the replies. Prints instructions per answer.

With --commandstats the server runs without valgrind, and what is printed is Redis's own
`INFO commandstats` for the measured calls (after `CONFIG RESETSTAT`): microseconds and calls per
answer, by command (the commands a script runs are counted under their own names, and their
time inside `evalsha`'s too). Times move with the machine's load; the counts do not.

Usage: scripts/bench-answer-script.py [--commandstats] B N NAME=PATH:KEYS[:FORMAT] [...]
  PATH may be several files joined with '+', concatenated in that order (answer_batch.lua runs
  with add_answer.lua before it).
  KEYS is the item layout: 4 (answered mark, refusal mark, call record, topic: the script before
  round 6) or 3 (answered mark, refusal mark, topic: round 6 for items without a call record).
  FORMAT, for scripts that take the ledger format as their fourth shared argument (issue 35):
  1 (format 1, or 2 rolling from 1: the refusal mark is looked up), 2 (format 2 trusted) or 3
  (format 3: as 2 on one server; on a cluster new claims are strings, ARGV[4] '3'). Since format
  3 the cluster script needs cluster/claim_value.lua before it:
  add_answer.lua+cluster/claim_value.lua+cluster/answer_local.lua.
  The cluster's one-script answer (cluster/answer_local.lua, issue 35) runs on a cluster-mode
  server holding every slot, every key under one hash tag: KEYS c7 is the single-item script
  before round 11 (7 keys an item, each item wrapped by the bus's generic batch wrapper, as
  crates/bus/src/batch.rs `batch_source` writes it), c5 the script written for batches (the
  stream shared, 5 keys an item).
Example (docs/PERFORMANCE.md, round 6):
  git show 32d0a83:crates/bus/src/scripts/answer_batch.lua > /tmp/before.lua
  scripts/bench-answer-script.py 17 100 before=/tmp/before.lua:4 \
      after=crates/bus/src/scripts/answer_batch.lua:3
"""
import glob
import hashlib
import os
import socket
import subprocess
import sys
import tempfile
import time


def resp(*args):
    """One command in the Redis protocol."""
    out = [b'*%d\r\n' % len(args)]
    for arg in args:
        arg = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b'$%d\r\n%s\r\n' % (len(arg), arg))
    return b''.join(out)


def free_port():
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def cli(port, *args):
    return subprocess.run(['redis-cli', '-p', str(port), *args], capture_output=True, text=True).stdout


def batch_source(source, keys_per_item, args_per_item):
    """The bus's generic batch wrapper around a single-item script (crates/bus/src/batch.rs)."""
    return (
        'local function one(KEYS, ARGV)\n' + source + '\nend\n'
        'local n = tonumber(ARGV[1])\n'
        'local replies = {}\n'
        'for i = 1, n do\n'
        '  local keys, argv = {}, {}\n'
        f'  for j = 1, {keys_per_item} do keys[j] = KEYS[(i - 1) * {keys_per_item} + j] end\n'
        f'  for j = 1, {args_per_item} do argv[j] = ARGV[1 + (i - 1) * {args_per_item} + j] end\n'
        '  local ok, reply = pcall(one, keys, argv)\n'
        '  if ok then replies[i] = {1, reply} else\n'
        "    if type(reply) == 'table' then reply = reply.err or reply.message end\n"
        '    replies[i] = {0, tostring(reply)}\n'
        '  end\n'
        'end\n'
        'return replies\n')


def cluster_calls(layout, n_calls, per_call, tag, sha, ledger_format):
    """The cluster's one-script answer: every key in the slot of the tag `{t}`."""
    payload = '{"id":"x","data":{"request_id":"r","success":true,"result":{"message":"' + 'x' * 100 + '"}}}'
    stream, topic = 'action-requests:{t}', 'results:bench:{t}'
    trusted = {2: '1', 3: '3'}.get(ledger_format, '0')
    out = []
    for call in range(n_calls):
        if layout == 'c7':
            keys, args = [], [per_call]
        else:
            keys, args = [stream], ['toolhost', '100000', '86400000', trusted]
        for item in range(per_call):
            request_id, entry = f'{tag}-{call}-{item}', f'{call + 1}-{item}'
            claim = f'toolhost:ledger:{{t}}:action-requests:answered:{request_id}'
            refusal = f'toolhost:ledger:{{t}}:action-requests:entry:{entry}'
            record = f'toolhost:ledger:{{t}}:action-requests:call:{request_id}'
            final_mark = f'toolhost:ledger:{{t}}:answer:action-requests:answered:{request_id}'
            refusal_mark = f'toolhost:ledger:{{t}}:refusal:action-requests:entry:{entry}'
            answer = f'answer-{request_id}'
            if layout == 'c7':
                keys += [stream, claim, record, refusal, topic, final_mark, refusal_mark]
                args += ['toolhost', entry, '100000', '86400000', answer, payload, '', trusted, '0']
            else:
                keys += [claim, refusal, topic, final_mark, refusal_mark]
                args += [entry, answer, payload, '0', '']
        out.append(resp('EVALSHA', sha, len(keys), *keys, *args))
    return b''.join(out)


def calls(keys_per_item, n_calls, per_call, tag, sha, ledger_format=None):
    """N calls of B items each, every item with a fresh request id and entry id."""
    if keys_per_item in ('c7', 'c5'):
        return cluster_calls(keys_per_item, n_calls, per_call, tag, sha, ledger_format)
    payload = '{"id":"x","data":{"request_id":"r","success":true,"result":{"message":"' + 'x' * 100 + '"}}}'
    stream = 'action-requests'
    out = []
    for call in range(n_calls):
        keys, args = [stream], ['toolhost', '100000', '86400000']
        if ledger_format is not None:
            args.append('1' if ledger_format in (2, 3) else '0')
        for item in range(per_call):
            request_id, entry = f'{tag}-{call}-{item}', f'{call + 1}-{item}'
            mark = f'toolhost:ledger:{stream}:answered:{request_id}'
            refusal = f'toolhost:ledger:{stream}:entry:{entry}'
            record = f'toolhost:ledger:{stream}:call:{request_id}'
            if keys_per_item == 4:
                keys += [mark, refusal, record, 'action-results']
            else:
                keys += [mark, refusal, 'action-results']
            args += [entry, f'answer-{request_id}', payload, '0', '']
        out.append(resp('EVALSHA', sha, len(keys), *keys, *args))
    return b''.join(out)


def commandstats(port):
    """`INFO commandstats` as {command: (calls, usec)}."""
    stats = {}
    for line in cli(port, 'INFO', 'commandstats').splitlines():
        if line.startswith('cmdstat_'):
            name, fields = line[len('cmdstat_'):].split(':', 1)
            values = dict(field.split('=') for field in fields.split(','))
            stats[name] = (int(values['calls']), int(values['usec']))
    return stats


def measure(path, keys_per_item, n_calls, per_call, ledger_format=None, by_command=False):
    cluster = keys_per_item in ('c7', 'c5')
    port = free_port()
    # A cluster node also listens on its port + 10000.
    while cluster and port > 55535:
        port = free_port()
    workdir = tempfile.mkdtemp(prefix='answer-script-')
    out = os.path.join(workdir, 'callgrind.out')
    valgrind = [] if by_command else ['valgrind', '--tool=callgrind', f'--callgrind-out-file={out}']
    cluster_mode = ['--cluster-enabled', 'yes', '--cluster-config-file', os.path.join(workdir, 'nodes.conf'),
                    '--dir', workdir] if cluster else []
    server = subprocess.Popen(
        [*valgrind, 'redis-server', '--port', str(port), '--save', '', '--appendonly', 'no', *cluster_mode],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            time.sleep(0.1)
            if cli(port, 'PING').strip() == 'PONG':
                break
        if cluster:
            cli(port, 'CLUSTER', 'ADDSLOTSRANGE', '0', '16383')
            for _ in range(300):
                if 'cluster_state:ok' in cli(port, 'CLUSTER', 'INFO'):
                    break
                time.sleep(0.1)
        # PATH may join several files with '+' (a script and what the bus prepends to it).
        source = b''.join(open(part, 'rb').read() for part in path.split('+'))
        if keys_per_item == 'c7':
            source = batch_source(source.decode(), 7, 9).encode()
        sha = hashlib.sha1(source).hexdigest()
        cli(port, 'SCRIPT', 'LOAD', source.decode())
        pipe = ['redis-cli', '-p', str(port), '--pipe']
        warm = calls(keys_per_item, 20, per_call, 'warm', sha, ledger_format)
        warmed = subprocess.run(pipe, input=warm, capture_output=True)
        if warmed.returncode != 0:
            raise SystemExit(f'{path}: the warm-up calls failed: {warmed.stdout.decode()} {warmed.stderr.decode()}')
        measured = calls(keys_per_item, n_calls, per_call, 'run', sha, ledger_format)
        if by_command:
            cli(port, 'CONFIG', 'RESETSTAT')
            subprocess.run(pipe, input=measured, capture_output=True, check=True)
            stats = commandstats(port)
            cli(port, 'SHUTDOWN', 'NOSAVE')
            server.wait(timeout=60)
            answers = n_calls * per_call
            return {name: (calls / answers, usec / answers) for name, (calls, usec) in stats.items()
                    if name not in ('config|resetstat', 'info', 'echo')}
        subprocess.run(['callgrind_control', '-z', str(server.pid)], capture_output=True, check=True)
        subprocess.run(pipe, input=measured, capture_output=True, check=True)
        subprocess.run(['callgrind_control', '-d', str(server.pid)], capture_output=True, check=True)
        cli(port, 'SHUTDOWN', 'NOSAVE')
        server.wait(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
    total = 0
    for dump in glob.glob(out + '.*'):
        for line in open(dump):
            if line.startswith(('summary:', 'totals:')):
                total = max(total, int(line.split()[1]))
    if total == 0:
        raise SystemExit(f'no callgrind dump found in {workdir}')
    return total / (n_calls * per_call)


def main():
    argv = sys.argv[1:]
    by_command = bool(argv) and argv[0] == '--commandstats'
    if by_command:
        argv = argv[1:]
    if len(argv) < 3:
        raise SystemExit(__doc__)
    per_call, n_calls = int(argv[0]), int(argv[1])
    for variant in argv[2:]:
        name, rest = variant.split('=', 1)
        parts = rest.split(':')
        path, keys_per_item = parts[0], parts[1] if parts[1] in ('c7', 'c5') else int(parts[1])
        ledger_format = int(parts[2]) if len(parts) > 2 else None
        measured = measure(path, keys_per_item, n_calls, per_call, ledger_format, by_command)
        if by_command:
            row = ', '.join(f'{name} {usec:.2f} us ({calls:.2f})' for name, (calls, usec) in sorted(measured.items()))
            print(f'{name}: per answer, {per_call} answers a call, {n_calls} calls: {row}')
        else:
            print(f'{name}: {measured:.0f} instructions per answer, {per_call} answers a call, {n_calls} calls')


if __name__ == '__main__':
    main()
