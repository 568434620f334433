"""Fixtures: a real redis-server and a real `toolhost serve` on free loopback ports.

The daemon is the workspace's debug build (`TOOLHOST_BIN` names another); `just test-python`
builds it first.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

ROOT = Path(__file__).resolve().parents[3]
TOOLHOST = Path(os.environ.get("TOOLHOST_BIN", ROOT / "target" / "debug" / "toolhost"))

CONFIG = """
[tools]
disabled = ["terminal_run"]

[dispatch]
claim_idle_ms = 1000

[tools.terminal]
run_as = "{user}"

[tools.limits."sleeper"]
max_concurrent = 1
max_queue = 0

[[commands]]
name = "sleeper"
description = "Sleeps."
argv = ["sleep", "{{seconds}}"]
argument_schema = {{ type = "object", properties = {{ seconds = {{ type = "string" }} }}, required = ["seconds"], additionalProperties = false }}
timeout_ms = 20000

[[commands]]
name = "fails"
description = "Always fails."
argv = ["false"]
argument_schema = {{ type = "object", properties = {{}}, additionalProperties = false }}

[[commands]]
name = "says_list"
description = "Prints a list where an object is promised."
argv = ["echo", "[1]"]
output = "json"
argument_schema = {{ type = "object", properties = {{}}, additionalProperties = false }}
output_schema = {{ type = "object" }}
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    def __init__(self) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="toolhost-py-redis-")
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, *extra: str) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.dir, *extra],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if redis.Redis(port=self.port, socket_timeout=0.5).ping():
                    return
            except redis.exceptions.AuthenticationError:
                return
            except redis.exceptions.RedisError:
                time.sleep(0.02)
        raise RuntimeError(f"redis-server did not start on {self.port}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def connection(self) -> Any:
        """A blocking redis-py connection (typed Any: redis-py types its sync replies as maybe-awaitable)."""
        return redis.Redis(port=self.port)


class Daemon:
    def __init__(self, redis_url: str, config: str, env: dict[str, str] | None = None) -> None:
        self.env = env or {}
        self.dir = tempfile.mkdtemp(prefix="toolhost-py-daemon-")
        self.config = Path(self.dir) / "toolhost.toml"
        self.config.write_text(config)
        self.redis_url = redis_url
        self.process: subprocess.Popen[bytes] | None = None
        self.log = Path(self.dir) / "toolhost.log"
        self.start()

    def start(self) -> None:
        assert TOOLHOST.exists(), f"{TOOLHOST} is missing: run `cargo build --bin toolhost` (just test-python does)"
        env = {
            "PATH": os.environ.get("PATH", ""),
            "REDIS_URL": self.redis_url,
            "TOOLHOST_CONFIG": str(self.config),
            "TOOLHOST__HTTP__LISTEN": "127.0.0.1:0",
            "TOOLHOST__LOG__FORMAT": "json",
            **self.env,
        }
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen([str(TOOLHOST), "serve"], env=env, stdout=log, stderr=log)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if '"message":"ready"' in self.log.read_text(errors="replace"):
                return
            if self.process.poll() is not None:
                raise RuntimeError(f"toolhost exited:\n{self.log.read_text()}")
            time.sleep(0.05)
        raise RuntimeError(f"toolhost never logged ready:\n{self.log.read_text()}")

    def stop(self, sig: int = 15) -> None:
        if self.process is not None:
            self.process.send_signal(sig)
            self.process.wait(30)
            self.process = None

    def restart(self) -> None:
        self.stop()
        # A fresh log, so that `ready` is the new process's.
        self.log.unlink(missing_ok=True)
        self.start()


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    yield server
    server.stop()
    shutil.rmtree(server.dir, ignore_errors=True)


@pytest.fixture
def daemon(redis_server: RedisServer) -> Iterator[Daemon]:
    host = Daemon(redis_server.url, CONFIG.format(user=getpass.getuser()))
    yield host
    host.stop()
    shutil.rmtree(host.dir, ignore_errors=True)
