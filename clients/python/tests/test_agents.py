"""The OpenAI Agents SDK adapter, with the real `openai-agents` package: each tool's
on_invoke_tool is invoked directly, no model is called."""

from __future__ import annotations

import json

from agents import Agent, FunctionTool, RunContextWrapper
from agents.tool_context import ToolContext

from toolhost import AsyncClient, Client
from toolhost.agents import async_function_tools, function_tools

from .conftest import Daemon, RedisServer


def context(name: str, arguments: str) -> ToolContext[None]:
    return ToolContext(context=None, tool_name=name, tool_call_id="call-1", tool_arguments=arguments)


async def test_function_tools_call_over_redis_and_return_errors_as_text(daemon: Daemon, redis_server: RedisServer) -> None:
    with Client(redis_server.url) as client:
        tools = function_tools(client, names=["ech*", "fails"])
        assert sorted(tool.name for tool in tools) == ["echo", "fails"]
        agent = Agent(name="ops", tools=list(tools))
        assert len(agent.tools) == 2
        echo = next(tool for tool in tools if tool.name == "echo")
        assert isinstance(echo, FunctionTool)
        assert echo.params_json_schema["properties"]["message"]["type"] == "string"
        assert echo.strict_json_schema is True
        out = await echo.on_invoke_tool(context("echo", '{"message": "hi"}'), '{"message": "hi"}')
        assert json.loads(out) == {"message": "hi"}
        bad = await echo.on_invoke_tool(context("echo", '{"message": 5}'), '{"message": 5}')
        assert bad.startswith("invalid_arguments: ") and "- at /message (rule type)" in bad
        fails = next(tool for tool in tools if tool.name == "fails")
        failed = await fails.on_invoke_tool(context("fails", "{}"), "{}")
        assert failed.startswith("tool_failed: ")
        garbled = await echo.on_invoke_tool(context("echo", "{not json"), "{not json")
        assert garbled.startswith("invalid_request: ")
        assert RunContextWrapper(context=None).context is None


async def test_async_function_tools(daemon: Daemon, redis_server: RedisServer) -> None:
    async with AsyncClient(redis_server.url) as client:
        tools = await async_function_tools(client, names=["echo"])
        assert [tool.name for tool in tools] == ["echo"]
        out = await tools[0].on_invoke_tool(context("echo", '{"message": "async"}'), '{"message": "async"}')
        assert json.loads(out) == {"message": "async"}
