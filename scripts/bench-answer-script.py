#!/usr/bin/env python3
"""Instructions Redis executes per answer of `answer_batch.lua` variants, under valgrind's callgrind.

On a shared machine time per call moves with the neighbours; instructions do not. For each variant
a fresh `redis-server` runs under callgrind, the script is loaded, 20 warm-up calls are sent,
the counters are zeroed (`callgrind_control -z`), N pipelined `EVALSHA` calls of B items each are
sent with `redis-cli --pipe` (echo's shape: a 100-byte answer payload, nothing kept, no call
record, a fresh request id and entry per item), and the counters are dumped
(`callgrind_control -d`). Everything Redis did for the calls is counted: reading and parsing them,
the script, the `XADD`s, the replies. Prints instructions per answer.

Usage: scripts/bench-answer-script.py B N NAME=PATH:KEYS [NAME=PATH:KEYS ...]
  KEYS is the item layout: 4 (answered mark, refusal mark, call record, topic: the script before
  round 6) or 3 (answered mark, refusal mark, topic: round 6 for items without a call record).
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


def calls(keys_per_item, n_calls, per_call, tag, sha):
    """N calls of B items each, every item with a fresh request id and entry id."""
    payload = '{"id":"x","data":{"request_id":"r","success":true,"result":{"message":"' + 'x' * 100 + '"}}}'
    stream = 'action-requests'
    out = []
    for call in range(n_calls):
        keys, args = [stream], ['toolhost', '100000', '86400000']
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


def measure(path, keys_per_item, n_calls, per_call):
    port = free_port()
    workdir = tempfile.mkdtemp(prefix='answer-script-')
    out = os.path.join(workdir, 'callgrind.out')
    server = subprocess.Popen(
        ['valgrind', '--tool=callgrind', f'--callgrind-out-file={out}',
         'redis-server', '--port', str(port), '--save', '', '--appendonly', 'no'],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            time.sleep(0.1)
            if cli(port, 'PING').strip() == 'PONG':
                break
        source = open(path, 'rb').read()
        sha = hashlib.sha1(source).hexdigest()
        cli(port, 'SCRIPT', 'LOAD', source.decode())
        pipe = ['redis-cli', '-p', str(port), '--pipe']
        subprocess.run(pipe, input=calls(keys_per_item, 20, per_call, 'warm', sha), capture_output=True, check=True)
        measured = calls(keys_per_item, n_calls, per_call, 'run', sha)
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
    if len(sys.argv) < 4:
        raise SystemExit(__doc__)
    per_call, n_calls = int(sys.argv[1]), int(sys.argv[2])
    for variant in sys.argv[3:]:
        name, rest = variant.split('=', 1)
        path, keys_per_item = rest.rsplit(':', 1)
        per_answer = measure(path, int(keys_per_item), n_calls, per_call)
        print(f'{name}: {per_answer:.0f} instructions per answer, {per_call} answers a call, {n_calls} calls')


if __name__ == '__main__':
    main()
