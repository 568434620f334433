"""The conformance suite's tool checks, made by the official MCP Python SDK over stdio
(`toolhost mcp`), where the suite itself speaks only streamable HTTP; driven by
tests/tests/mcp_fidelity.rs. Prints one JSON object on its last line: what the client saw of
each of the reference server's tools.

    stdio_checks.py <config file>    MCP_DOOR_TOOLHOST names the toolhost binary
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
from typing import Any

from mcp import types
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters


def block(content: Any) -> dict[str, Any]:
    seen: dict[str, Any] = {"type": content.type}
    if content.type == "text":
        seen["text"] = content.text
    elif content.type in ("image", "audio"):
        seen["mime"] = content.mime_type
        seen["bytes"] = len(base64.b64decode(content.data))
    elif content.type == "resource":
        seen["uri"] = str(content.resource.uri)
        seen["text"] = getattr(content.resource, "text", None)
    return seen


async def checks(config: str) -> dict[str, Any]:
    logs: list[dict[str, Any]] = []

    async def on_log(params: Any) -> None:
        logs.append({"level": params.level, "data": params.data})

    asked: list[dict[str, Any]] = []

    # The hosted server's questions, asked of this client through the door.
    async def on_elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append({"kind": "elicitation", "message": params.message})
        return types.ElicitResult(action="accept", content={"response": "from the stdio client"})

    async def on_sample(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        asked.append({"kind": "sampling", "text": params.messages[0].content.text})
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="sampled over stdio"), model="stdio-model"
        )

    server = StdioServerParameters(
        command=os.environ["MCP_DOOR_TOOLHOST"], args=["mcp", "--config", config], env=dict(os.environ)
    )
    report: dict[str, Any] = {}
    # The `initialize` generation: logging/setLevel is gone from 2026-07-28 (SEP-2577), which the
    # SDK's default mode would pick.
    async with Client(
        server,
        cache=None,
        logging_callback=on_log,
        elicitation_callback=on_elicit,
        sampling_callback=on_sample,
        mode="legacy",
    ) as client:
        names: list[str] = []
        cursor = None
        while True:
            page = await client.list_tools(cursor=cursor) if cursor else await client.list_tools()
            names.extend(tool.name for tool in page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        report["tools"] = sorted(names)
        for tool in (
            "test_simple_text",
            "test_image_content",
            "test_audio_content",
            "test_embedded_resource",
            "test_multiple_content_types",
            "test_error_handling",
        ):
            result = await client.call_tool(tool, {})
            report[tool] = {"error": result.is_error, "content": [block(content) for content in result.content]}
        progress: list[float] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress.append(value)

        await client.call_tool("test_tool_with_progress", {}, progress_callback=on_progress)
        report["progress"] = progress
        await client.session.set_logging_level("info")
        await client.call_tool("test_tool_with_logging", {})
        report["logs"] = logs
        for tool, arguments in (
            ("test_elicitation", {"message": "Answer over stdio?"}),
            ("test_sampling", {"prompt": "Say hi over stdio"}),
        ):
            result = await client.call_tool(tool, arguments)
            report[tool] = {"error": result.is_error, "content": [block(content) for content in result.content]}
        report["asked"] = asked
    return report


def main() -> int:
    print(json.dumps(asyncio.run(checks(sys.argv[1]))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
