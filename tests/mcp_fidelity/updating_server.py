"""A small MCP server on the official MCP Python SDK (its low-level server), hosted over stdio by
the resource subscription test in tests/tests/mcp_fidelity.rs.

It lists one resource, `watched://counter`, and declares `resources.subscribe`. The tool `bump`
adds one to the counter and, while a client is subscribed, sends
`notifications/resources/updated` for it. Every subscribe and unsubscribe it receives is
appended to `$UPDATING_SERVER_MARKS/subscriptions`, so the test sees what toolhost asked of it.
"""

import os

import anyio
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

URI = "watched://counter"
MARKS = os.environ.get("UPDATING_SERVER_MARKS", ".")
state = {"count": 0, "subscribed": False}


def mark(line: str) -> None:
    with open(os.path.join(MARKS, "subscriptions"), "a", encoding="utf-8") as marks:
        marks.write(line + "\n")


async def list_resources(ctx, params):
    return types.ListResourcesResult(resources=[types.Resource(uri=URI, name="counter", mime_type="text/plain")])


async def read_resource(ctx, params):
    text = types.TextResourceContents(uri=URI, mime_type="text/plain", text=str(state["count"]))
    return types.ReadResourceResult(contents=[text])


async def subscribe(ctx, params):
    state["subscribed"] = True
    mark(f"subscribe {params.uri}")
    return types.EmptyResult()


async def unsubscribe(ctx, params):
    state["subscribed"] = False
    mark(f"unsubscribe {params.uri}")
    return types.EmptyResult()


async def list_tools(ctx, params):
    bump = types.Tool(name="bump", description="Adds one to the counter.", input_schema={"type": "object"})
    return types.ListToolsResult(tools=[bump])


async def call_tool(ctx, params):
    state["count"] += 1
    if state["subscribed"]:
        await ctx.session.send_resource_updated(URI)
    return types.CallToolResult(content=[types.TextContent(text=str(state["count"]))])


server = Server(
    "updating",
    on_list_resources=list_resources,
    on_read_resource=read_resource,
    on_subscribe_resource=subscribe,
    on_unsubscribe_resource=unsubscribe,
    on_list_tools=list_tools,
    on_call_tool=call_tool,
)


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
