"""What real MCP clients do against toolhost's MCP door, driven by tests/tests/mcp_door.rs.

Each scenario connects with a real client (the official `mcp` SDK, the OpenAI Agents SDK, or raw
JSON-RPC over HTTP where the SDK has no such request), does its part, and prints one JSON object
on its last line for the Rust test to check. A line `READY` tells the test a scenario is waiting
for it to act (start a toolbox, restart the door).

    scenarios.py list-call <target>         list the tools, call echo, add, a bad call, a nameless tool
    scenarios.py call <target> <tool> <json>   one call, its result
    scenarios.py cancel <target>            call `slow__slow`, cancel it after its first progress
    scenarios.py progress <target>          call `slow__slow` briefly, collecting its progress
    scenarios.py list-changed <target>      wait for notifications/tools/list_changed
    scenarios.py agents <target>            the Agents SDK lists and invokes the tools
    scenarios.py task-create <url>          a tools/call answered with a task (raw JSON-RPC)
    scenarios.py task-get <url> <task_id>   tasks/get until the task ends (raw JSON-RPC)
    scenarios.py listen <target>            2026-07-28: wait for list_changed on subscriptions/listen
    scenarios.py schema <target>            the door's schema of `slow__shape` beside the server's own
    scenarios.py modern-raw <url> <url2>    2026-07-28 requests written by hand: a retried id, a
                                            task made on one door and read on another, removed
                                            methods, a header that contradicts the body
    scenarios.py ask <target>               `slow__ask` answered by the SDK client's elicitation
                                            callback (accepted, then declined)
    scenarios.py ask-raw <url> <url2>       2026-07-28 `InputRequiredResult` and its retries written
                                            by hand: tampered, refused, unknown, answered on the
                                            other door, replayed, and a client without the
                                            capability
    scenarios.py oauth <url> <issuer>       the door as an OAuth resource server: its metadata,
                                            tokens the issuer mints (valid and not), a key
                                            rotation, and SDK clients that get their own token

A target is the door's URL (`http://...`) or `stdio:<config file>` for `toolhost mcp`.

`--mode M` before the scenario picks how the SDK client connects: `legacy` (the default,
`initialize`), `auto` (`server/discover`, falling back to `initialize`), or `2026-07-28`
(that revision at once, no handshake).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import httpx2 as httpx
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters

TOOLHOST = os.environ.get("MCP_DOOR_TOOLHOST", "toolhost")
MODE = "legacy"
MODERN = "2026-07-28"


def connect(target: str, **options: Any) -> Client:
    return Client(server_of(target), cache=None, mode=MODE, **options)


def server_of(target: str) -> Any:
    if target.startswith("stdio:"):
        return StdioServerParameters(
            command=TOOLHOST, args=["mcp", "--config", target[len("stdio:") :]], env=dict(os.environ)
        )
    return target


def text_of(result: Any) -> str:
    return "\n".join(block.text for block in result.content if getattr(block, "type", "") == "text")


def done(report: dict[str, Any]) -> None:
    print(json.dumps(report), flush=True)


async def all_tools(client: Any) -> tuple[list[Any], dict[str, Any]]:
    """Every page of tools/list (the door's tests serve small pages), and the first page's hints."""
    tools: list[Any] = []
    hints: dict[str, Any] = {}
    cursor = None
    while True:
        page = await client.list_tools(cursor=cursor) if cursor else await client.list_tools()
        if not hints:
            hints = {
                "ttl_ms": getattr(page, "ttl_ms", None),
                "cache_scope": getattr(page, "cache_scope", None),
                "result_type": getattr(page, "result_type", None),
            }
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return tools, hints


async def all_tool_names(client: Any) -> list[str]:
    return [tool.name for tool in (await all_tools(client))[0]]


async def list_call(target: str) -> None:
    async with connect(target) as client:
        session = client.session
        report: dict[str, Any] = {
            "protocol": client.protocol_version,
            "initialized": session.initialize_result is not None,
            "discovered": session.discover_result is not None,
        }
        tools, report["hints"] = await all_tools(client)
        report["tools"] = [tool.name for tool in tools]
        echo = await client.call_tool("echo", {"message": "hi"})
        report["echo"] = {"structured": echo.structured_content, "text": text_of(echo), "error": echo.is_error}
        add = await client.call_tool("slow__add", {"a": 2, "b": 3})
        report["add"] = {"structured": add.structured_content, "error": add.is_error}
        bad = await client.call_tool("echo", {"message": 5})
        report["bad"] = {"text": text_of(bad), "error": bad.is_error}
        try:
            await client.call_tool("no_such_tool", {})
            report["unknown"] = None
        except Exception as err:  # the SDK raises the JSON-RPC error
            report["unknown"] = {"code": getattr(getattr(err, "error", None), "code", None), "text": str(err)}
        done(report)


async def call(target: str, tool: str, arguments: str) -> None:
    async with connect(target) as client:
        try:
            result = await client.call_tool(tool, json.loads(arguments), read_timeout_seconds=60)
        except Exception as err:  # a JSON-RPC error
            done({"raised": str(err)})
            return
        done({"error": result.is_error, "text": text_of(result), "structured": result.structured_content})


async def cancel(target: str) -> None:
    async with connect(target) as client:
        first = asyncio.Event()

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            first.set()

        call = asyncio.create_task(client.call_tool("slow__slow", {"seconds": 20}, progress_callback=on_progress))
        got_progress = True
        try:
            await asyncio.wait_for(first.wait(), 15)
        except asyncio.TimeoutError:
            got_progress = False
            await asyncio.sleep(1)
        call.cancel()
        try:
            await call
            outcome = "answered"
        except asyncio.CancelledError:
            outcome = "cancelled"
        # The session stays usable after a cancel.
        after = await client.call_tool("echo", {"message": "after"})
        done({"progress_seen": got_progress, "outcome": outcome, "after": after.structured_content})


async def progress(target: str) -> None:
    async with connect(target) as client:
        seen: list[dict[str, Any]] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            seen.append({"progress": value, "total": total, "message": message})

        result = await client.call_tool("slow__slow", {"seconds": 1.5}, progress_callback=on_progress)
        done({"progress": seen, "result": result.structured_content, "error": result.is_error})


async def list_changed(target: str) -> None:
    changed = asyncio.Event()

    async def on_message(message: Any) -> None:
        root = getattr(message, "root", message)
        if getattr(root, "method", None) == "notifications/tools/list_changed":
            changed.set()

    async with connect(target, message_handler=on_message) as client:
        before = await all_tool_names(client)
        print("READY", flush=True)
        try:
            await asyncio.wait_for(changed.wait(), 30)
            notified = True
        except asyncio.TimeoutError:
            notified = False
        after = await all_tool_names(client)
        done({"notified": notified, "before": before, "after": after})


async def listen(target: str) -> None:
    """2026-07-28's `subscriptions/listen`: the tool list's changes on a stream of their own."""
    async with connect(target) as client:
        before = await all_tool_names(client)
        async with client.listen(tools_list_changed=True) as subscription:
            honored = subscription.honored.model_dump(by_alias=True, exclude_none=True) if subscription.honored else None
            print("READY", flush=True)
            event = None
            try:
                async with asyncio.timeout(30):
                    async for event in subscription:
                        break
            except TimeoutError:
                event = None
        after = await all_tool_names(client)
        done(
            {
                "protocol": client.protocol_version,
                "honored": honored,
                "event": type(event).__name__ if event is not None else None,
                "before": before,
                "after": after,
            }
        )


async def schema(target: str) -> None:
    """The door's `slow__shape` schema beside the one the hosted server itself lists."""
    from mcp.client.stdio import StdioServerParameters as Params

    here = os.path.dirname(os.path.abspath(__file__))
    direct = Params(command=sys.executable, args=[os.path.join(here, "slow_server.py")], env=dict(os.environ))
    async with Client(direct, cache=None, mode="legacy") as server:
        own = next(tool for tool in (await server.list_tools()).tools if tool.name == "shape")
    async with connect(target) as client:
        tools, _ = await all_tools(client)
        served = next(tool for tool in tools if tool.name == "slow__shape")
        good = await client.call_tool("slow__shape", {"size": [3, 4], "corner": {"x": 1, "y": 2}})
        bad = await client.call_tool("slow__shape", {"size": [3, "four"], "corner": {"x": 1, "y": 2}})
        done(
            {
                "protocol": client.protocol_version,
                "own": own.input_schema,
                "served": served.input_schema,
                "good": {"structured": good.structured_content, "error": good.is_error},
                "bad": {"text": text_of(bad), "error": bad.is_error},
            }
        )


async def agents(target: str) -> None:
    from agents import Agent, RunContextWrapper
    from agents.mcp import MCPServerStdio, MCPServerStreamableHttp
    from agents.tool_context import ToolContext

    if target.startswith("stdio:"):
        server: Any = MCPServerStdio(
            params={"command": TOOLHOST, "args": ["mcp", "--config", target[len("stdio:") :]], "env": dict(os.environ)},
            client_session_timeout_seconds=30,
        )
    else:
        server = MCPServerStreamableHttp(params={"url": target}, client_session_timeout_seconds=30)
    async with server:
        agent = Agent(name="ops", mcp_servers=[server])
        tools = await agent.get_all_tools(RunContextWrapper(context=None))
        by_name = {tool.name: tool for tool in tools}
        results = {}
        for name, arguments in [("echo", {"message": "from agents"}), ("slow__add", {"a": 20, "b": 22})]:
            text = json.dumps(arguments)
            context = ToolContext(context=None, tool_name=name, tool_call_id=f"call-{name}", tool_arguments=text)
            results[name] = await by_name[name].on_invoke_tool(context, text)
        done({"tools": sorted(by_name), "results": results})


def post(client: httpx.Client, session: str | None, message: dict[str, Any]) -> tuple[httpx.Response, Any]:
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    if session:
        headers["mcp-session-id"] = session
        headers["mcp-protocol-version"] = "2025-11-25"
    response = client.post(str(client.base_url).rstrip("/"), headers=headers, json=message)
    body = None
    if "id" in message and response.status_code == 200:
        for line in response.text.splitlines():
            if line.startswith("data: ") and line[6:].strip():
                body = json.loads(line[6:])
        if body is None and response.text.strip().startswith("{"):
            body = response.json()
    return response, body


def open_task_session(client: httpx.Client) -> str:
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
            "clientInfo": {"name": "task-test", "version": "1"},
        },
    }
    response, _ = post(client, None, init)
    session = response.headers["mcp-session-id"]
    post(client, session, {"jsonrpc": "2.0", "method": "notifications/initialized"})
    return session


