// The official TypeScript MCP clients against toolhost's MCP door, driven by
// tests/tests/mcp_door.rs. The packages come from the cache `scripts/ensure-mcp-ts-clients.sh`
// fills, named by the environment variable MCP_TS_CLIENTS.
//
//   node ts_clients.cjs sdk <target>            @modelcontextprotocol/sdk (1.x): initialize
//   node ts_clients.cjs client <mode> <target>  @modelcontextprotocol/client (2.x), mode
//                                               `2026-07-28` (pinned, no handshake) or `auto`
//   node ts_clients.cjs ask <target>            the 2.x client pinned to 2026-07-28 calls
//                                               `slow__ask`; its elicitation handler answers the
//                                               InputRequiredResult the SDK drives
//
// A target is the door's URL or `stdio:<config file>` for `toolhost mcp`. Prints one JSON object:
// the protocol version, the tool names, an echo call, a hosted tool's call, and the error of a
// call of a tool nobody hosts.
"use strict";

const path = require("node:path");
const { createRequire } = require("node:module");

const packages = createRequire(path.join(process.env.MCP_TS_CLIENTS, "package.json"));
const toolhost = process.env.MCP_DOOR_TOOLHOST || "toolhost";

function transportOf(target, kinds) {
  if (target.startsWith("stdio:")) {
    return new kinds.Stdio({
      command: toolhost,
      args: ["mcp", "--config", target.slice("stdio:".length)],
      env: process.env,
      stderr: "inherit",
    });
  }
  return new kinds.Http(new URL(target));
}

async function ask(target) {
  const { Client, StreamableHTTPClientTransport } = packages("@modelcontextprotocol/client");
  const { StdioClientTransport } = packages("@modelcontextprotocol/client/stdio");
  const client = new Client(
    { name: "ts-ask", version: "2" },
    { capabilities: { elicitation: { form: {} } }, versionNegotiation: { mode: { pin: "2026-07-28" } } },
  );
  const asked = [];
  client.setRequestHandler("elicitation/create", async (request) => {
    asked.push(request.params.message);
    return { action: "accept", content: { name: "Lin" } };
  });
  const transport = transportOf(target, { Http: StreamableHTTPClientTransport, Stdio: StdioClientTransport });
  await client.connect(transport);
  const result = await client.callTool({ name: "slow__ask", arguments: { question: "Name?" } });
  await client.close();
  console.log(JSON.stringify({ asked, structured: result.structuredContent ?? null, error: result.isError ?? null }));
}

async function main() {
  const [flavour, ...rest] = process.argv.slice(2);
  if (flavour === "ask") {
    return ask(rest[0]);
  }
  let client;
  let transport;
  if (flavour === "sdk") {
    const { Client } = packages("@modelcontextprotocol/sdk/client/index.js");
    const { StreamableHTTPClientTransport } = packages("@modelcontextprotocol/sdk/client/streamableHttp.js");
    const { StdioClientTransport } = packages("@modelcontextprotocol/sdk/client/stdio.js");
    client = new Client({ name: "ts-sdk", version: "1" });
    transport = transportOf(rest[0], { Http: StreamableHTTPClientTransport, Stdio: StdioClientTransport });
  } else {
    const { Client, StreamableHTTPClientTransport } = packages("@modelcontextprotocol/client");
    const { StdioClientTransport } = packages("@modelcontextprotocol/client/stdio");
    const mode = rest[0] === "auto" ? "auto" : { pin: rest[0] };
    client = new Client({ name: "ts-client", version: "2" }, { versionNegotiation: { mode } });
    transport = transportOf(rest[1], { Http: StreamableHTTPClientTransport, Stdio: StdioClientTransport });
  }
  await client.connect(transport);
  const report = {
    protocol: client.getNegotiatedProtocolVersion ? client.getNegotiatedProtocolVersion() : transport.protocolVersion,
    session: transport.sessionId ?? null,
  };
  const names = [];
  let cursor;
  let first;
  do {
    const page = await client.listTools(cursor ? { cursor } : {});
    first ??= page;
    names.push(...page.tools.map((tool) => tool.name));
    cursor = page.nextCursor;
  } while (cursor);
  report.tools = names;
  report.hints = { ttlMs: first.ttlMs ?? null, cacheScope: first.cacheScope ?? null };
  const echo = await client.callTool({ name: "echo", arguments: { message: "hi" } });
  report.echo = { structured: echo.structuredContent ?? null, error: echo.isError ?? null };
  const add = await client.callTool({ name: "slow__add", arguments: { a: 2, b: 3 } });
  report.add = { structured: add.structuredContent ?? null, error: add.isError ?? null };
  try {
    await client.callTool({ name: "no_such_tool", arguments: {} });
    report.unknown = null;
  } catch (err) {
    report.unknown = { code: err.code ?? null, message: String(err.message) };
  }
  await client.close();
  console.log(JSON.stringify(report));
}

main().catch((err) => {
  console.log(JSON.stringify({ failed: String(err && err.stack ? err.stack : err) }));
  process.exit(1);
});
