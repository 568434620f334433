"""An MCP server on the official Python SDK, hosted by toolhost in the telemetry tests, with the
OpenTelemetry SDK exporting its spans over OTLP/HTTP (to OTEL_EXPORTER_OTLP_ENDPOINT).

The SDK's server makes a SERVER span `tools/call <tool>` for every call, parented by the trace
context in the request's `params._meta`; `meta_echo` answers with the `traceparent` and
`tracestate` it found there, so a test can see what toolhost sent.
"""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from pydantic import BaseModel

provider = TracerProvider(resource=Resource.create({"service.name": "traced-mcp-server"}))
# One export per span: the test reads them soon after the call.
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
trace.set_tracer_provider(provider)

server = MCPServer("traced")


class Meta(BaseModel):
    traceparent: str | None
    tracestate: str | None


def meta_field(meta: Any, key: str) -> str | None:
    if meta is None:
        return None
    if isinstance(meta, dict):
        found = meta.get(key)
    else:
        found = getattr(meta, key, None)
        if found is None:
            found = (getattr(meta, "model_extra", None) or {}).get(key)
    return found if isinstance(found, str) else None


@server.tool()
async def meta_echo(ctx: Context) -> Meta:
    """Answers with the trace context the call's `_meta` carried."""
    meta = getattr(ctx.request_context, "meta", None)
    return Meta(traceparent=meta_field(meta, "traceparent"), tracestate=meta_field(meta, "tracestate"))


if __name__ == "__main__":
    server.run("stdio")
