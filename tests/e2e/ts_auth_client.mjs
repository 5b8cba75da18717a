// The official TypeScript v2 client (@modelcontextprotocol/client) of either era, with a bearer
// token, against toolwarden's `/mcp`, for tests/e2e/test_auth.py:
//
//   node tests/e2e/ts_auth_client.mjs legacy|2026-07-28 URL TOKEN TEXT
//
// The token goes in every request's `Authorization` header (`requestInit`). It lists the tools,
// calls `test__echo` with TEXT and prints what it saw as one JSON line.
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';

const [mode, url, token, echo] = process.argv.slice(2);

const client = new Client(
  { name: 'toolwarden-e2e-ts-auth', version: '0.0.0' },
  { versionNegotiation: { mode: mode === 'legacy' ? 'legacy' : { pin: mode } } },
);
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
await client.connect(transport);

const out = {};
out.tools = (await client.listTools()).tools.map((t) => t.name);
const result = await client.callTool({ name: 'test__echo', arguments: { text: echo } });
out.isError = result.isError ?? false;
out.text = result.content.filter((c) => c.type === 'text').map((c) => c.text).join('\n');
out.outcome = result._meta?.['toolwarden/outcome'] ?? null;
await client.close();
console.log(JSON.stringify(out));