def task_create(url: str) -> None:
    with httpx.Client(base_url=url, timeout=30) as client:
        session = open_task_session(client)
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "slow__slow", "arguments": {"seconds": 4}}}
        _, body = post(client, session, call)
        done({"response": body})


def task_get(url: str, task_id: str) -> None:
    with httpx.Client(base_url=url, timeout=30) as client:
        session = open_task_session(client)
        states = []
        for attempt in range(120):
            message = {"jsonrpc": "2.0", "id": 10 + attempt, "method": "tasks/get", "params": {"taskId": task_id}}
            _, body = post(client, session, message)
            result = (body or {}).get("result") or {}
            states.append(result.get("status") or (body or {}).get("error"))
            if result.get("status") in ("completed", "failed", "cancelled"):
                done({"states": states, "final": result})
                return
            import time

            time.sleep(0.25)
        done({"states": states, "final": None})


MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientInfo": {"name": "raw-2026", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {},
}


def modern(
    client: httpx.Client,
    id_: int,
    method: str,
    params: dict[str, Any],
    *,
    name: str | None = None,
    capabilities: dict[str, Any] | None = None,
    method_header: str | None = None,
    token: str | None = None,
) -> dict[str, Any]:
    """One 2026-07-28 request with no session: the version and capabilities in `_meta`, and the
    `Mcp-Method`/`Mcp-Name` headers the revision asks for. Returns the status and the message."""
    meta = dict(MODERN_META)
    if capabilities is not None:
        meta["io.modelcontextprotocol/clientCapabilities"] = capabilities
    headers = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": MODERN,
        "mcp-method": method_header or method,
    }
    if name is not None:
        headers["mcp-name"] = name
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    message = {"jsonrpc": "2.0", "id": id_, "method": method, "params": {**params, "_meta": meta}}
    response = client.post(str(client.base_url).rstrip("/"), headers=headers, json=message)
    body = None
    for line in response.text.splitlines():
        if line.startswith("data: ") and line[6:].strip():
            candidate = json.loads(line[6:])
            if "id" in candidate:
                body = candidate
    if body is None and response.text.strip().startswith("{"):
        body = response.json()
    return {
        "status": response.status_code,
        "session": response.headers.get("mcp-session-id"),
        "challenge": response.headers.get("www-authenticate"),
        "body": body,
    }


