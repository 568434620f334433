"""Signed requests (docs/CONTRACTS.md, "Signed requests"): a client given `key_id` and `secret`
signs every request, and a host that requires signatures runs its calls and refuses others."""

from __future__ import annotations

import hashlib
import hmac
import json
import shutil
from collections.abc import Iterator

import pytest

from toolhost import AsyncClient, Client, ClientError, NoAnswer

from .conftest import Daemon, RedisServer

SECRET = "python-secret-0123456789"

CONFIG = """
[auth]
require_signature = true

[[auth.keys]]
id = "py-1"
secret_env = "PY_KEY"
tenants = ["acme"]
"""


@pytest.fixture
def signed_daemon(redis_server: RedisServer) -> Iterator[Daemon]:
    host = Daemon(redis_server.url, CONFIG, env={"PY_KEY": SECRET})
    yield host
    host.stop()
    shutil.rmtree(host.dir, ignore_errors=True)


def test_a_signed_client_is_answered_and_its_entries_carry_the_hmac_of_the_payload(
    signed_daemon: Daemon, redis_server: RedisServer
) -> None:
    with Client(redis_server.url, key_id="py-1", secret=SECRET, tenant_id="acme") as client:
        assert client.call("echo", {"message": "signed"}) == {"message": "signed"}
    entries = redis_server.connection().xrange("action-requests")
    assert len(entries) == 1
    fields = entries[0][1]
    payload = fields[b"payload"]
    expected = hmac.new(SECRET.encode(), payload, hashlib.sha256).hexdigest()
    assert fields[b"sig"].decode() == f"v1=py-1:{expected}"


def test_a_wrong_secret_or_tenant_is_refused_on_the_default_topic_and_never_answered_privately(
    signed_daemon: Daemon, redis_server: RedisServer
) -> None:
    for options in ({"secret": "not-the-secret-0123", "tenant_id": "acme"}, {"secret": SECRET, "tenant_id": "globex"}):
        with Client(redis_server.url, key_id="py-1", default_timeout=1, **options) as client:
            with pytest.raises(NoAnswer):
                client.call("echo", {"message": "x"}, timeout=1)
    with Client(redis_server.url, default_timeout=1) as unsigned:
        with pytest.raises(NoAnswer):
            unsigned.call("echo", {"message": "x"}, timeout=1)
    answers = [json.loads(fields[b"payload"]) for _, fields in redis_server.connection().xrange("action-results")]
    errors = [answer["data"]["error"] for answer in answers]
    assert [answer["data"]["error_code"] for answer in answers] == ["forbidden"] * 3, errors
    assert "does not match" in errors[0]
    assert "may not sign for tenant 'globex'" in errors[1]
    assert "unsigned request" in errors[2]


def test_key_id_and_secret_go_together() -> None:
    with pytest.raises(ClientError, match="go together"):
        AsyncClient("redis://127.0.0.1:1/0", key_id="k")
    with pytest.raises(ClientError, match="go together"):
        AsyncClient("redis://127.0.0.1:1/0", secret="s")
    with pytest.raises(ClientError, match="without ':'"):
        AsyncClient("redis://127.0.0.1:1/0", key_id="a:b", secret="s")
