"""The README's "Calling from Python" blocks, run as written against a real daemon."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from .conftest import ROOT, Daemon, RedisServer


def test_the_readme_blocks_run_as_written(daemon: Daemon, redis_server: RedisServer) -> None:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"<!-- python-client-check -->\n```python\n(.*?)```", text, re.S)
    assert len(blocks) == 2, "README.md's Calling from Python blocks are marked <!-- python-client-check -->"
    printed = []
    for block in blocks:
        ran = subprocess.run(
            [sys.executable, "-c", block],
            env={**os.environ, "REDIS_URL": redis_server.url},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert ran.returncode == 0, f"{block}\n{ran.stdout}\n{ran.stderr}"
        printed.append(ran.stdout)
    # The lines printed what the comments say.
    lines = printed[0].splitlines()
    assert lines[0] == "{'message': 'hi'}", printed[0]
    assert lines[1].startswith("invalid_arguments: ") and "- at /message (rule type)" in printed[0], printed[0]
    assert "Finished(request_id=" in printed[0] and "'echo'" in printed[0], printed[0]
    assert printed[1].strip() == "300 answers", printed[1]


def test_the_example_worker(daemon: Daemon, redis_server: RedisServer) -> None:
    ran = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "worker.py")],
        env={**os.environ, "REDIS_URL": redis_server.url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0 and "echo answered: {'message': 'hello from the example worker'}" in ran.stdout, ran
