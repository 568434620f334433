// A small MCP server on the official TypeScript SDK (the @modelcontextprotocol/sdk that
// server-everything installs beside itself), for toolhost-bench-mcp's image rows. Over stdio it
// lists two tools with no arguments:
//
//   text    answers one short text block
//   image   answers a PNG of about <KiB> KiB (noise, so deflate cannot shrink it) as one image
//           content block, base64 as MCP carries it; the same bytes on every call
//
//     node picture_server.mjs <sdk package directory> <KiB>
import { deflateSync } from "node:zlib";

const [sdk, kib] = process.argv.slice(2);
const { McpServer } = await import(`${sdk}/dist/esm/server/mcp.js`);
const { StdioServerTransport } = await import(`${sdk}/dist/esm/server/stdio.js`);

const CRC_TABLE = Array.from({ length: 256 }, (_, n) => {
  let c = n;
  for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
  return c >>> 0;
});

function crc32(bytes) {
  let c = 0xffffffff;
  for (const byte of bytes) c = CRC_TABLE[(c ^ byte) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

function chunk(type, data) {
  const head = Buffer.alloc(8);
  head.writeUInt32BE(data.length, 0);
  head.write(type, 4, "ascii");
  const crc = Buffer.alloc(4);
  crc.writeUInt32BE(crc32(Buffer.concat([head.subarray(4), data])), 0);
  return Buffer.concat([head, data, crc]);
}

/** An RGB PNG 256 pixels wide of deterministic noise, rows added until the file is `bytes` long. */
function png(bytes) {
  const width = 256;
  const rows = Math.ceil(bytes / (1 + width * 3));
  const raw = Buffer.alloc(rows * (1 + width * 3));
  let state = 0x2545f491;
  for (let i = 0; i < raw.length; i++) {
    if (i % (1 + width * 3) === 0) continue; // each row's filter byte: none
    state ^= state << 13;
    state ^= state >>> 17;
    state ^= state << 5;
    raw[i] = state & 0xff;
  }
  const header = Buffer.alloc(13);
  header.writeUInt32BE(width, 0);
  header.writeUInt32BE(rows, 4);
  header.set([8, 2, 0, 0, 0], 8); // 8 bits per channel, RGB
  const signature = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
  return Buffer.concat([
    signature,
    chunk("IHDR", header),
    chunk("IDAT", deflateSync(raw)),
    chunk("IEND", Buffer.alloc(0)),
  ]);
}

const image = png(Number(kib) * 1024).toString("base64");
const server = new McpServer({ name: "toolhost-bench-pictures", version: "1" });
server.registerTool("text", { description: "Answers one short text block." }, async () => ({
  content: [{ type: "text", text: "Here is the text you asked for." }],
}));
server.registerTool("image", { description: `Answers a PNG of about ${kib} KiB.` }, async () => ({
  content: [{ type: "image", data: image, mimeType: "image/png" }],
}));
await server.connect(new StdioServerTransport());
