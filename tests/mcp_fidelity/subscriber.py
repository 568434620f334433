"""Subscribes to a hosted resource through the MCP door with the official MCP Python SDK,
driven by tests/tests/mcp_fidelity.rs. Prints one JSON object on its last line.

    subscriber.py <door url> <uri> <tool that changes it>
        an `initialize` session (`mode="legacy"`): `resources/subscribe`, the updates heard
        while subscribed and after unsubscribing
    subscriber.py listen <door url> <uri> <tool that changes it>
        2026-07-28: `subscriptions/listen` with `resourceSubscriptions`, the update heard
"""

from __future__ import annotations

import json
import sys
import warnings

import anyio


async def main(url: str, uri: str, tool: str) -> dict:
    from mcp import types
    from mcp.client.client import Client

    heard: list[str] = []

    async def on_message(message) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            heard.append(message.params.uri)

    report: dict = {}
    warnings.simplefilter("ignore")
    async with Client(url, mode="legacy", message_handler=on_message, cache=None) as client:
        report["subscribe_capability"] = bool(
            client.session.server_capabilities
            and client.session.server_capabilities.resources
            and client.session.server_capabilities.resources.subscribe
        ) if hasattr(client.session, "server_capabilities") else None
        await client.subscribe_resource(uri)
        await client.call_tool(tool, {})
        with anyio.move_on_after(10):
            while not heard:
                await anyio.sleep(0.05)
        report["while_subscribed"] = list(heard)
        read = await client.read_resource(uri)
        report["read"] = read.contents[0].text
        await client.unsubscribe_resource(uri)
        heard.clear()
        await client.call_tool(tool, {})
        await anyio.sleep(2)
        report["after_unsubscribe"] = list(heard)
        try:
            await client.subscribe_resource("watched://nobody-lists-this")
            report["unknown"] = None
        except Exception as error:  # the SDK raises McpError for a JSON-RPC error
            report["unknown"] = {"code": getattr(getattr(error, "error", None), "code", None), "message": str(error)}
    return report


async def listen(url: str, uri: str, tool: str) -> dict:
    from mcp.client.client import Client

    report: dict = {}
    async with Client(url, mode="2026-07-28", cache=None) as client:
        async with client.listen(resource_subscriptions=[uri]) as subscription:
            honored = subscription.honored
            report["honored"] = list(honored.resource_subscriptions or []) if honored else None
            # The acknowledgement comes before the hosting toolbox has subscribed upstream (the
            # door's lease is taken once the stream runs; docs/CONTRACTS.md, "The MCP door"), so
            # the resource is changed every half second until an update is heard.
            event = None

            async def change() -> None:
                while True:
                    await client.call_tool(tool, {})
                    await anyio.sleep(0.5)

            with anyio.move_on_after(10):
                async with anyio.create_task_group() as changes:
                    changes.start_soon(change)
                    async for event in subscription:
                        break
                    changes.cancel_scope.cancel()
            report["event"] = type(event).__name__ if event is not None else None
            report["uri"] = getattr(event, "uri", None)
    return report


if __name__ == "__main__":
    if sys.argv[1] == "listen":
        print(json.dumps(anyio.run(listen, *sys.argv[2:5])), flush=True)
    else:
        print(json.dumps(anyio.run(main, *sys.argv[1:4])), flush=True)
