"""An OTLP/HTTP receiver for toolhost's telemetry tests and benchmark, on the official
opentelemetry-proto definitions: it decodes every `ExportTraceServiceRequest` and
`ExportMetricsServiceRequest` (protobuf) posted to /v1/traces and /v1/metrics and keeps what they
hold, for the tests to read as JSON.

    receiver.py [--discard]      prints "listening <port>" once it accepts connections

GET /spans       every span received: ids in hex, kind, links, attributes, status, service
GET /metrics     every metric data point received: name, service, attributes, value
GET /echo        the request's `traceparent` and `tracestate` headers, as JSON: the HTTP
                 service an `[[http_tools]]` tool of the tests calls
--discard        answers every export with success and keeps nothing (the benchmark's collector)
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

DISCARD = "--discard" in sys.argv
LOCK = threading.Lock()
SPANS: list[dict[str, Any]] = []
METRICS: list[dict[str, Any]] = []
KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}


def value_of(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [value_of(item) for item in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: value_of(kv.value) for kv in value.kvlist_value.values}
    if which == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, which)


def attributes_of(attributes: Any) -> dict[str, Any]:
    return {kv.key: value_of(kv.value) for kv in attributes}


def keep_traces(body: bytes) -> None:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    found = []
    for resource_spans in request.resource_spans:
        service = attributes_of(resource_spans.resource.attributes).get("service.name")
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                found.append(
                    {
                        "service": service,
                        "scope": scope_spans.scope.name,
                        "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(),
                        "parent_span_id": span.parent_span_id.hex(),
                        "name": span.name,
                        "kind": KINDS.get(span.kind, str(span.kind)),
                        "attributes": attributes_of(span.attributes),
                        "links": [{"trace_id": link.trace_id.hex(), "span_id": link.span_id.hex()} for link in span.links],
                        "events": [event.name for event in span.events],
                        "status": {"code": span.status.code, "message": span.status.message},
                        "start_ns": span.start_time_unix_nano,
                        "end_ns": span.end_time_unix_nano,
                        "duration_ns": span.end_time_unix_nano - span.start_time_unix_nano,
                    }
                )
    with LOCK:
        SPANS.extend(found)


def keep_metrics(body: bytes) -> None:
    request = ExportMetricsServiceRequest()
    request.ParseFromString(body)
    found = []
    for resource_metrics in request.resource_metrics:
        service = attributes_of(resource_metrics.resource.attributes).get("service.name")
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                data = metric.WhichOneof("data")
                points = getattr(metric, data).data_points if data else []
                for point in points:
                    if data == "histogram":
                        value: Any = {"count": point.count, "sum": point.sum}
                    else:
                        value = point.as_double if point.WhichOneof("value") == "as_double" else point.as_int
                    found.append(
                        {
                            "service": service,
                            "name": metric.name,
                            "type": data,
                            "unit": metric.unit,
                            "attributes": attributes_of(point.attributes),
                            "value": value,
                        }
                    )
    with LOCK:
        METRICS.extend(found)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def reply(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802 (the standard library's name)
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path == "/v1/traces":
            if not DISCARD:
                keep_traces(body)
            self.reply(200, ExportTraceServiceResponse().SerializeToString(), "application/x-protobuf")
        elif self.path == "/v1/metrics":
            if not DISCARD:
                keep_metrics(body)
            self.reply(200, ExportMetricsServiceResponse().SerializeToString(), "application/x-protobuf")
        else:
            self.reply(404, b"", "text/plain")

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/spans":
            with LOCK:
                body = json.dumps(SPANS)
        elif self.path == "/metrics":
            with LOCK:
                body = json.dumps(METRICS)
        elif self.path.startswith("/echo"):
            body = json.dumps({"traceparent": self.headers.get("traceparent"), "tracestate": self.headers.get("tracestate")})
        else:
            self.reply(404, b"", "text/plain")
            return
        self.reply(200, body.encode(), "application/json")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"listening {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
