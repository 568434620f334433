"""Content blocks: typed from the wire, an image from an `[[http_tools]]` endpoint through a real
daemon, and the Agents SDK adapter's image and file outputs."""

from __future__ import annotations

import base64
import http.server
import json
import shutil
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from agents import ToolOutputFileContent, ToolOutputImage, ToolOutputText

from toolhost import (
    AudioBlock,
    Client,
    ClientError,
    EmbeddedResource,
    Finished,
    ImageBlock,
    LogEntry,
    Reply,
    ResourceLink,
    TextBlock,
)
from toolhost._content import parse_blocks
from toolhost.agents import tool_output

from .conftest import Daemon, RedisServer

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(64))


def test_every_block_type_is_typed_with_its_annotations_and_meta() -> None:
    blocks = parse_blocks(
        [
            {"type": "text", "text": "see", "annotations": {"audience": ["user"]}},
            {"type": "image", "data": base64.b64encode(PNG).decode(), "mimeType": "image/png", "_meta": {"k": 1}},
            {"type": "audio", "data": "UklGRg==", "mimeType": "audio/wav"},
            {"type": "resource_link", "uri": "file:///a.txt", "name": "a.txt", "mimeType": "text/plain", "size": 3},
            {"type": "resource", "resource": {"uri": "test://t", "text": "body", "mimeType": "text/plain"}},
            {"type": "resource", "resource": {"uri": "test://b.bin", "blob": "AAEC"}},
        ]
    )
    assert blocks[0] == TextBlock("see", annotations={"audience": ["user"]})
    assert blocks[1] == ImageBlock(PNG, "image/png", meta={"k": 1})
    assert isinstance(blocks[1], ImageBlock) and blocks[1].data_url().startswith("data:image/png;base64,iVBOR")
    assert blocks[2] == AudioBlock(b"RIFF", "audio/wav")
    assert blocks[3] == ResourceLink(uri="file:///a.txt", name="a.txt", mime_type="text/plain", size=3)
    assert blocks[4] == EmbeddedResource(uri="test://t", mime_type="text/plain", text="body")
    assert blocks[5] == EmbeddedResource(uri="test://b.bin", blob=b"\x00\x01\x02")
    assert parse_blocks(None) == ()


@pytest.mark.parametrize(
    ("block", "fault"),
    [
        ({"type": "video", "data": ""}, "type MCP does not define: 'video'"),
        ({"type": "image", "data": "not base64!", "mimeType": "image/png"}, "is not base64"),
        ({"type": "image", "data": "AAAA"}, "no string 'mimeType'"),
        ("text", "is not an object"),
    ],
)
def test_a_block_that_is_not_mcps_is_a_clear_error(block: Any, fault: str) -> None:
    with pytest.raises(ClientError, match=fault):
        parse_blocks([block])


def test_the_agents_adapter_returns_images_and_files_as_the_sdks_outputs() -> None:
    image = ImageBlock(PNG, "image/png")
    outputs = tool_output(
        Reply("a dot", (TextBlock("a dot"), image, EmbeddedResource(uri="test://r/report.pdf", blob=b"%PDF")))
    )
    assert isinstance(outputs, list)
    assert outputs[0] == ToolOutputText(text='"a dot"')
    assert ToolOutputImage(image_url=image.data_url()) in outputs
    assert ToolOutputFileContent(file_data=base64.b64encode(b"%PDF").decode(), filename="report.pdf") in outputs
    # Without images or files, the result's JSON text, with a note for what the SDK cannot show.
    assert tool_output(Reply({"a": 1})) == '{"a": 1}'
    noted = tool_output(Reply("", (ResourceLink(uri="file:///x", name="x"),)))
    assert noted == '""\n[resource link: file:///x (x)]'


class _Pixel(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(PNG)))
        self.end_headers()
        self.wfile.write(PNG)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def image_daemon(redis_server: RedisServer) -> Iterator[Daemon]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Pixel)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = f"""
[tools]
disabled = ["terminal_run"]

[[http_tools]]
name = "snapshot"
description = "A picture."
method = "GET"
url = "http://127.0.0.1:{server.server_address[1]}/pixel.png"
argument_schema = {{ type = "object", properties = {{}} }}
"""
    host = Daemon(redis_server.url, config)
    yield host
    host.stop()
    server.shutdown()
    shutil.rmtree(host.dir, ignore_errors=True)


def test_an_http_tools_image_reaches_the_client_as_an_image_block(redis_server: RedisServer, image_daemon: Daemon) -> None:
    with Client(redis_server.url) as client:
        reply = client.call_reply("snapshot", {})
        assert reply.result == f"an image (image/png, {len(PNG)} bytes), in the answer's content"
        assert reply.images() == [ImageBlock(PNG, "image/png")]
        # call() keeps giving the result alone, and stream() ends with the blocks too.
        assert client.call("snapshot", {}) == reply.result
        finished = [event for event in client.stream("snapshot", {}) if isinstance(event, Finished)]
        assert finished[0].content == reply.content


def test_log_entries_are_told_from_progress_and_answers() -> None:
    from toolhost._wire import log_of, parse_entry

    def entry(event_type: str, data: dict[str, Any]) -> dict[bytes, bytes]:
        return {b"payload": json.dumps({"type": event_type, "data": data}).encode()}

    log = parse_entry(entry("tool.invoke.completed.log", {"request_id": "r", "level": "warning", "logger": "db", "data": {"rows": 3}}))
    assert log is not None and log.kind == "log"
    assert log_of(log) == LogEntry("r", "warning", {"rows": 3}, "db")
    assert parse_entry(entry("tool.invoke.completed.log", {"request_id": "r", "data": 1})) is None
    answer = parse_entry(entry("tool.invoke.completed", {"request_id": "r", "success": True, "result": 1}))
    assert answer is not None and answer.kind == "answer"
