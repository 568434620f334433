"""Images from hosted MCP servers, as real callers receive them, driven by
tests/tests/mcp_fidelity.rs. Prints one JSON object on its last line.

    images.py redis <redis url> <tool>...   the Python client (call_reply) and its Agents SDK
                                             adapter, over Redis (the python-client venv, with
                                             PYTHONPATH naming clients/python/src)
    images.py logs <redis url> <tool>        a tool's log entries, by the Python client's `on_log`
                                             and `stream()`, over Redis
    images.py mcp <target> <tool>...        the official MCP Python SDK through the MCP door (the
                                             mcp-door venv); a target is the door's URL or
                                             `stdio:<config file>` for `toolhost mcp`; or
                                             the hosted server itself, its URL or
                                             `exec:<program> <args>`, for the digests to match
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import sys
from typing import Any


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def over_redis(url: str, tools: list[str]) -> dict[str, Any]:
    from agents import ToolOutputImage
    from agents.tool_context import ToolContext

    from toolhost import Client, ImageBlock
    from toolhost.agents import function_tools

    report: dict[str, Any] = {}
    with Client(url) as client:
        for tool in tools:
            reply = client.call_reply(tool, {})
            adapted = function_tools(client, names=[tool])[0]
            context = ToolContext(context=None, tool_name=tool, tool_call_id="call-1", tool_arguments="{}")
            output = asyncio.run(adapted.on_invoke_tool(context, "{}"))
            images = [item for item in output if isinstance(item, ToolOutputImage)] if isinstance(output, list) else []
            report[tool] = {
                "result": reply.result,
                "types": [type(block).__name__ for block in reply.content],
                "images": [
                    {"mime": block.mime_type, "sha256": digest(block.data)}
                    for block in reply.content
                    if isinstance(block, ImageBlock)
                ],
                "agents_images": [
                    digest(base64.b64decode((image.image_url or "").split(",", 1)[1])) for image in images
                ],
            }
    return report


async def through_door(target: str, tools: list[str]) -> dict[str, Any]:
    from mcp.client.client import Client
    from mcp.client.stdio import StdioServerParameters

    server: Any = target
    if target.startswith("exec:"):
        program, *args = target[5:].split(" ")
        server = StdioServerParameters(command=program, args=args, env=dict(os.environ))
    elif target.startswith("stdio:"):
        command = os.environ["MCP_DOOR_TOOLHOST"]
        server = StdioServerParameters(command=command, args=["mcp", "--config", target[6:]], env=dict(os.environ))
    report: dict[str, Any] = {}
    async with Client(server, cache=None) as client:
        for tool in tools:
            result = await client.call_tool(tool, {})
            report[tool] = {
                "error": result.is_error,
                "types": [block.type for block in result.content],
                "images": [
                    {"mime": block.mime_type, "sha256": digest(base64.b64decode(block.data))}
                    for block in result.content
                    if block.type == "image"
                ],
            }
    return report


def logs_over_redis(url: str, tool: str) -> dict[str, Any]:
    from toolhost import Client, LogEntry

    with Client(url) as client:
        seen: list[LogEntry] = []
        result = client.call(tool, {}, on_log=seen.append)
        streamed = [event for event in client.stream(tool, {}) if isinstance(event, LogEntry)]
    return {
        "result": result,
        "on_log": [{"level": entry.level, "data": entry.data} for entry in seen],
        "stream": [{"level": entry.level, "data": entry.data} for entry in streamed],
    }


def catalog_over_redis(url: str) -> dict[str, Any]:
    from toolhost import Client, ToolError

    with Client(url) as client:
        try:
            client.read_resource("test://nobody-lists-this")
            unknown: dict[str, Any] = {"raised": None}
        except ToolError as error:
            unknown = {"raised": type(error).__name__, "code": error.code, "message": str(error)}
        prompt_ref = {"type": "ref/prompt", "name": "ref__test_prompt_with_arguments"}
        return {
            "resources": client.list_resources(),
            "templates": client.list_resource_templates(),
            "prompts": client.list_prompts(),
            "text": client.read_resource("test://static-text"),
            "binary": client.read_resource("test://static-binary"),
            "templated": client.read_resource("test://template/7/data"),
            "prompt": client.get_prompt("ref__test_prompt_with_arguments", {"arg1": "x", "arg2": "y"}),
            "completion": client.complete(prompt_ref, {"name": "arg1", "value": "pa"}),
            "unknown": unknown,
        }


def main() -> int:
    mode, target, tools = sys.argv[1], sys.argv[2], sys.argv[3:]
    if mode == "catalog":
        report = catalog_over_redis(target)
    elif mode == "redis":
        report = over_redis(target, tools)
    elif mode == "logs":
        report = logs_over_redis(target, tools[0])
    else:
        report = asyncio.run(through_door(target, tools))
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