def modern_raw(url: str, other: str) -> None:
    report: dict[str, Any] = {}
    with httpx.Client(base_url=url, timeout=30) as client, httpx.Client(base_url=other, timeout=30) as replica:
        echo = {"name": "echo", "arguments": {"message": "again"}}
        # The same JSON-RPC id twice, as a client that retries would send it.
        report["first"] = modern(client, 7, "tools/call", echo, name="echo")
        report["retry"] = modern(client, 7, "tools/call", echo, name="echo")
        report["set_level"] = modern(client, 8, "logging/setLevel", {"level": "debug"})
        report["ping"] = modern(client, 9, "ping", {})
        report["mismatch"] = modern(client, 10, "tools/call", echo, name="echo", method_header="tools/list")
        report["wrong_name"] = modern(client, 11, "tools/call", echo, name="slow__add")
        tasks = {"extensions": {"io.modelcontextprotocol/tasks": {}}}
        slow = {"name": "slow__slow", "arguments": {"seconds": 2}}
        created = modern(client, 12, "tools/call", slow, name="slow__slow", capabilities=tasks)
        report["created"] = created
        task_id = ((created["body"] or {}).get("result") or {}).get("taskId")
        states = []
        final = None
        for attempt in range(120):
            got = modern(replica, 100 + attempt, "tasks/get", {"taskId": task_id}, name=task_id, capabilities=tasks)
            result = (got["body"] or {}).get("result") or {}
            states.append(result.get("status") or got)
            if result.get("status") in ("completed", "failed", "cancelled"):
                final = result
                break
            import time

            time.sleep(0.25)
        report["task_states"] = states
        report["task_final"] = final
    done(report)


