// Images through toolhost's MCP door to the official TypeScript SDK client
// (@modelcontextprotocol/sdk, the version scripts/ensure-mcp-conformance.sh pins), over
// streamable HTTP; driven by tests/tests/mcp_fidelity.rs. Prints one JSON object on its last
// line, as images.py does.
//
//     node images.mjs <door url> <tool>...     MCP_SDK names the SDK's package directory
import { createHash } from "node:crypto";

const sdk = process.env.MCP_SDK;
const { Client } = await import(`${sdk}/dist/esm/client/index.js`);
const { StreamableHTTPClientTransport } = await import(`${sdk}/dist/esm/client/streamableHttp.js`);

const [url, ...tools] = process.argv.slice(2);
const client = new Client({ name: "toolhost-fidelity", version: "0" });
await client.connect(new StreamableHTTPClientTransport(new URL(url)));
const report = {};
for (const tool of tools) {
  const result = await client.callTool({ name: tool, arguments: {} });
  report[tool] = {
    error: result.isError === true,
    types: result.content.map((block) => block.type),
    images: result.content
      .filter((block) => block.type === "image")
      .map((block) => ({
        mime: block.mimeType,
        sha256: createHash("sha256").update(Buffer.from(block.data, "base64")).digest("hex"),
      })),
  };
}
await client.close();
console.log(JSON.stringify(report));
