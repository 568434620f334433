"""AsyncClient: calls over Redis with answers on a private stream that one reader task serves."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import re
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any
from urllib.parse import unquote, urlsplit

import redis.asyncio as aioredis
from redis import exceptions as redis_errors
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.sentinel import Sentinel

from . import _otel, _wire
from ._errors import (
    ClientClosed,
    ClientError,
    ConnectionFailed,
    InvalidArguments,
    NoAnswer,
    Overloaded,
    RequestNotReplicated,
    ToolError,
    error_from,
)
from ._content import Reply, parse_blocks
from ._wire import Answer, Finished, InputRequest, LogEntry, Progress

log = logging.getLogger("toolhost")

# What answers a call's questions: a function or coroutine function of the InputRequest that
# gives the MCP response as a dict, or None to decline.
OnInput = Callable[[InputRequest], "dict[str, Any] | None | Awaitable[dict[str, Any] | None]"]

# How long a call waits past its own timeout before it says NoAnswer: the host answers a call
# at its deadline, and the answer needs a moment to arrive.
ANSWER_MARGIN = 2.0
# Error codes worth sending again with the same request id after a pause.
RETRIED_CODES = frozenset({"overloaded", "internal", "expired"})
# Entries read from the private stream per XREAD.
READ_COUNT = 256
# How long one XREAD blocks; also how soon a closed client's reader notices.
READ_BLOCK_MS = 1000


def _nodes(given: list[str] | str | None, variable: str) -> list[str]:
    """Nodes as the daemon's `[redis]` takes them: a list, or a comma-separated string (its
    environment variable `TOOLHOST__REDIS__...` when not given); items trimmed, empty ones
    dropped."""
    if given is None:
        given = os.environ.get(variable, "")
    items = given.split(",") if isinstance(given, str) else given
    return [item.strip() for item in items if item.strip()]


def _host_port(node: str, what: str) -> tuple[str, int]:
    """`host:port`, or a `redis://`/`rediss://` URL's host and port."""
    parts = urlsplit(node if "://" in node else f"redis://{node}")
    if parts.scheme not in ("redis", "rediss") or not parts.hostname or parts.port is None:
        raise ClientError(f"{what} {node!r} must be host:port or a redis:// URL with a port")
    return parts.hostname, parts.port


def _login(url: str) -> dict[str, Any]:
    """What the URL lends every node: user, password and TLS (rediss://)."""
    parts = urlsplit(url)
    login: dict[str, Any] = {}
    if parts.username:
        login["username"] = unquote(parts.username)
    if parts.password:
        login["password"] = unquote(parts.password)
    if parts.scheme == "rediss":
        login["ssl"] = True
    return login


def _redacted(url: str) -> str:
    """The URL without its password, for messages."""
    if "@" not in url:
        return url
    scheme, _, rest = url.partition("://")
    return f"{scheme}://***@{rest.rpartition('@')[2]}"


