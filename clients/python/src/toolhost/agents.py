"""The fleet's tools as OpenAI Agents SDK function tools (the `toolhost[agents]` extra).

    from toolhost import Client
    from toolhost.agents import function_tools
    from agents import Agent

    agent = Agent(name="ops", tools=function_tools(Client(), names=["time__*", "echo"]))

Each tool is an `agents.FunctionTool` built from toolhost's OpenAI-format description, strict
where toolhost marks the schema strict-ready. Invoking it calls the tool over Redis and
returns the result as JSON text; a tool that answers images or embedded files returns the
SDK's outputs instead: the result's text, then each image as a `ToolOutputImage` (a data URL)
and each embedded binary resource as a `ToolOutputFileContent` (audio and resource links, which
the SDK has no output for, are described in text). An error answer comes back as text the
model can act on (the code, the sentence, and each invalid argument's JSON pointer), not as an
exception that ends the run.
"""

from __future__ import annotations

import asyncio
import base64
import fnmatch
import json
from collections.abc import Iterable
from typing import Any

from agents import FunctionTool, ToolOutputFileContent, ToolOutputImage, ToolOutputText
from agents.tool_context import ToolContext

from ._aio import AsyncClient
from ._content import AudioBlock, EmbeddedResource, ImageBlock, Reply, ResourceLink, TextBlock
from ._errors import NoAnswer, ToolError
from ._sync import Client


def function_tools(client: Client, names: Iterable[str] | None = None) -> list[FunctionTool]:
    """One FunctionTool per fleet tool whose name matches one of `names` (globs; all when
    None). Calls run on `client`'s own thread, so they never block the agent's event loop."""

    async def invoke(tool: str, arguments: dict[str, Any]) -> Reply:
        return await asyncio.to_thread(client.call_reply, tool, arguments)

    return _build(client.tools(format="openai"), names, invoke)


async def async_function_tools(client: AsyncClient, names: Iterable[str] | None = None) -> list[FunctionTool]:
    """function_tools for an AsyncClient, whose calls run on the agent's own event loop (the
    client must be used from that loop only)."""

    async def invoke(tool: str, arguments: dict[str, Any]) -> Reply:
        return await client.call_reply(tool, arguments)

    return _build(await client.tools(format="openai"), names, invoke)


def _build(listed: list[dict[str, Any]], names: Iterable[str] | None, invoke: Any) -> list[FunctionTool]:
    patterns = list(names) if names is not None else ["*"]
    tools = []
    for entry in listed:
        function = entry.get("function")
        if not isinstance(function, dict):
            continue
        name = str(function.get("name", ""))
        if not any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns):
            continue
        tools.append(
            FunctionTool(
                name=name,
                description=str(function.get("description", "")),
                params_json_schema=dict(function.get("parameters") or {"type": "object", "properties": {}}),
                on_invoke_tool=_invoker(name, invoke),
                strict_json_schema=function.get("strict") is True,
            )
        )
    return tools


def _invoker(name: str, invoke: Any) -> Any:
    async def on_invoke_tool(_context: ToolContext[Any], arguments_json: str) -> Any:
        try:
            arguments = json.loads(arguments_json) if arguments_json.strip() else {}
        except ValueError as err:
            return f"invalid_request: the arguments are not JSON ({err})"
        if not isinstance(arguments, dict):
            return "invalid_request: the arguments must be a JSON object"
        try:
            reply: Reply = await invoke(name, arguments)
        except (ToolError, NoAnswer) as err:
            return str(err)
        return tool_output(reply)

    return on_invoke_tool


def tool_output(reply: Reply) -> Any:
    """What the SDK hands the model for `reply`: the result as JSON text when the tool gave no
    image or embedded file, else a list of the SDK's text, image and file outputs."""
    text = json.dumps(reply.result, ensure_ascii=False)
    if not any(isinstance(block, (ImageBlock, EmbeddedResource)) for block in reply.content):
        return text if not reply.content else _with_notes(text, reply)
    outputs: list[Any] = [ToolOutputText(text=text)]
    for block in reply.content:
        if isinstance(block, ImageBlock):
            outputs.append(ToolOutputImage(image_url=block.data_url()))
        elif isinstance(block, EmbeddedResource) and block.blob is not None:
            filename = block.uri.rstrip("/").rsplit("/", 1)[-1] or "resource"
            outputs.append(ToolOutputFileContent(file_data=base64.b64encode(block.blob).decode(), filename=filename))
        elif isinstance(block, EmbeddedResource) and block.text is not None:
            outputs.append(ToolOutputText(text=f"{block.uri}:\n{block.text}"))
        elif note := _note(block):
            outputs.append(ToolOutputText(text=note))
    return outputs


def _with_notes(text: str, reply: Reply) -> str:
    notes = [note for block in reply.content if (note := _note(block))]
    return "\n".join([text, *notes])


def _note(block: object) -> str | None:
    """A sentence for a block the SDK has no output for."""
    if isinstance(block, AudioBlock):
        return f"[audio: {block.mime_type}, {len(block.data)} bytes]"
    if isinstance(block, ResourceLink):
        return f"[resource link: {block.uri} ({block.name})]"
    if isinstance(block, TextBlock) and len(block.text) > 0:
        return block.text
    return None