async def ask(target: str) -> None:
    from mcp import types

    asked: list[str] = []

    async def on_elicit(context: Any, params: Any) -> Any:
        asked.append(params.message)
        if params.message == "Name?":
            return types.ElicitResult(action="accept", content={"name": "Ada"})
        return types.ElicitResult(action="decline")

    async with connect(target, elicitation_callback=on_elicit) as client:
        report: dict[str, Any] = {"protocol": client.protocol_version}
        for step, question in [("accepted", "Name?"), ("declined", "No?")]:
            result = await client.call_tool("slow__ask", {"question": question}, read_timeout_seconds=60)
            report[step] = {"error": result.is_error, "structured": result.structured_content, "text": text_of(result)}
        report["asked"] = asked
        done(report)


def ask_raw(url: str, other: str) -> None:
    report: dict[str, Any] = {}
    can_elicit = {"elicitation": {}}

    def retry(http: httpx.Client, id_: int, responses: dict[str, Any], state: str | None) -> dict[str, Any]:
        params: dict[str, Any] = {"name": "slow__ask", "arguments": {"question": "Name?"}, "inputResponses": responses}
        if state is not None:
            params["requestState"] = state
        return modern(http, id_, "tools/call", params, name="slow__ask", capabilities=can_elicit)

    with httpx.Client(base_url=url, timeout=30) as client, httpx.Client(base_url=other, timeout=30) as replica:
        ask = {"name": "slow__ask", "arguments": {"question": "Name?"}}
        first = modern(client, 1, "tools/call", ask, name="slow__ask", capabilities=can_elicit)
        report["first"] = first
        result = (first["body"] or {}).get("result") or {}
        state = result.get("requestState") or ""
        keys = list((result.get("inputRequests") or {}).keys())
        key = keys[0] if keys else "none"
        accept = {"action": "accept", "content": {"name": "Ada"}}
        # One character of the state changed: its tag no longer matches.
        flipped = state[:-1] + ("A" if state[-1:] != "A" else "B")
        report["tampered"] = retry(client, 2, {key: accept}, flipped)
        report["forged"] = retry(client, 3, {key: accept}, "not-a-state")
        report["no_state"] = retry(client, 4, {key: accept}, None)
        report["unknown_key"] = retry(replica, 5, {"never-asked": accept}, state)
        report["refused"] = retry(replica, 6, {key: {"action": "accept", "content": {"name": 5}}}, state)
        # The question still waits after a refused answer; the other door takes the right one.
        report["answered"] = retry(replica, 7, {key: accept}, state)
        report["replayed"] = retry(client, 8, {key: accept}, state)
        # Another tool's call cannot use the state.
        other_tool = {"name": "slow__add", "arguments": {"a": 1, "b": 2}, "inputResponses": {key: accept}, "requestState": state}
        report["other_tool"] = modern(client, 9, "tools/call", other_tool, name="slow__add", capabilities=can_elicit)
        # A client that did not declare elicitation is declined for.
        report["incapable"] = modern(client, 10, "tools/call", ask, name="slow__ask", capabilities={})
        # A task's question: `input_required` in tasks/get, answered by tasks/update, on the
        # other door.
        tasks = {"extensions": {"io.modelcontextprotocol/tasks": {}}, "elicitation": {}}
        created = modern(client, 11, "tools/call", ask, name="slow__ask", capabilities=tasks)
        report["task_created"] = created
        task_id = ((created["body"] or {}).get("result") or {}).get("taskId")
        states: list[Any] = []
        final = None
        for attempt in range(120):
            got = modern(replica, 200 + attempt, "tasks/get", {"taskId": task_id}, name=task_id, capabilities=tasks)
            result = (got["body"] or {}).get("result") or {}
            status = result.get("status")
            states.append(status or got)
            if status == "input_required" and "task_asked" not in report:
                report["task_asked"] = result
                key = next(iter(result.get("inputRequests") or {"none": None}))
                refused = {key: {"action": "accept", "content": {"name": 7}}}
                update = {"taskId": task_id, "inputResponses": refused}
                report["task_refused"] = modern(replica, 400, "tasks/update", update, name=task_id, capabilities=tasks)
                update["inputResponses"] = {key: {"action": "accept", "content": {"name": "Grace"}}}
                report["task_update"] = modern(replica, 401, "tasks/update", update, name=task_id, capabilities=tasks)
                report["task_again"] = modern(client, 402, "tasks/update", update, name=task_id, capabilities=tasks)
            if status in ("completed", "failed", "cancelled"):
                final = result
                break
            import time

            time.sleep(0.1)
        report["task_states"] = states
        report["task_final"] = final
    done(report)