class AsyncClient:
    """Calls toolhost's tools over Redis from asyncio.

    Each client reads its answers on its own stream `results:<client_id>` (the default
    `[streams] response_topics` allow it), which lives `stream_ttl` seconds past the client's
    last sign of life and is deleted by `close()`. One reader task routes every answer to the
    call waiting for its request id, so any number of calls may be in flight.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        key_prefix: str = "",
        requests_topic: str = "action-requests",
        shards: int = 1,
        client_id: str | None = None,
        source: str = "toolhost-python",
        stream_ttl: float = 60.0,
        default_timeout: float = 300.0,
        retries: int = 0,
        max_connections: int = 64,
        tenant_id: str | None = None,
        user_id: str | None = None,
        session_id: str | None = None,
        trace_id: str | None = None,
        key_id: str | None = None,
        secret: str | bytes | None = None,
        replica_acks: int = 0,
        replica_ack_timeout: float = 1.0,
        cluster_nodes: list[str] | str | None = None,
        sentinels: list[str] | str | None = None,
        sentinel_master: str | None = None,
        sentinel_username: str | None = None,
        sentinel_password: str | None = None,
    ) -> None:
        if (key_id is None) != (secret is None):
            raise ClientError("key_id and secret go together: give both to sign requests, or neither")
        if key_id is not None and not re.fullmatch(r"[^:]{1,64}", key_id):
            raise ClientError(f"key_id {key_id!r} must be 1-64 characters without ':'")
        self._signing = (key_id, secret.encode() if isinstance(secret, str) else secret) if key_id else None
        self.url = url or os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
        self.key_prefix = key_prefix
        self.requests_topic = requests_topic
        if not isinstance(shards, int) or not 1 <= shards <= _wire.MAX_SHARDS:
            raise ClientError(f"shards must be 1 to {_wire.MAX_SHARDS}, as [streams] shards of the daemons; not {shards!r}")
        self.shards = shards
        self.client_id = client_id or f"py-{uuid.uuid4().hex}"
        if not re.fullmatch(r"[A-Za-z0-9_.:-]{1,128}", self.client_id):
            raise ClientError(f"client_id {self.client_id!r} must be 1-128 letters, digits, '-', '_', '.' or ':'")
        self.response_topic = f"results:{self.client_id}"
        self.source = source
        self.stream_ttl = stream_ttl
        self.default_timeout = default_timeout
        self.retries = retries
        self.replica_acks = _check_replica_acks(replica_acks)
        if not replica_ack_timeout > 0:
            raise ClientError(f"replica_ack_timeout must be above 0 seconds, not {replica_ack_timeout!r}")
        self.replica_ack_timeout = replica_ack_timeout
        tags = {"tenant_id": tenant_id, "user_id": user_id, "session_id": session_id, "trace_id": trace_id}
        self._tags = {name: value for name, value in tags.items() if value is not None}
        self._stream_key = key_prefix + self.response_topic
        # Where Redis is, as the daemon's [redis] says it: one server (the URL), a Redis Cluster
        # (`cluster_nodes`, the URL lending its user, password and TLS), or the master the
        # sentinels name (`sentinels`, `sentinel_master`, ...), followed across failovers.
        self.cluster_nodes = _nodes(cluster_nodes, "TOOLHOST__REDIS__CLUSTER_NODES")
        self.sentinels = _nodes(sentinels, "TOOLHOST__REDIS__SENTINELS")
        if self.cluster_nodes and self.sentinels:
            raise ClientError("cluster_nodes and sentinels exclude each other, as in the daemon's [redis]")
        env = os.environ.get
        self.sentinel_master = sentinel_master or env("TOOLHOST__REDIS__SENTINEL_MASTER") or "mymaster"
        # Requests are pipelined (see _send), so a few connections serve any number of calls.
        self._pool: aioredis.ConnectionPool | None = None
        self._cluster: RedisCluster | None = None
        if self.cluster_nodes:
            nodes = [ClusterNode(*_host_port(node, "cluster node")) for node in self.cluster_nodes]
            self._cluster = RedisCluster(startup_nodes=nodes, max_connections=max_connections, **_login(self.url))
            self._redis: Any = self._cluster
        elif self.sentinels:
            watchers = [_host_port(node, "sentinel") for node in self.sentinels]
            login = {
                "username": sentinel_username or env("TOOLHOST__REDIS__SENTINEL_USERNAME") or None,
                "password": sentinel_password or env("TOOLHOST__REDIS__SENTINEL_PASSWORD") or None,
            }
            sentinel_login: dict[str, Any] = {name: value for name, value in login.items() if value}
            if any(node.startswith("rediss://") for node in self.sentinels):
                sentinel_login["ssl"] = True
            watched = Sentinel(  # type: ignore[no-untyped-call]
                watchers, sentinel_kwargs=sentinel_login, max_connections=max_connections, **_login(self.url)
            )
            self._redis = watched.master_for(self.sentinel_master)
        else:
            self._pool = aioredis.ConnectionPool.from_url(self.url, max_connections=max_connections)
            self._redis = aioredis.Redis(connection_pool=self._pool)
        # Request id to the calls (and discoveries) waiting for its answer.
        self._calls: dict[str, list[_Waiter]] = {}
        # Request id to the cancels waiting for their answer.
        self._cancels: dict[str, list[_Waiter]] = {}
        # `<request id> <input id>` to the inputs waiting for their answer.
        self._inputs: dict[str, list[_Waiter]] = {}
        # The calls' on_input tasks that have not ended.
        self._questions: set[asyncio.Task[None]] = set()
        self._tasks: list[asyncio.Task[None]] = []
        # Requests waiting for the next pipeline (key, fields, replicas that must acknowledge
        # it, and who waits for the XADD's outcome), and whether one is being sent.
        self._outbox: list[tuple[str, dict[str, str], int, asyncio.Future[None]]] = []
        self._flushing = False
        self._flusher: asyncio.Future[None] | None = None
        self._open_lock: asyncio.Lock | None = None
        self._opened = False
        self._closed = False
        self._last_id = b"0-0"

    # -- lifecycle -----------------------------------------------------------------------------

    async def open(self) -> AsyncClient:
        """Checks Redis, creates the private stream and starts its reader. Calls do this on
        their own; call it to see a bad URL or password at once."""
        if self._closed:
            raise ClientClosed("this client is closed")
        if self._opened:
            return self
        if self._open_lock is None:
            self._open_lock = asyncio.Lock()
        async with self._open_lock:
            if self._opened:
                return self
            try:
                await self._redis.ping()
                opened = _wire.to_json({"id": _wire.new_id(), "type": "client.opened", "time": _wire.now_rfc3339()}, "")
                self._last_id = await self._redis.xadd(self._stream_key, {"id": _wire.new_id(), "payload": opened})
                await self._redis.expire(self._stream_key, max(1, round(self.stream_ttl)))
            except redis_errors.AuthenticationError as err:
                raise ConnectionFailed(f"Redis at {_redacted(self.url)} refused the login: {err}") from err
            except redis_errors.ResponseError as err:
                if "NOAUTH" in str(err) or "WRONGPASS" in str(err) or "NOPERM" in str(err):
                    raise ConnectionFailed(f"Redis at {_redacted(self.url)} refused the login: {err}") from err
                raise ConnectionFailed(f"Redis at {_redacted(self.url)} refused the client: {err}") from err
            except (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError) as err:
                raise ConnectionFailed(f"cannot reach Redis at {_redacted(self.url)}: {err}") from err
            self._tasks = [
                asyncio.create_task(self._read(), name="toolhost-reader"),
                asyncio.create_task(self._keep_alive(), name="toolhost-keepalive"),
            ]
            self._opened = True
        return self

    async def close(self) -> None:
        """Stops the reader, fails the calls still waiting with ClientClosed, and deletes the
        private stream. Closing twice is fine."""
        if self._closed:
            return
        self._closed = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
        for question in list(self._questions):
            question.cancel()
        for waiters in (*self._calls.values(), *self._cancels.values(), *self._inputs.values()):
            for waiter in waiters:
                if not waiter.future.done():
                    waiter.future.set_exception(ClientClosed("the client was closed while the call waited"))
        if self._opened:
            try:
                await self._redis.delete(self._stream_key)
            except redis_errors.RedisError as err:
                log.warning("cannot delete %s (it expires in %g s): %s", self._stream_key, self.stream_ttl, err)
        await self._redis.aclose()
        if self._pool is not None:
            await self._pool.aclose()

    async def __aenter__(self) -> AsyncClient:
        return await self.open()

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    # -- calls ---------------------------------------------------------------------------------

    async def call(
        self,
        tool: str,
        arguments: dict[str, Any] | None = None,
        *,
        timeout: float | None = None,
        request_id: str | None = None,
        retries: int | None = None,
        correlation_id: str | None = None,
        on_progress: Callable[[Progress], None] | None = None,
        replica_acks: int | None = None,
        traceparent: str | None = None,
        tracestate: str | None = None,
        on_log: Callable[[LogEntry], None] | None = None,
        on_input: OnInput | None = None,
    ) -> Any:
        """Calls `tool` and returns its result, or raises the answer's ToolError. `call_reply`
        returns the content blocks (images, audio, resources) beside the result.

        `timeout` (seconds) is sent as `timeout_ms`: the host answers `timeout` or `expired`
        when it passes. Without it the tool's own timeout applies and the client waits up to
        `default_timeout`. NoAnswer is raised when nothing answers in time. `request_id` makes
        the call idempotent: the host never runs one id twice. `retries` (default: the
        client's) sends the same request again after an `overloaded`, `internal` or `expired`
        answer or no answer, with backoff; final answers are never retried. `on_progress` gets
        the call's progress entries, on the client's event loop. `replica_acks` (default: the
        client's) makes the request wait, after its XADD and on the same connection, until that
        many Redis replicas have it (`WAIT`, up to `replica_ack_timeout`), and raises
        RequestNotReplicated when fewer did: a failover could then lose the request (it may
        also still be answered). With `retries` the request is sent again, same id, instead.
        Each request carries W3C trace context: with `opentelemetry-api` installed, that of a
        PRODUCER span `send <topic>` under the current span (or under `traceparent` when given);
        without it, `traceparent` and `tracestate` as given.
        """
        reply = await self.call_reply(
            tool,
            arguments,
            timeout=timeout,
            request_id=request_id,
            retries=retries,
            correlation_id=correlation_id,
            on_progress=on_progress,
            replica_acks=replica_acks,
            traceparent=traceparent,
            tracestate=tracestate,
            on_log=on_log,
            on_input=on_input,
        )
        return reply.result

    async def call_reply(
        self,
        tool: str,
        arguments: dict[str, Any] | None = None,
        *,
        timeout: float | None = None,
        request_id: str | None = None,
        retries: int | None = None,
        correlation_id: str | None = None,
        on_progress: Callable[[Progress], None] | None = None,
        replica_acks: int | None = None,
        traceparent: str | None = None,
        tracestate: str | None = None,
        on_log: Callable[[LogEntry], None] | None = None,
        on_input: OnInput | None = None,
    ) -> Reply:
        """`call`, returning the whole answer: the result and the tool's content blocks as typed
        objects (ImageBlock, AudioBlock, ResourceLink, EmbeddedResource, TextBlock). `on_log` gets
        the call's log entries (a hosted MCP server's log messages), on the client's event loop.

        `on_input` answers the call's questions (a hosted MCP server's elicitation or sampling
        request, as an InputRequest): a plain function runs on a worker thread (it may block, say
        to prompt a person), a coroutine function on the client's event loop. It returns the MCP
        `ElicitResult` (`{"action": "accept", "content": {...}}`) or `CreateMessageResult` as a
        dict, or None to decline; the answer goes back as a `tool.input`. An answer the host
        refuses (content that breaks the question's `requestedSchema`) is logged, and a decline
        is sent instead. Without `on_input` the call's questions are left to the host, which
        declines them at the call's deadline."""
        _wire.check_tool_name(tool)
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise ClientError(f"arguments must be a dict (a JSON object), not {type(arguments).__name__}")
        rid = _wire.check_request_id(request_id) if request_id is not None else _wire.new_id()
        millis = _wire.timeout_ms(timeout)
        data: dict[str, Any] = {"request_id": rid, "tool": tool, "arguments": arguments}
        if millis is not None:
            data["timeout_ms"] = millis
        # Refused here, before anything is sent: arguments that are not JSON.
        fields = self._entry("tool.invoke", data, rid, correlation_id)
        wait = (timeout if timeout is not None else self.default_timeout) + ANSWER_MARGIN
        attempts = 1 + max(0, self.retries if retries is None else retries)
        acks = self.replica_acks if replica_acks is None else _check_replica_acks(replica_acks)
        await self.open()
        loop = asyncio.get_running_loop()
        waiter = _Waiter(loop.create_future(), on_progress, on_log, on_input)
        self._calls.setdefault(rid, []).append(waiter)
        try:
            for attempt in range(attempts):
                last = attempt == attempts - 1
                if attempt > 0:
                    waiter.future = loop.create_future()
                try:
                    with _otel.send_span(self.requests_topic, tool, rid, traceparent, tracestate) as trace_fields:
                        fields = self._entry("tool.invoke", data, rid, correlation_id, trace_fields)
                        await self._send(self._requests_key("tool.invoke", data), fields, acks)
                except RequestNotReplicated as err:
                    if last:
                        raise RequestNotReplicated(rid, err.acked, err.wanted, err.waited) from None
                    await asyncio.sleep(self._backoff(attempt, None))
                    continue
                except (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError) as err:
                    if last:
                        raise ConnectionFailed(f"cannot send the call of '{tool}' to Redis: {err}") from err
                    await asyncio.sleep(self._backoff(attempt, None))
                    continue
                try:
                    answer = await asyncio.wait_for(waiter.future, wait)
                except asyncio.TimeoutError:
                    if last:
                        raise NoAnswer(rid, wait, tool) from None
                    await asyncio.sleep(self._backoff(attempt, None))
                    continue
                if answer.data.get("success") is True:
                    return Reply(answer.data.get("result"), parse_blocks(answer.data.get("content")))
                error = error_from(answer.data, rid)
                if last or error.code not in RETRIED_CODES:
                    raise error
                await asyncio.sleep(self._backoff(attempt, error))
            raise AssertionError("every attempt returns, raises or continues")  # pragma: no cover
        finally:
            self._forget(self._calls, rid, waiter)

    async def stream(
        self,
        tool: str,
        arguments: dict[str, Any] | None = None,
        *,
        timeout: float | None = None,
        request_id: str | None = None,
        retries: int | None = None,
        correlation_id: str | None = None,
        replica_acks: int | None = None,
    ) -> AsyncGenerator[Progress | LogEntry | Finished, None]:
        """Calls `tool` and yields its progress and log entries, then Finished with the result
        and content blocks; an error answer is raised. Takes the same arguments as `call`."""
        rid = _wire.check_request_id(request_id) if request_id is not None else _wire.new_id()
        events: asyncio.Queue[Progress | LogEntry] = asyncio.Queue()
        call = asyncio.ensure_future(
            self.call_reply(
                tool,
                arguments,
                timeout=timeout,
                request_id=rid,
                retries=retries,
                correlation_id=correlation_id,
                on_progress=events.put_nowait,
                replica_acks=replica_acks,
                on_log=events.put_nowait,
            )
        )
        try:
            while True:
                getter = asyncio.ensure_future(events.get())
                await asyncio.wait({call, getter}, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    yield getter.result()
                    continue
                getter.cancel()
                while not events.empty():
                    yield events.get_nowait()
                reply = call.result()
                yield Finished(rid, reply.result, reply.content)
                return
        finally:
            if not call.done():
                call.cancel()

    async def cancel(self, request_id: str, *, timeout: float = 5.0) -> str:
        """Asks the host to cancel the call `request_id` (the wire's `tool.cancel`) and returns
        what it did: `cancelling` (the call's `cancelled` answer follows), `answered` (it had
        already ended) or `unknown`."""
        rid = _wire.check_request_id(request_id)
        answer = await self._ask("tool.cancel", {"request_id": rid}, rid, self._cancels, timeout)
        return _state_of(answer, rid, "tool.cancel", timeout)

    async def answer_input(
        self, request_id: str, input_id: str, response: dict[str, Any], *, timeout: float = 5.0
    ) -> str:
        """Answers the question `input_id` of the call `request_id` (the wire's `tool.input`) with
        an MCP `ElicitResult` or `CreateMessageResult` (a dict) and returns what the host did:
        `accepted`, or `unknown` when no call waits for that question (never asked, answered
        already, or past its deadline). Raises InvalidArguments for a response that breaks the
        question's `requestedSchema` (the question keeps waiting)."""
        rid = _wire.check_request_id(request_id)
        if not isinstance(input_id, str) or not input_id:
            raise ClientError("input_id must be a non-empty string")
        if not isinstance(response, dict):
            raise ClientError(f"response must be a dict (a JSON object), not {type(response).__name__}")
        data = {"request_id": rid, "input_id": input_id, "response": response}
        answer = await self._ask("tool.input", data, f"{rid} {input_id}", self._inputs, timeout, rid)
        return _state_of(answer, rid, "tool.input", timeout)

    async def _answer_question(self, on_input: OnInput, question: InputRequest) -> None:
        """Asks `on_input` and sends its answer; a failing callback or a refused answer is
        logged and declined."""
        try:
            if asyncio.iscoroutinefunction(on_input):
                response = await on_input(question)
            else:
                response = await asyncio.get_running_loop().run_in_executor(None, on_input, question)
                if inspect.isawaitable(response):
                    response = await response
        except Exception:  # noqa: BLE001 - the callback is the caller's; its failure declines
            log.exception("on_input failed for question %s of %s; declined", question.input_id, question.request_id)
            response = None
        if response is None:
            response = _wire.declined(question.kind)
        try:
            state = await self.answer_input(question.request_id, question.input_id, response)
        except InvalidArguments as err:
            log.warning("the answer to question %s was refused (%s); declined", question.input_id, err)
            state = await self.answer_input(question.request_id, question.input_id, _wire.declined(question.kind))
        if state != "accepted":
            log.info("the answer to question %s of %s was %s", question.input_id, question.request_id, state)

    async def tools(self, format: str = "native", *, timeout: float = 5.0) -> list[dict[str, Any]]:
        """The tools of every live toolbox, in a discovery format (`native`, `openai`, `mcp`,
        `toolbox` or `capabilities`), each name once."""
        if format not in ("native", "openai", "mcp", "toolbox", "capabilities"):
            raise ClientError(f"unknown discovery format {format!r}")
        await self.open()
        toolboxes = await self._live_toolboxes()
        answers = await asyncio.gather(
            *(self._discover(format, toolbox, timeout) for toolbox in sorted(toolboxes))
        )
        seen: set[str] = set()
        listed: list[dict[str, Any]] = []
        for tools in answers:
            for tool in tools:
                name = _tool_name(tool)
                if name not in seen:
                    seen.add(name)
                    listed.append(tool)
        return sorted(listed, key=_tool_name)

    async def list_resources(self) -> list[dict[str, Any]]:
        """The hosted MCP servers' resources (MCP `Resource` objects) every live toolbox
        publishes, sorted by URI; a URI two toolboxes publish once, as the smaller toolbox id
        published it."""
        return await self._catalog("resource")

    async def list_resource_templates(self) -> list[dict[str, Any]]:
        """The hosted MCP servers' resource templates (MCP `ResourceTemplate` objects), as
        `list_resources` lists resources."""
        return await self._catalog("template")

    async def list_prompts(self) -> list[dict[str, Any]]:
        """The hosted MCP servers' prompts (MCP `Prompt` objects, named `<prefix><name>`), as
        `list_resources` lists resources."""
        return await self._catalog("prompt")

    async def read_resource(self, uri: str, *, timeout: float = 30.0) -> dict[str, Any]:
        """Reads a hosted MCP server's resource (`resources.read`), routed to the toolbox that
        lists `uri` (or a template matching it): MCP's `ReadResourceResult`, whose `contents`
        hold `text` or base64 `blob`. Raises the answer's ToolError (`InvalidArguments` for a
        URI no toolbox lists), or NoAnswer after `timeout` seconds."""
        return await self._catalog_request("resources.read", {"uri": uri}, timeout)

    async def get_prompt(
        self, name: str, arguments: dict[str, str] | None = None, *, timeout: float = 30.0
    ) -> dict[str, Any]:
        """Gets a hosted MCP server's prompt by its prefixed name (`prompts.get`): MCP's
        `GetPromptResult` (`messages`, `description`). Raises as `read_resource` does."""
        data: dict[str, Any] = {"name": name}
        if arguments is not None:
            data["arguments"] = arguments
        return await self._catalog_request("prompts.get", data, timeout)

    async def complete(
        self,
        ref: dict[str, Any],
        argument: dict[str, Any],
        *,
        context: dict[str, Any] | None = None,
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        """Asks the hosted MCP server that lists `ref` (`{"type": "ref/prompt", "name"}` or
        `{"type": "ref/resource", "uri"}`) to complete `argument` (`{"name", "value"}`)
        (`completion.complete`): MCP's `CompleteResult` (`completion.values`, `total`,
        `hasMore`). Raises as `read_resource` does."""
        data: dict[str, Any] = {"ref": ref, "argument": argument}
        if context is not None:
            data["context"] = context
        return await self._catalog_request("completion.complete", data, timeout)

    async def _catalog_request(self, event_type: str, data: dict[str, Any], timeout: float) -> dict[str, Any]:
        rid = _wire.new_id()
        data = {**data, "request_id": rid, "timeout_ms": max(1, int(timeout * 1000))}
        answer = await self._ask(event_type, data, rid, self._calls, timeout + 2.0)
        if answer is None:
            raise NoAnswer(rid, timeout, event_type)
        if answer.data.get("success") is not True:
            raise error_from(answer.data, rid)
        result = answer.data.get("result")
        return result if isinstance(result, dict) else {}

    async def _catalog(self, kind: str) -> list[dict[str, Any]]:
        await self.open()
        prefix = f"{kind}:"
        listed: dict[str, dict[str, Any]] = {}
        for toolbox in sorted(await self._live_toolboxes()):
            fields: dict[bytes, bytes] = await self._redis.hgetall(f"{self.key_prefix}toolhost:catalog:{toolbox}")
            for field, value in fields.items():
                key = field.decode()
                if not key.startswith(prefix) or key in listed:
                    continue
                try:
                    item = json.loads(value)
                except ValueError:
                    continue
                if isinstance(item, dict):
                    listed[key] = item
        return [listed[key] for key in sorted(listed)]

    async def send(
        self,
        recipient: str,
        content: str,
        *,
        conversation_id: str | None = None,
        sender: str = "agent:python",
        metadata: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Sends a chat message as the daemon's `chat_send` writes it: on
        `chat:<conversation_id>`, and also on `chat:<Name>` for an agent. A bare name is an
        agent (`"Alice"` is `agent:Alice`); without a conversation id a new one is made."""
        if not isinstance(content, str) or not content.strip():
            raise ClientError("content must be non-empty")
        if not recipient.startswith(("agent:", "chat:")):
            recipient = f"agent:{recipient}"
        kind, _, name = recipient.partition(":")
        if not name.strip():
            raise ClientError("recipient must be 'chat:{conversation_id}' or 'agent:{Name}'")
        conversation = name if kind == "chat" else (conversation_id or _wire.new_id())
        envelope_id = _wire.new_id()
        envelope = {
            "id": envelope_id,
            "conversation_id": conversation,
            "sender": sender,
            "recipient": recipient,
            "type": "message",
            "content": content,
            "metadata": metadata or {},
            "created_at": _wire.now_rfc3339(),
        }
        payload = _wire.to_json(envelope, "the message")
        await self.open()
        topics = [f"{self.key_prefix}chat:{conversation}"]
        if kind == "agent":
            topics.append(f"{self.key_prefix}chat:{name}")
        for topic in topics:
            await self._redis.xadd(topic, {"id": envelope_id, "payload": payload})
        return {"envelope_id": envelope_id, "conversation_id": conversation, "published_to": topics}

    # -- inside ----------------------------------------------------------------------------------

    def _entry(
        self,
        event_type: str,
        data: dict[str, Any],
        rid: str,
        correlation_id: str | None,
        trace_fields: dict[str, str] | None = None,
    ) -> dict[str, str]:
        """The fields of a request entry: `id`, `payload`, and `sig` when the client signs."""
        envelope_id, payload = _wire.request_entry(
            event_type,
            data,
            source=self.source,
            topic=self._shard(event_type, data),
            response_topic=self.response_topic,
            correlation_id=correlation_id if correlation_id is not None else rid,
            tags={**self._tags, **(trace_fields or {})},
        )
        fields = {"id": envelope_id, "payload": payload}
        if self._signing is not None:
            key_id, secret = self._signing
            assert secret is not None
            fields["sig"] = _wire.sign(key_id, secret, payload)
        return fields

    async def _publish(self, event_type: str, data: dict[str, Any], rid: str, correlation_id: str | None) -> None:
        await self._send(self._requests_key(event_type, data), self._entry(event_type, data, rid, correlation_id))

    def _shard(self, event_type: str, data: dict[str, Any]) -> str:
        """The bare name of the shard of the requests stream a request goes to (`shards` of
        them, as `[streams] shards` of the daemons), by the shard rule of docs/CONTRACTS.md."""
        request_id = data.get("request_id")
        rid = request_id if isinstance(request_id, str) else None
        return _wire.shard_stream(self.requests_topic, self.shards, event_type, rid)

    def _requests_key(self, event_type: str, data: dict[str, Any]) -> str:
        """The key of the shard a request goes to."""
        return self.key_prefix + self._shard(event_type, data)

    async def _send(self, key: str, fields: dict[str, str], replica_acks: int = 0) -> None:
        """XADDs `fields` to `key`. Requests sent while a pipeline is on its way wait and go
        out together in the next one, on one connection: one call alone pays one round trip,
        many in flight share them. With `replica_acks`, the pipeline ends in one `WAIT` for the
        most replicas any of its requests asks for (it counts every write of the pipeline's
        connection), and a request fewer replicas acknowledged raises RequestNotReplicated."""
        sent: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._outbox.append((key, fields, replica_acks, sent))
        if not self._flushing:
            self._flushing = True
            try:
                await self._flush_once()
            finally:
                if self._outbox:
                    self._flusher = asyncio.ensure_future(self._flush())
                else:
                    self._flushing = False
        await sent

    async def _flush(self) -> None:
        try:
            while self._outbox:
                await self._flush_once()
        finally:
            self._flushing = False

    async def _flush_once(self) -> None:
        batch, self._outbox = self._outbox, []
        wanted = max(acks for _, _, acks, _ in batch)
        try:
            if len(batch) == 1 and wanted == 0:
                key, fields, _, _ = batch[0]
                results: list[Any] = [await self._redis.xadd(key, fields)]
            else:
                # One connection for the XADDs and the WAIT after them: WAIT counts the replicas
                # that have this connection's writes.
                async with self._redis.pipeline(transaction=False) as pipe:
                    for key, fields, _, _ in batch:
                        pipe.xadd(key, fields)
                    if wanted > 0:
                        wait = ("WAIT", wanted, max(1, round(self.replica_ack_timeout * 1000)))
                        if self._cluster is None:
                            pipe.execute_command(*wait)
                        else:
                            # A cluster pipeline sends each node's commands on one connection:
                            # a WAIT to each node written to counts its XADDs' replicas.
                            nodes: dict[str, ClusterNode] = {}
                            for key, _, _, _ in batch:
                                node = self._cluster.get_node_from_key(key)
                                if node is not None:
                                    nodes[node.name] = node
                            for node in nodes.values():
                                pipe.execute_command(*wait, target_nodes=node)
                    results = await pipe.execute(raise_on_error=False)
                if wanted > 0 and self._cluster is not None:
                    # The fewest replicas any node written to acknowledged.
                    waits = results[len(batch):]
                    results = results[: len(batch)] + [min((w for w in waits if isinstance(w, int)), default=0)]
        except BaseException as err:
            failure = err if isinstance(err, (redis_errors.RedisError, OSError)) else redis_errors.ConnectionError(str(err))
            for _, _, _, sent in batch:
                if not sent.done():
                    sent.set_exception(failure)
            if not isinstance(err, (redis_errors.RedisError, OSError)):
                raise
            return
        acked = results[-1] if wanted > 0 else 0
        for (_, _, acks, sent), result in zip(batch, results):
            if sent.done():
                continue
            if isinstance(result, BaseException):
                sent.set_exception(result)
            elif acks > 0 and isinstance(acked, BaseException):
                sent.set_exception(acked)
            elif acks > 0 and int(acked) < acks:
                # The request id is filled in by the call that sent it.
                sent.set_exception(RequestNotReplicated("", int(acked), acks, self.replica_ack_timeout))
            else:
                sent.set_result(None)

    async def _ask(
        self,
        event_type: str,
        data: dict[str, Any],
        rid: str,
        waiters: dict[str, list[_Waiter]],
        timeout: float,
        request_id: str | None = None,
    ) -> Answer | None:
        """Publishes a request that is not a call (a cancel, an input, a discovery) and waits
        for its answer, filed under `rid` among `waiters`; None when none came in `timeout`
        seconds. `request_id` is the request's when it is not `rid`."""
        await self.open()
        waiter = _Waiter(asyncio.get_running_loop().create_future(), None)
        waiters.setdefault(rid, []).append(waiter)
        try:
            await self._publish(event_type, data, request_id or rid, None)
            try:
                return await asyncio.wait_for(waiter.future, timeout)
            except asyncio.TimeoutError:
                return None
        finally:
            self._forget(waiters, rid, waiter)

    async def _discover(self, format: str, toolbox: str, timeout: float) -> list[dict[str, Any]]:
        rid = _wire.new_id()
        data = {"request_id": rid, "format": format, "toolbox_id": toolbox}
        answer = await self._ask("tools.discover", data, rid, self._calls, timeout)
        # No answer: a toolbox that died since its heartbeat.
        if answer is None or answer.data.get("success") is not True:
            return []
        result = answer.data.get("result")
        tools = result.get("tools") if isinstance(result, dict) else None
        return [tool for tool in tools if isinstance(tool, dict)] if isinstance(tools, list) else []

    async def _live_toolboxes(self) -> set[str]:
        members: set[bytes] = await self._redis.smembers(f"{self.key_prefix}toolhost:fleet")
        if not members:
            return set()
        # The heartbeats live in slots of their own on a cluster: one MGET per node.
        get = self._cluster.mget_nonatomic if self._cluster is not None else self._redis.mget
        beats = await get(sorted(members))
        toolboxes: set[str] = set()
        for beat in beats:
            if beat is None:
                continue
            try:
                toolbox = json.loads(beat).get("toolbox_id")
            except (ValueError, AttributeError):
                continue
            if isinstance(toolbox, str):
                toolboxes.add(toolbox)
        return toolboxes

    async def _read(self) -> None:
        """The one reader: XREAD BLOCK on the private stream, each entry to its waiters. A lost
        connection is retried with backoff, from the last entry read, so nothing is missed."""
        failures = 0
        while not self._closed:
            try:
                replies = await self._redis.xread({self._stream_key: self._last_id}, count=READ_COUNT, block=READ_BLOCK_MS)
                failures = 0
            except asyncio.CancelledError:
                raise
            except (redis_errors.RedisError, OSError) as err:
                failures += 1
                delay = min(2.0, 0.05 * 2 ** min(failures, 6))
                if failures in (1, 10) or failures % 100 == 0:
                    log.warning("reading %s failed (%s); retrying in %.2f s", self._stream_key, err, delay)
                await asyncio.sleep(delay)
                continue
            for _, entries in replies or []:
                for entry_id, fields in entries:
                    self._last_id = entry_id
                    self._route(fields)

    def _route(self, fields: dict[bytes, bytes]) -> None:
        answer = _wire.parse_entry(fields)
        if answer is None:
            return
        if answer.kind == "progress":
            progress = None
            for waiter in self._calls.get(answer.request_id, ()):
                if waiter.on_progress is not None:
                    progress = progress or _wire.progress_of(answer)
                    waiter.on_progress(progress)
            return
        if answer.kind == "log":
            entry = _wire.log_of(answer)
            for waiter in self._calls.get(answer.request_id, ()):
                if waiter.on_log is not None:
                    waiter.on_log(entry)
            return
        if answer.kind == "input":
            self._ask_caller(answer)
            return
        if answer.kind == "input_answer":
            self._route_input_answer(answer)
            return
        for waiter in (self._cancels if answer.kind == "cancel" else self._calls).get(answer.request_id, ()):
            if not waiter.future.done():
                waiter.future.set_result(answer)

    def _ask_caller(self, answer: Answer) -> None:
        """Hands a call's question to its `on_input`, on a task of its own."""
        question = _wire.input_of(answer)
        on_input = next((w.on_input for w in self._calls.get(answer.request_id, ()) if w.on_input), None)
        if question is None or on_input is None:
            return
        task = asyncio.ensure_future(self._answer_question(on_input, question))
        self._questions.add(task)
        task.add_done_callback(self._questions.discard)

    def _route_input_answer(self, answer: Answer) -> None:
        """Hands a `tool.input`'s answer to the input waiting for it: by its input id, else (a
        refusal that names none) to the call's one waiting input."""
        data = answer.data
        result, details = data.get("result"), data.get("details")
        input_id = (result if isinstance(result, dict) else details if isinstance(details, dict) else {}).get("input_id")
        keys = [f"{answer.request_id} {input_id}"] if isinstance(input_id, str) else []
        if not keys or keys[0] not in self._inputs:
            keys = [key for key in self._inputs if key.split(" ", 1)[0] == answer.request_id][:1]
        for key in keys:
            for waiter in self._inputs.get(key, ()):
                if not waiter.future.done():
                    waiter.future.set_result(answer)

    async def _keep_alive(self) -> None:
        """Refreshes the private stream's TTL while the client lives."""
        period = max(0.5, self.stream_ttl / 3)
        while not self._closed:
            await asyncio.sleep(period)
            try:
                await self._redis.expire(self._stream_key, max(1, round(self.stream_ttl)))
            except (redis_errors.RedisError, OSError):
                pass  # the reader reports the outage

    @staticmethod
    def _forget(waiters: dict[str, list[_Waiter]], rid: str, waiter: _Waiter) -> None:
        listed = waiters.get(rid)
        if listed is not None:
            listed.remove(waiter)
            if not listed:
                del waiters[rid]

    @staticmethod
    def _backoff(attempt: int, error: ToolError | None) -> float:
        backoff = float(min(5.0, 0.1 * 2**attempt))
        if isinstance(error, Overloaded) and error.retry_after is not None:
            return min(30.0, max(backoff, error.retry_after))
        return backoff


def _state_of(answer: Answer | None, rid: str, what: str, timeout: float) -> str:
    """The `state` of a cancel's or an input's answer; NoAnswer when none came, the answer's
    ToolError when it is one."""
    if answer is None:
        raise NoAnswer(rid, timeout, what)
    if answer.data.get("success") is not True:
        raise error_from(answer.data, rid)
    result = answer.data.get("result")
    return str(result.get("state")) if isinstance(result, dict) else "unknown"


def _check_replica_acks(replica_acks: int) -> int:
    """`replica_acks` when it is a whole number from 0 to 16, else ClientError."""
    if isinstance(replica_acks, bool) or not isinstance(replica_acks, int) or not 0 <= replica_acks <= 16:
        raise ClientError(f"replica_acks must be a whole number from 0 to 16, not {replica_acks!r}")
    return replica_acks


class _Waiter:
    """A call, cancel or discovery waiting for its answer."""

    __slots__ = ("future", "on_input", "on_log", "on_progress")

    def __init__(
        self,
        future: asyncio.Future[Answer],
        on_progress: Callable[[Progress], None] | None,
        on_log: Callable[[LogEntry], None] | None = None,
        on_input: OnInput | None = None,
    ) -> None:
        self.future = future
        self.on_progress = on_progress
        self.on_log = on_log
        self.on_input = on_input


def _tool_name(tool: dict[str, Any]) -> str:
    """A tool's name in any discovery format."""
    for key in ("name", "task_name"):
        if isinstance(tool.get(key), str):
            return str(tool[key])
    function = tool.get("function")
    if isinstance(function, dict) and isinstance(function.get("name"), str):
        return str(function["name"])
    return ""
