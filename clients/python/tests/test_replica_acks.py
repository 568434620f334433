"""`replica_acks=`: a request that must survive a Redis failover waits for replicas after its
XADD, and the client says so when fewer acknowledged (see docs/RELIABILITY.md, "Callers")."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Iterator

import pytest

from toolhost import Client, ClientError, RequestNotReplicated

from .conftest import Daemon, RedisServer


@pytest.fixture
def replica(redis_server: RedisServer) -> Iterator[RedisServer]:
    """A replica of `redis_server`, in sync with it."""
    server = RedisServer()
    server.connection().execute_command("REPLICAOF", "127.0.0.1", str(redis_server.port))
    deadline = time.monotonic() + 10
    while server.connection().info("replication").get("master_link_status") != "up":
        assert time.monotonic() < deadline, "the replica did not sync"
        time.sleep(0.02)
    yield server
    if server.process is not None:
        server.process.send_signal(signal.SIGCONT)
    server.stop()
    shutil.rmtree(server.dir, ignore_errors=True)


def waits(server: RedisServer) -> int:
    """How many WAIT commands the server ran."""
    stats = server.connection().info("commandstats")
    return int(stats.get("cmdstat_wait", {}).get("calls", 0))


def requests_with_id(server: RedisServer, request_id: str) -> int:
    """How many entries of the requests stream carry `request_id`."""
    count = 0
    for _, fields in server.connection().xrange("action-requests"):
        if json.loads(fields[b"payload"])["data"].get("request_id") == request_id:
            count += 1
    return count


def test_a_request_waits_for_the_replica_and_is_on_it(daemon: Daemon, redis_server: RedisServer, replica: RedisServer) -> None:
    before = waits(redis_server)
    with Client(redis_server.url) as plain:
        assert plain.call("echo", {"message": "plain"}) == {"message": "plain"}
    assert waits(redis_server) == before, "a client without replica_acks sent WAIT"
    with Client(redis_server.url, replica_acks=1) as client:
        assert client.call("echo", {"message": "kept"}, request_id="r-kept") == {"message": "kept"}
    assert waits(redis_server) == before + 1
    assert requests_with_id(replica, "r-kept") == 1


def test_a_request_the_replica_did_not_acknowledge_raises_and_a_retry_with_its_id_is_safe(
    daemon: Daemon, redis_server: RedisServer, replica: RedisServer
) -> None:
    assert replica.process is not None
    with Client(redis_server.url, replica_ack_timeout=0.3) as client:
        os.kill(replica.process.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(RequestNotReplicated) as raised:
                client.call("echo", {"message": "m"}, request_id="r-lag", replica_acks=1)
            assert 0.3 <= time.monotonic() - started < 3
            err = raised.value
            assert (err.request_id, err.acked, err.wanted) == ("r-lag", 0, 1)
            assert "a failover now could lose it" in str(err)
            # It was written on the master all the same: it may still be answered.
            assert requests_with_id(redis_server, "r-lag") == 1
        finally:
            os.kill(replica.process.pid, signal.SIGCONT)
        # The replica is back: the same request id again is safe, answered once.
        assert client.call("echo", {"message": "m"}, request_id="r-lag", replica_acks=1) == {"message": "m"}
    assert requests_with_id(replica, "r-lag") == 2


def test_replica_acks_out_of_range_is_refused_before_anything_is_sent(redis_server: RedisServer) -> None:
    for bad in (-1, 17, 1.5, True):
        with pytest.raises(ClientError, match="replica_acks"):
            Client(redis_server.url, replica_acks=bad)
    with pytest.raises(ClientError, match="replica_ack_timeout"):
        Client(redis_server.url, replica_ack_timeout=0)
