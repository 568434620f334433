"""The callers of the telemetry tests, each with the OpenTelemetry SDK exporting its spans over
OTLP/HTTP (to OTEL_EXPORTER_OTLP_ENDPOINT) as service `caller`. Each prints one JSON line.

    callers.py mcp <url> <tool> <arguments JSON>
        The MCP Python SDK's client calls the tool through toolhost's MCP door (streamable HTTP)
        inside a span `caller`; the SDK's client puts the context in `params._meta`.
    callers.py redis <redis url> <tool> <arguments JSON>
        toolhost's Python client calls the tool over Redis inside a span `caller`; the client
        makes the PRODUCER span `send action-requests` and sets the request's `traceparent`.
    callers.py raw-mcp <url> <tool> <traceparent> [task]
        No SDK span: one tools/call over plain HTTP whose `_meta.traceparent` is given as is
        (garbage, for the tests), printing the answer. With `task`, the client declares the
        tasks extension (protocol 2025-11-25), so the door may answer with a task.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

provider = TracerProvider(resource=Resource.create({"service.name": "caller"}))
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("telemetry-test-caller")


def done(report: dict[str, Any]) -> None:
    provider.force_flush()
    print(json.dumps(report), flush=True)


def structured(result: Any) -> Any:
    if result.structured_content is not None:
        return result.structured_content
    return "\n".join(block.text for block in result.content if getattr(block, "type", "") == "text")


async def mcp_call(url: str, tool: str, arguments: str) -> None:
    from mcp.client.client import Client

    with tracer.start_as_current_span("caller") as span:
        trace_id = format(span.get_span_context().trace_id, "032x")
        async with Client(url, cache=None) as client:
            result = await client.call_tool(tool, json.loads(arguments), read_timeout_seconds=30)
    done({"trace_id": trace_id, "error": result.is_error, "result": structured(result)})


async def redis_call(url: str, tool: str, arguments: str) -> None:
    from toolhost import AsyncClient

    with tracer.start_as_current_span("caller") as span:
        trace_id = format(span.get_span_context().trace_id, "032x")
        async with AsyncClient(url) as client:
            result = await client.call(tool, json.loads(arguments), timeout=30)
    done({"trace_id": trace_id, "result": result})


async def raw_mcp_call(url: str, tool: str, traceparent: str, task: str = "") -> None:
    import httpx2 as httpx

    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    version = "2025-11-25" if task == "task" else "2025-06-18"
    capabilities = {"extensions": {"io.modelcontextprotocol/tasks": {}}} if task == "task" else {}
    async with httpx.AsyncClient(timeout=30) as http:
        init = {
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": version, "capabilities": capabilities, "clientInfo": {"name": "raw", "version": "1"}},
        }
        response = await http.post(url, json=init, headers=headers)
        session = response.headers.get("mcp-session-id")
        if session:
            headers["mcp-session-id"] = session
        headers["mcp-protocol-version"] = version
        await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
        call = {
            "jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": tool, "arguments": {}, "_meta": {"traceparent": traceparent}},
        }
        response = await http.post(url, json=call, headers=headers)
        text = response.text
    # A JSON body, or one SSE event holding it.
    body = text if text.lstrip().startswith("{") else next(
        line[len("data:"):] for line in text.splitlines() if line.startswith("data:") and '"id":2' in line.replace(" ", "")
    )
    done({"answer": json.loads(body)})


def main() -> None:
    kind, *args = sys.argv[1:]
    if kind == "mcp":
        asyncio.run(mcp_call(*args))
    elif kind == "redis":
        asyncio.run(redis_call(*args))
    elif kind == "raw-mcp":
        asyncio.run(raw_mcp_call(*args))
    else:
        raise SystemExit(f"unknown caller {kind}")


if __name__ == "__main__":
    main()
