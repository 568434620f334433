"""W3C trace context and OpenTelemetry for the client's calls.

When the `opentelemetry-api` package is installed (the `otel` extra), every request the client
writes gets a PRODUCER span `send <requests topic>` by the messaging conventions toolhost keeps for
Redis Streams (docs/CONTRACTS.md, "Spans"), a child of the caller's current span (or the root of
a new trace), and the request carries that span's context in `traceparent` and `tracestate`; the
toolbox's `process` span is its child and links to it. Without the package, or with no SDK
configured (the API's spans are then not recorded and have no valid context), a `traceparent`
the caller gives is written as given.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

try:
    from opentelemetry import propagate, trace
except ImportError:  # pragma: no cover - the extra is optional
    trace = None  # type: ignore[assignment]
    propagate = None  # type: ignore[assignment]

MESSAGING_SYSTEM = "redis_streams"


@contextmanager
def send_span(topic: str, tool: str, request_id: str, traceparent: str | None, tracestate: str | None) -> Iterator[dict[str, str]]:
    """The trace fields of one request (`traceparent`, `tracestate`), inside its send span when
    OpenTelemetry is installed. A `traceparent` the caller gives is the send span's parent."""
    given = {name: value for name, value in (("traceparent", traceparent), ("tracestate", tracestate)) if value}
    if trace is None or propagate is None:
        yield given
        return
    parent = propagate.extract(given) if given else None
    attributes: dict[str, Any] = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": topic,
        "gen_ai.tool.name": tool,
        "toolhost.request_id": request_id,
    }
    tracer = trace.get_tracer("toolhost-python")
    with tracer.start_as_current_span(f"send {topic}", context=parent, kind=trace.SpanKind.PRODUCER, attributes=attributes) as span:
        carrier: dict[str, str] = {}
        if span.get_span_context().is_valid:
            propagate.inject(carrier)
        else:
            carrier = given
        yield carrier


def current() -> tuple[str | None, str | None]:
    """The caller's current trace context (`traceparent`, `tracestate`), for the blocking client,
    whose calls run on a thread of their own where the caller's context is not current."""
    if propagate is None:
        return None, None
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get("traceparent"), carrier.get("tracestate")
