"""The client against a real daemon and a real redis-server (see conftest.py)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import redis

import toolhost
from toolhost import AsyncClient, Client, Finished, NoAnswer, Progress, ToolError

from .conftest import Daemon, RedisServer


def answers_for(server: RedisServer, stream: str, request_id: str) -> list[dict[str, Any]]:
    """Every answer (not progress) for `request_id` on `stream`."""
    found = []
    for _, fields in server.connection().xrange(stream):
        payload = json.loads(fields[b"payload"])
        data = payload.get("data") or {}
        if data.get("request_id") == request_id and "success" in data:
            found.append(payload)
    return found


def test_a_call_returns_the_result_and_close_deletes_the_private_stream(daemon: Daemon, redis_server: RedisServer) -> None:
    with Client(redis_server.url) as client:
        assert client.call("echo", {"message": "hi"}) == {"message": "hi"}
        stream = client.response_topic
        assert stream.startswith("results:")
        assert 0 < redis_server.connection().ttl(stream) <= 60
    assert redis_server.connection().exists(stream) == 0


def test_every_error_code_the_host_answers_this_client_is_typed(
    daemon: Daemon, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Client(redis_server.url) as client:
        with pytest.raises(toolhost.InvalidArguments) as invalid:
            client.call("echo", {"message": 5})
        assert invalid.value.code == "invalid_arguments" and not invalid.value.final
        assert invalid.value.details["errors"][0]["pointer"] == "/message"
        assert "- at /message (rule type)" in str(invalid.value) and invalid.value.request_id in str(invalid.value)
        with pytest.raises(toolhost.UnknownTool):
            client.call("no_such_tool", {})
        with pytest.raises(toolhost.ToolDisabled):
            client.call("terminal_run", {"command": "true"})
        with pytest.raises(toolhost.ToolFailed) as failed:
            client.call("fails", {})
        assert failed.value.final
        with pytest.raises(toolhost.InvalidOutput):
            client.call("says_list", {})
        with pytest.raises(toolhost.ToolTimeout) as timed_out:
            client.call("sleeper", {"seconds": "5"}, timeout=1.0)
        assert timed_out.value.final
        # Expired: a request stamped 5 s ago with a 1 ms budget. (Stamped now, a 1 ms budget can
        # still be met by a quick host, since the host counts from the millisecond.)
        with monkeypatch.context() as past:
            sent = (datetime.now(timezone.utc) - timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            past.setattr(toolhost._wire, "now_rfc3339", lambda: sent)
            with pytest.raises(toolhost.Expired):
                client.call("echo", {"message": "late"}, timeout=0.001)
        # Overloaded: the sleeper runs one at a time with no queue.
        busy = threading.Thread(target=lambda: client.call("sleeper", {"seconds": "2"}))
        busy.start()
        time.sleep(0.5)
        with pytest.raises(toolhost.Overloaded) as overloaded:
            client.call("sleeper", {"seconds": "1"})
        assert overloaded.value.retry_after is not None and overloaded.value.retry_after > 0
        busy.join()
        # Cancelled: the wire's tool.cancel.
        outcome: dict[str, Any] = {}

        def slow() -> None:
            try:
                client.call("sleeper", {"seconds": "10"}, request_id="to-cancel")
            except ToolError as err:
                outcome["error"] = err

        waiting = threading.Thread(target=slow)
        waiting.start()
        time.sleep(0.7)
        assert client.cancel("to-cancel") == "cancelling"
        waiting.join(10)
        assert isinstance(outcome["error"], toolhost.Cancelled) and outcome["error"].final
        # A cancel racing the call's own end may still say `cancelling` (CONTRACTS, "Cancelling a
        # call"): the call is answered, and a later cancel finds the answer.
        deadline = time.monotonic() + 5
        while (state := client.cancel("to-cancel")) == "cancelling" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert state == "answered"
        assert client.cancel("never-sent") == "unknown"


async def test_invalid_request_and_forbidden(daemon: Daemon, redis_server: RedisServer) -> None:
    async with AsyncClient(redis_server.url) as client:
        # A malformed envelope the client itself never writes: data.tool not a string.
        answer = await client._ask(
            "tool.invoke", {"request_id": "bad-envelope", "tool": 5}, "bad-envelope", client._calls, 10.0
        )
        assert answer is not None
        with pytest.raises(toolhost.InvalidRequest):
            raise toolhost._errors.error_from(answer.data, "bad-envelope")
    # A response topic the host does not allow is refused on the default results topic: this
    # client's call then gets no answer, and the refusal says why.
    async with AsyncClient(redis_server.url, client_id="x", requests_topic="action-requests") as client:
        client.response_topic = "not-allowed"
        with pytest.raises(NoAnswer) as no_answer:
            await client.call("echo", {"message": "hi"}, timeout=1.0, request_id="refused-topic")
        assert "refused-topic" in str(no_answer.value)
    refusal = answers_for(redis_server, "action-results", "refused-topic")
    assert [entry["data"]["error_code"] for entry in refusal] == ["forbidden"]


async def test_three_hundred_concurrent_calls_each_get_their_own_answer(daemon: Daemon, redis_server: RedisServer) -> None:
    async with AsyncClient(redis_server.url) as client:
        results = await asyncio.gather(*(client.call("echo", {"message": str(i)}) for i in range(300)))
    assert results == [{"message": str(i)} for i in range(300)]


async def test_progress_then_the_result_and_a_result_stream_of_a_plain_call(daemon: Daemon, redis_server: RedisServer) -> None:
    async with AsyncClient(redis_server.url) as client:
        events = [event async for event in client.stream("echo", {"message": "streamed"})]
        assert events[-1] == Finished(events[-1].request_id, {"message": "streamed"})
        assert all(isinstance(event, Progress) for event in events[:-1])
        # Progress entries, written as the host writes them, reach the call and only it.
        rid = "with-progress"
        seen: list[Progress] = []
        call = asyncio.create_task(client.call("sleeper", {"seconds": "2"}, request_id=rid, on_progress=seen.append))
        await asyncio.sleep(0.3)
        payload = json.dumps({"id": "p1", "type": "tool.invoke.completed.progress",
                              "data": {"request_id": rid, "progress": 1, "total": 2, "message": "half"}})
        await client._redis.xadd(client._stream_key, {"id": "p1", "payload": payload})
        other = json.dumps({"id": "p2", "type": "x.progress", "data": {"request_id": "someone-else", "progress": 1}})
        await client._redis.xadd(client._stream_key, {"id": "p2", "payload": other})
        assert await call == ""
        assert seen == [Progress(rid, 1.0, 2.0, "half")]


async def test_retries_reuse_the_request_id_so_the_host_runs_it_once(daemon: Daemon, redis_server: RedisServer) -> None:
    async with AsyncClient(redis_server.url) as client:
        busy = asyncio.create_task(client.call("sleeper", {"seconds": "2"}))
        await asyncio.sleep(0.5)
        # Overloaded at first; the retries wait retry_after and send the same id again.
        assert await client.call("sleeper", {"seconds": "0"}, request_id="retried", retries=5) == ""
        await busy
        answers = answers_for(redis_server, client.response_topic, "retried")
    codes = [entry["data"].get("error_code", "success") for entry in answers]
    assert codes[-1] == "success" and codes.count("success") == 1 and set(codes[:-1]) <= {"overloaded"}, codes
    # The same id again is done: a caller that lost the answer (a new client, a new private
    # stream) gets the original answer without the tool running again; a run would sleep 5 s
    # past this call's 2 s timeout.
    async with AsyncClient(redis_server.url) as client:
        assert await client.call("sleeper", {"seconds": "5"}, request_id="retried", timeout=2.0) == ""
        again = answers_for(redis_server, client.response_topic, "retried")
        assert [entry["data"] for entry in again] == [answers[-1]["data"]]


def test_a_call_across_a_daemon_kill_is_answered_once(daemon: Daemon, redis_server: RedisServer) -> None:
    with Client(redis_server.url) as client:
        outcome: dict[str, Any] = {}

        def slow() -> None:
            try:
                outcome["result"] = client.call("sleeper", {"seconds": "3"}, request_id="across")
            except ToolError as err:
                outcome["error"] = err

        waiting = threading.Thread(target=slow)
        waiting.start()
        time.sleep(0.8)
        daemon.stop(9)
        daemon.start()
        waiting.join(30)
        # The sleeper is not idempotent: the replica that reclaims it answers `interrupted`
        # instead of running it again.
        assert isinstance(outcome.get("error"), toolhost.Interrupted), outcome
        assert len(answers_for(redis_server, client.response_topic, "across")) == 1
        assert client.call("echo", {"message": "after"}) == {"message": "after"}


async def test_a_redis_restart_while_calls_are_in_flight(redis_server: RedisServer) -> None:
    redis_server.stop()
    redis_server.start("--appendonly", "yes", "--appendfsync", "always")
    import getpass

    from .conftest import CONFIG

    host = Daemon(redis_server.url, CONFIG.format(user=getpass.getuser()))
    try:
        async with AsyncClient(redis_server.url) as client:
            calls = [asyncio.create_task(client.call("sleeper", {"seconds": "0"}, timeout=3.0, retries=8)) for _ in range(1)]
            calls += [asyncio.create_task(client.call("echo", {"message": str(i)}, timeout=3.0, retries=8)) for i in range(20)]
            await asyncio.sleep(0.05)
            redis_server.stop()
            await asyncio.sleep(1.0)
            redis_server.start("--appendonly", "yes", "--appendfsync", "always")
            results = await asyncio.gather(*calls)
        assert results == [""] + [{"message": str(i)} for i in range(20)]
    finally:
        host.stop()


def test_the_private_stream_expires_after_its_client_is_gone(daemon: Daemon, redis_server: RedisServer) -> None:
    client = Client(redis_server.url, stream_ttl=2.0)
    assert client.call("echo", {"message": "hi"}) == {"message": "hi"}
    stream = client.response_topic

    async def vanish() -> None:
        # As a killed process would: the reader and the keep-alive stop, nothing is deleted.
        for task in client._client._tasks:
            task.cancel()
        await asyncio.gather(*client._client._tasks, return_exceptions=True)
        await client._client._redis.aclose()

    asyncio.run_coroutine_threadsafe(vanish(), client._loop).result()
    deadline = time.monotonic() + 10
    while redis_server.connection().exists(stream) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert redis_server.connection().exists(stream) == 0


def test_tools_in_every_format_and_chat_send(daemon: Daemon, redis_server: RedisServer) -> None:
    with Client(redis_server.url) as client:
        native = client.tools()
        assert {"echo", "sleeper", "fails"} <= {tool["name"] for tool in native}
        openai = client.tools(format="openai")
        assert any(tool["function"]["name"] == "echo" for tool in openai)
        mcp = client.tools(format="mcp")
        assert any(tool["name"] == "echo" and "inputSchema" in tool for tool in mcp)
        assert client.tools(format="capabilities")
        assert client.tools(format="toolbox")
        sent = client.send("Alice", "hello", conversation_id="conv-1")
    assert sent["published_to"] == ["chat:conv-1", "chat:Alice"]
    entries = redis_server.connection().xrange("chat:Alice")
    message = json.loads(entries[-1][1][b"payload"])
    assert message["sender"] == "agent:python" and message["recipient"] == "agent:Alice"
    assert message["type"] == "message" and message["content"] == "hello" and message["conversation_id"] == "conv-1"


def test_bad_input_is_refused_before_anything_is_sent(daemon: Daemon, redis_server: RedisServer) -> None:
    before = redis_server.connection().xlen("action-requests")
    with Client(redis_server.url) as client:
        with pytest.raises(toolhost.ClientError, match="cannot be sent as JSON"):
            client.call("echo", {"message": object()})
        with pytest.raises(toolhost.ClientError, match="cannot be sent as JSON"):
            client.call("echo", {"message": float("nan")})
        with pytest.raises(toolhost.ClientError, match="not a tool name"):
            client.call("no spaces allowed", {})
        with pytest.raises(toolhost.ClientError, match="not a tool name"):
            client.call("x" * 65, {})
        with pytest.raises(toolhost.ClientError, match="must be a dict"):
            client.call("echo", ["a list"])  # type: ignore[arg-type]
        with pytest.raises(toolhost.ClientError, match="timeout"):
            client.call("echo", {"message": "hi"}, timeout=-1)
        stream = client.response_topic
    assert redis_server.connection().xlen("action-requests") == before
    with pytest.raises(toolhost.ClientClosed):
        client.call("echo", {"message": "hi"})
    assert redis_server.connection().exists(stream) == 0


def test_a_redis_that_refuses_the_login(redis_server: RedisServer) -> None:
    redis_server.connection().config_set("requirepass", "s3cret")
    keys_before = redis.Redis(port=redis_server.port, password="s3cret").dbsize()
    with pytest.raises(toolhost.ConnectionFailed, match="refused the login") as refused:
        Client(f"redis://:wrong@127.0.0.1:{redis_server.port}/0")
    assert "wrong" not in str(refused.value)
    with pytest.raises(toolhost.ConnectionFailed):
        Client(redis_server.url)
    assert redis.Redis(port=redis_server.port, password="s3cret").dbsize() == keys_before


def test_nothing_answering_is_no_answer_with_the_request_id(redis_server: RedisServer) -> None:
    with Client(redis_server.url) as client:
        with pytest.raises(NoAnswer) as no_answer:
            client.call("echo", {"message": "hi"}, timeout=0.5, request_id="nobody-home")
    assert no_answer.value.request_id == "nobody-home" and isinstance(no_answer.value, TimeoutError)


def test_a_given_traceparent_is_written_and_the_answer_continues_its_trace(daemon: Daemon, redis_server: RedisServer) -> None:
    # Without opentelemetry-api installed (this venv), the client writes the context as given;
    # with it, a PRODUCER span under it (tests/tests/telemetry.rs).
    given = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    with Client(redis_server.url) as client:
        result = client.call("echo", {"message": "traced"}, request_id="traced-1", traceparent=given, tracestate="v=1")
        assert result == {"message": "traced"}
        answers = answers_for(redis_server, client.response_topic, "traced-1")
    requests = [json.loads(fields[b"payload"]) for _, fields in redis_server.connection().xrange("action-requests")]
    sent = [request for request in requests if request["data"].get("request_id") == "traced-1"]
    assert (sent[0]["traceparent"], sent[0]["tracestate"]) == (given, "v=1")
    # The answer carries the call's own span in the caller's trace.
    assert answers[0]["traceparent"].startswith("00-4bf92f3577b34da6a3ce929d0e0e4736-")
    assert answers[0]["traceparent"] != given
    assert answers[0]["tracestate"] == "v=1"
