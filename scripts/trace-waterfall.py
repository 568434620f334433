#!/usr/bin/env python3
"""Draws one call's trace as a waterfall, in HTML, from spans as the telemetry tests' OTLP
receiver keeps them (tests/telemetry/receiver.py, `GET /spans`: a JSON list of spans with hex
ids, kind, service, attributes, start and end in Unix nanoseconds).

    scripts/trace-waterfall.py <spans.json> <out.html> [<span name>]

With a span name, the time axis is that span's (the call, say, rather than the caller's whole
run with its session set-up): spans that end before it or start after it are left out, and the
heading says how many; a longer one is drawn cut at the axis's ends.

The spans of one trace are nested by their parent ids, each drawn as a bar over the trace's
time, labelled with its service, name, kind and duration, and the attributes a reader looks
for. A trace viewer (Jaeger, Tempo) shows the same; docs/OPERATIONS.md says how docs/trace.png
was made with this script and Chromium, there being no Jaeger on the machine.
"""

import html
import json
import sys

SHOWN = (
    "gen_ai.tool.name",
    "mcp.method.name",
    "messaging.system",
    "messaging.destination.name",
    "messaging.consumer.group.name",
    "server.address",
    "toolhost.outcome",
    "error.type",
)
COLOURS = {"caller": "#6a5acd", "toolhost": "#1f77b4", "traced-mcp-server": "#2ca02c"}


def ordered(spans: list) -> list:
    """The spans depth first from the roots, each with its depth."""
    ids = {span["span_id"] for span in spans}
    children: dict = {}
    for span in spans:
        parent = span["parent_span_id"] if span["parent_span_id"] in ids else ""
        children.setdefault(parent, []).append(span)
    for group in children.values():
        group.sort(key=lambda span: span["start_ns"])
    out = []

    def walk(parent: str, depth: int) -> None:
        for span in children.get(parent, []):
            out.append((span, depth))
            walk(span["span_id"], depth + 1)

    walk("", 0)
    return out


def main() -> None:
    source, target = sys.argv[1:3]
    spans = json.load(open(source))
    if not spans:
        raise SystemExit("no spans")
    start = min(span["start_ns"] for span in spans)
    end = max(span["end_ns"] for span in spans)
    left_out = 0
    if len(sys.argv) > 3:
        axis = next((span for span in spans if span["name"] == sys.argv[3]), None)
        if axis is None:
            raise SystemExit(f"no span named {sys.argv[3]!r}")
        start, end = axis["start_ns"], axis["end_ns"]
        kept = [span for span in spans if span["end_ns"] >= start and span["start_ns"] <= end]
        left_out = len(spans) - len(kept)
        spans = kept
    total = max(end - start, 1)
    rows = []
    for span, depth in ordered(spans):
        shown_start = max(span["start_ns"], start)
        shown_end = min(span["end_ns"], end)
        left = (shown_start - start) / total * 100
        width = max((shown_end - shown_start) / total * 100, 0.3)
        ms = (span["end_ns"] - span["start_ns"]) / 1e6
        attributes = " · ".join(
            f"{key}={span['attributes'][key]}" for key in SHOWN if key in span["attributes"]
        )
        links = " · link → " + ", ".join(link["span_id"] for link in span["links"]) if span["links"] else ""
        colour = COLOURS.get(span["service"], "#888")
        # The duration right of the bar, or left of it when the bar reaches the right end.
        if left + width < 85:
            label = f'<span class="ms" style="left:{left + width:.3f}%">{ms:.2f} ms</span>'
        else:
            label = f'<span class="ms before" style="right:{100 - left:.3f}%">{ms:.2f} ms</span>'
        failed = span["status"]["code"] == 2
        rows.append(
            f"""<div class="row"><div class="label" style="padding-left:{depth * 18 + 6}px">
<span class="service" style="background:{colour}">{html.escape(span['service'])}</span>
<b>{html.escape(span['name'])}</b> <span class="kind">{span['kind']}</span>
<div class="attrs">span {span['span_id']}{html.escape(links)}<br>{html.escape(attributes)}</div></div>
<div class="lane"><div class="bar{' failed' if failed else ''}" style="left:{left:.3f}%;width:{width:.3f}%;background:{colour}"></div>
{label}</div></div>"""
        )
    trace_id = spans[0]["trace_id"]
    page = f"""<!doctype html><meta charset="utf-8"><title>trace {trace_id}</title>
<style>
body {{ font: 13px/1.35 system-ui, sans-serif; margin: 16px; color: #222; width: 1240px; }}
h1 {{ font-size: 15px; margin: 0 0 10px; }}
.row {{ display: flex; border-top: 1px solid #e4e4e4; min-height: 44px; align-items: center; }}
.label {{ width: 560px; flex: none; box-sizing: border-box; }}
.service {{ color: white; border-radius: 3px; padding: 0 5px; font-size: 11px; }}
.kind {{ color: #777; font-size: 11px; }}
.attrs {{ color: #666; font-size: 11px; }}
.lane {{ position: relative; flex: 1; height: 30px; background: repeating-linear-gradient(90deg, #fafafa 0 10%, #f2f2f2 10% 20%); }}
.bar {{ position: absolute; top: 8px; height: 14px; border-radius: 2px; }}
.bar.failed {{ outline: 2px solid #d62728; }}
.ms {{ position: absolute; top: 7px; margin-left: 6px; font-size: 11px; color: #444; white-space: nowrap; }}
.ms.before {{ margin: 0 6px 0 0; }}
</style>
<h1>Trace {trace_id} · {len(spans)} spans{f" ({left_out} outside the axis left out)" if left_out else ""} · axis {total / 1e6:.2f} ms</h1>
{''.join(rows)}
"""
    open(target, "w").write(page)


if __name__ == "__main__":
    main()
