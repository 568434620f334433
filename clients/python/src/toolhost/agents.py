"""The fleet's tools as OpenAI Agents SDK function tools (the `toolhost[agents]` extra).

    from toolhost import Client
    from toolhost.agents import function_tools
    from agents import Agent

    agent = Agent(name="ops", tools=function_tools(Client(), names=["time__*", "echo"]))

Each tool is an `agents.FunctionTool` built from toolhost's OpenAI-format description, strict
where toolhost marks the schema strict-ready. Invoking it calls the tool over Redis and
returns the result as JSON text; an error answer comes back as text the model can act on
(the code, the sentence, and each invalid argument's JSON pointer), not as an exception that
ends the run.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
from collections.abc import Iterable
from typing import Any

from agents import FunctionTool
from agents.tool_context import ToolContext

from ._aio import AsyncClient
from ._errors import NoAnswer, ToolError
from ._sync import Client


def function_tools(client: Client, names: Iterable[str] | None = None) -> list[FunctionTool]:
    """One FunctionTool per fleet tool whose name matches one of `names` (globs; all when
    None). Calls run on `client`'s own thread, so they never block the agent's event loop."""

    async def invoke(tool: str, arguments: dict[str, Any]) -> Any:
        return await asyncio.to_thread(client.call, tool, arguments)

    return _build(client.tools(format="openai"), names, invoke)


async def async_function_tools(client: AsyncClient, names: Iterable[str] | None = None) -> list[FunctionTool]:
    """function_tools for an AsyncClient, whose calls run on the agent's own event loop (the
    client must be used from that loop only)."""

    async def invoke(tool: str, arguments: dict[str, Any]) -> Any:
        return await client.call(tool, arguments)

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
    async def on_invoke_tool(_context: ToolContext[Any], arguments_json: str) -> str:
        try:
            arguments = json.loads(arguments_json) if arguments_json.strip() else {}
        except ValueError as err:
            return f"invalid_request: the arguments are not JSON ({err})"
        if not isinstance(arguments, dict):
            return "invalid_request: the arguments must be a JSON object"
        try:
            result = await invoke(name, arguments)
        except (ToolError, NoAnswer) as err:
            return str(err)
        return json.dumps(result, ensure_ascii=False)

    return on_invoke_tool