class MemoryTokens:
    """Token storage of one SDK client, in memory."""

    def __init__(self) -> None:
        self.tokens: Any = None
        self.client_info: Any = None

    async def get_tokens(self) -> Any:
        return self.tokens

    async def set_tokens(self, tokens: Any) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> Any:
        return self.client_info

    async def set_client_info(self, client_info: Any) -> None:
        self.client_info = client_info


async def oauth_client(url: str, issuer: str, client_id: str, secret: str) -> dict[str, Any]:
    """An SDK client that follows the door's metadata to the issuer, gets a token with the
    client_credentials grant, then lists and calls."""
    from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
    from mcp.client.streamable_http import streamable_http_client

    provider = ClientCredentialsOAuthProvider(
        server_url=url,
        storage=MemoryTokens(),
        client_id=client_id,
        client_secret=secret,
        scope="tools:call",
        issuer=issuer,
    )
    async with httpx.AsyncClient(auth=provider, timeout=30) as http:
        async with Client(streamable_http_client(url, http_client=http), cache=None, mode=MODE) as client:
            tools = await all_tool_names(client)
            echo = await client.call_tool("echo", {"message": f"from {client_id}"})
            return {"protocol": client.protocol_version, "tools": tools, "echo": echo.structured_content}


def oauth(url: str, issuer: str) -> None:
    report: dict[str, Any] = {}
    origin = url.rsplit("/mcp", 1)[0]
    with httpx.Client(timeout=30) as plain, httpx.Client(base_url=url, timeout=30) as door:
        report["prm"] = plain.get(f"{origin}/.well-known/oauth-protected-resource/mcp").json()
        report["prm_root"] = plain.get(f"{origin}/.well-known/oauth-protected-resource").json()

        def mint(**claims: Any) -> str:
            return plain.post(f"{issuer}/mint", json=claims).json()["access_token"]

        def attempt(token: str | None) -> dict[str, Any]:
            result = modern(door, 1, "tools/list", {}, token=token)
            tools = [tool["name"] for tool in ((result["body"] or {}).get("result") or {}).get("tools", [])]
            return {"status": result["status"], "challenge": result["challenge"], "body": result["body"], "tools": tools}

        first = mint(aud=url)
        report["none"] = attempt(None)
        report["valid"] = attempt(first)
        report["again"] = attempt(first)
        report["wrong_audience"] = attempt(mint(aud="http://127.0.0.1:1/mcp"))
        report["expired"] = attempt(mint(aud=url, exp_in=-600))
        report["not_yet"] = attempt(mint(aud=url, nbf_in=600))
        report["wrong_issuer"] = attempt(mint(aud=url, iss="http://127.0.0.1:1"))
        # A key the JWKS lacks makes the door read it again, at most once per
        # jwks_refresh_min_ms: the second such token right after fetches nothing.
        fetches = plain.get(f"{issuer}/stats").json()["jwks_fetches"]
        report["unknown_key"] = attempt(mint(aud=url, key="unknown"))
        report["unknown_key_again"] = attempt(mint(aud=url, key="unknown"))
        report["fetches_for_unknown_keys"] = plain.get(f"{issuer}/stats").json()["jwks_fetches"] - fetches
        report["missing_scope"] = attempt(mint(aud=url, scope="profile"))
        report["no_tenant"] = attempt(mint(aud=url, org=None))
        report["not_a_jwt"] = attempt("not-a-jwt-at-all")
        report["beta"] = attempt(mint(aud=url, org="beta"))
        report["rotated_kid"] = plain.post(f"{issuer}/rotate").json()["kid"]
        # Past jwks_refresh_min_ms (the test's door: 1 s), the new key is fetched for the token
        # that names it.
        import time

        time.sleep(1.5)
        report["rotated"] = attempt(mint(aud=url))
        report["old_key_after_rotation"] = attempt(first)
        report["first_token"] = first
    report["sdk_acme"] = asyncio.run(oauth_client(url, issuer, "agent-acme", "acme-secret-0123456789"))
    report["sdk_beta"] = asyncio.run(oauth_client(url, issuer, "agent-beta", "beta-secret-0123456789"))
    done(report)


def main() -> None:
    global MODE
    argv = sys.argv[1:]
    if argv[0] == "--mode":
        MODE, argv = argv[1], argv[2:]
    scenario, args = argv[0], argv[1:]
    if scenario == "modern-raw":
        modern_raw(*args)
        return
    if scenario == "ask-raw":
        ask_raw(*args)
        return
    if scenario == "oauth":
        oauth(*args)
        return
    if scenario == "task-create":
        task_create(*args)
        return
    if scenario == "task-get":
        task_get(*args)
        return
    runs = {
        "list-call": list_call,
        "call": call,
        "cancel": cancel,
        "progress": progress,
        "list-changed": list_changed,
        "listen": listen,
        "schema": schema,
        "agents": agents,
        "ask": ask,
    }
    asyncio.run(runs[scenario](*args))


if __name__ == "__main__":
    main()
