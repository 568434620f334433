"""Client: the blocking face of AsyncClient, which runs on an event loop thread of its own."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar

from . import _otel
from ._aio import AsyncClient, OnInput
from ._content import Reply
from ._errors import ClientClosed
from ._wire import Finished, LogEntry, Progress

T = TypeVar("T")


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


class Client:
    """Calls toolhost's tools over Redis, blocking. Takes AsyncClient's arguments; the URL
    defaults to `REDIS_URL`. Safe to use from several threads; close it (or use `with`)."""

    def __init__(self, url: str | None = None, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="toolhost-client", daemon=True)
        self._thread.start()
        self._closed = False
        try:
            self._client: AsyncClient = self._run(self._open(url, options))
        except BaseException:
            self._stop_loop()
            raise

    @staticmethod
    async def _open(url: str | None, options: dict[str, Any]) -> AsyncClient:
        client = AsyncClient(url, **options)
        try:
            return await client.open()
        except BaseException:
            await client.close()
            raise

    @property
    def client_id(self) -> str:
        return self._client.client_id

    @property
    def response_topic(self) -> str:
        return self._client.response_topic

    def _run(self, coroutine: Coroutine[Any, Any, T] | Awaitable[T]) -> T:
        if self._closed:
            if isinstance(coroutine, Coroutine):
                coroutine.close()
            raise ClientClosed("this client is closed")
        return asyncio.run_coroutine_threadsafe(_awaited(coroutine), self._loop).result()

    def call(
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
        """AsyncClient.call, blocking; `on_progress` runs on the client's thread, a plain
        `on_input` on a worker thread (it may block to prompt a person). The caller's
        current span (when OpenTelemetry is installed) is the request's parent unless
        `traceparent` is given."""
        if traceparent is None:
            traceparent, tracestate = _otel.current()
        return self._run(
            self._client.call(
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
        )

    def call_reply(
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
        on_log: Callable[[LogEntry], None] | None = None,
        on_input: OnInput | None = None,
    ) -> Reply:
        """AsyncClient.call_reply, blocking: the result and the content blocks."""
        return self._run(
            self._client.call_reply(
                tool,
                arguments,
                timeout=timeout,
                request_id=request_id,
                retries=retries,
                correlation_id=correlation_id,
                on_progress=on_progress,
                replica_acks=replica_acks,
                on_log=on_log,
                on_input=on_input,
            )
        )

    def stream(
        self,
        tool: str,
        arguments: dict[str, Any] | None = None,
        *,
        timeout: float | None = None,
        request_id: str | None = None,
        retries: int | None = None,
        correlation_id: str | None = None,
        replica_acks: int | None = None,
    ) -> Iterator[Progress | LogEntry | Finished]:
        """AsyncClient.stream, as a plain iterator."""
        events = self._client.stream(
            tool,
            arguments,
            timeout=timeout,
            request_id=request_id,
            retries=retries,
            correlation_id=correlation_id,
            replica_acks=replica_acks,
        )
        try:
            while True:
                try:
                    yield self._run(events.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            if not self._closed:
                self._run(events.aclose())

    def cancel(self, request_id: str, *, timeout: float = 5.0) -> str:
        """AsyncClient.cancel, blocking."""
        return self._run(self._client.cancel(request_id, timeout=timeout))

    def answer_input(self, request_id: str, input_id: str, response: dict[str, Any], *, timeout: float = 5.0) -> str:
        """AsyncClient.answer_input, blocking."""
        return self._run(self._client.answer_input(request_id, input_id, response, timeout=timeout))

    def tools(self, format: str = "native", *, timeout: float = 5.0) -> list[dict[str, Any]]:
        """AsyncClient.tools, blocking."""
        return self._run(self._client.tools(format, timeout=timeout))

    def list_resources(self) -> list[dict[str, Any]]:
        """AsyncClient.list_resources, blocking."""
        return self._run(self._client.list_resources())

    def list_resource_templates(self) -> list[dict[str, Any]]:
        """AsyncClient.list_resource_templates, blocking."""
        return self._run(self._client.list_resource_templates())

    def list_prompts(self) -> list[dict[str, Any]]:
        """AsyncClient.list_prompts, blocking."""
        return self._run(self._client.list_prompts())

    def read_resource(self, uri: str, *, timeout: float = 30.0) -> dict[str, Any]:
        """AsyncClient.read_resource, blocking."""
        return self._run(self._client.read_resource(uri, timeout=timeout))

    def get_prompt(
        self, name: str, arguments: dict[str, str] | None = None, *, timeout: float = 30.0
    ) -> dict[str, Any]:
        """AsyncClient.get_prompt, blocking."""
        return self._run(self._client.get_prompt(name, arguments, timeout=timeout))

    def complete(
        self,
        ref: dict[str, Any],
        argument: dict[str, Any],
        *,
        context: dict[str, Any] | None = None,
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        """AsyncClient.complete, blocking."""
        return self._run(self._client.complete(ref, argument, context=context, timeout=timeout))

    def send(self, recipient: str, content: str, **options: Any) -> dict[str, Any]:
        """AsyncClient.send, blocking."""
        return self._run(self._client.send(recipient, content, **options))

    def close(self) -> None:
        """Closes the client and its thread. Closing twice is fine."""
        if self._closed:
            return
        try:
            self._run(self._client.close())
        finally:
            self._closed = True
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
