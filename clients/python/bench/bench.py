"""Echo through AsyncClient beside the same calls made with bare redis-py, in one run.

Both callers write `tool.invoke` requests for the built-in echo to `action-requests` and read
the answers on a private stream with one XREAD BLOCK loop that routes them by request id; the
bare caller is that loop and nothing else (no checks, no retries, no progress, no TTL). They
run against one `toolhost serve` (the release build) and one redis-server, interleaved for
ROUNDS rounds: p50 over SEQUENTIAL calls made one at a time, and calls per second with 64 in
flight for PHASE seconds. Each row is the median of its rounds.

    cargo build --release --bin toolhost
    <venv>/bin/python clients/python/bench/bench.py      # just bench runs it

The table goes to stdout and target/bench/python-client.md.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aioredis

from toolhost import AsyncClient

ROOT = Path(__file__).resolve().parents[3]
TOOLHOST = Path(os.environ.get("TOOLHOST_BIN", ROOT / "target" / "release" / "toolhost"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
SEQUENTIAL = int(os.environ.get("BENCH_SEQUENTIAL", "1000"))
PHASE = float(os.environ.get("BENCH_PHASE_S", "5"))
LANES = 64


class Bare:
    """A caller in bare redis-py: XADD, and one XREAD BLOCK loop routing answers by id."""

    def __init__(self, url: str) -> None:
        self.redis = aioredis.Redis.from_url(url, max_connections=LANES + 2)
        self.stream = f"results:bare-{uuid.uuid4().hex}"
        self.waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.last = "$"
        self.reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.last = await self.redis.xadd(self.stream, {"id": "open", "payload": "{}"})
        self.reader = asyncio.create_task(self.read())

    async def read(self) -> None:
        while True:
            replies = await self.redis.xread({self.stream: self.last}, count=256, block=1000)
            for _, entries in replies or []:
                for entry_id, fields in entries:
                    self.last = entry_id
                    data = json.loads(fields[b"payload"]).get("data") or {}
                    future = self.waiting.pop(data.get("request_id"), None)
                    if future is not None and not future.done():
                        future.set_result(data)

    async def call(self, message: str) -> Any:
        request_id = str(uuid.uuid4())
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.waiting[request_id] = future
        envelope = {
            "id": request_id,
            "type": "tool.invoke",
            "response_topic": self.stream,
            "data": {"request_id": request_id, "tool": "echo", "arguments": {"message": message}},
        }
        await self.redis.xadd("action-requests", {"id": request_id, "payload": json.dumps(envelope)})
        data = await asyncio.wait_for(future, 30)
        assert data["success"], data
        return data["result"]

    async def close(self) -> None:
        if self.reader is not None:
            self.reader.cancel()
        await self.redis.delete(self.stream)
        await self.redis.aclose()


async def measure(call: Callable[[str], Awaitable[Any]]) -> tuple[float, float]:
    """(p50 µs at 1 in flight, calls/s at LANES in flight)."""
    for _ in range(100):
        await call("warm")
    latencies = []
    for _ in range(SEQUENTIAL):
        started = time.perf_counter()
        await call("hi")
        latencies.append((time.perf_counter() - started) * 1e6)
    done = 0
    deadline = time.perf_counter() + PHASE

    async def lane() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await call("hi")
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(LANES)))
    return statistics.median(latencies), done / (time.perf_counter() - started)


async def run(url: str) -> dict[str, list[tuple[float, float]]]:
    rows: dict[str, list[tuple[float, float]]] = {"bare redis-py": [], "AsyncClient": []}
    for _ in range(ROUNDS):
        bare = Bare(url)
        await bare.start()
        rows["bare redis-py"].append(await measure(bare.call))
        await bare.close()
        async with AsyncClient(url, max_connections=LANES + 2) as client:
            rows["AsyncClient"].append(await measure(lambda message: client.call("echo", {"message": message})))
    return rows


def main() -> int:
    assert TOOLHOST.exists(), f"{TOOLHOST} is missing: cargo build --release --bin toolhost"
    work = Path(tempfile.mkdtemp(prefix="toolhost-bench-python-"))
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(work)],
        stdout=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    daemon = None
    try:
        for _ in range(200):
            try:
                redis.Redis(port=port).ping()
                break
            except redis.RedisError:
                time.sleep(0.02)
        log = open(work / "toolhost.log", "wb")
        daemon = subprocess.Popen(
            [str(TOOLHOST), "serve"],
            env={"PATH": os.environ.get("PATH", ""), "REDIS_URL": url, "TOOLHOST__HTTP__LISTEN": "127.0.0.1:0",
                 "TOOLHOST__LOG__LEVEL": "warn", "TOOLHOST__LOG__FORMAT": "json"},
            stdout=log, stderr=log,
        )
        for _ in range(300):
            if redis.Redis(port=port).exists("toolhost:registry:toolhost"):
                break
            time.sleep(0.05)
        rows = asyncio.run(run(url))
    finally:
        if daemon is not None:
            daemon.kill()
        server.kill()
    table = f"| caller | p50 µs (1 in flight) | calls/s ({LANES} in flight) |\n|---|---:|---:|\n"
    medians = {}
    for name, runs in rows.items():
        p50 = statistics.median(run[0] for run in runs)
        rate = statistics.median(run[1] for run in runs)
        medians[name] = (p50, rate)
        table += f"| {name} | {p50:.0f} | {rate:.0f} |\n"
    bare, client = medians["bare redis-py"], medians["AsyncClient"]
    table += (
        f"\nAsyncClient: p50 {client[0] / bare[0]:.2f}x and throughput {client[1] / bare[1]:.2f}x of bare redis-py "
        f"(median of {ROUNDS} interleaved rounds; {sys.version.split()[0]}, redis-py {redis.__version__}).\n"
    )
    print(table, end="")
    out = ROOT / "target" / "bench"
    out.mkdir(parents=True, exist_ok=True)
    (out / "python-client.md").write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
