// The official TypeScript v2 client (@modelcontextprotocol/client), pinned to the stateless
// revision 2026-07-28, against toolwarden's gateway. Run by tests/e2e/test_gateway_ts.py:
//
//   node tests/e2e/ts_client.mjs http URL
//   node tests/e2e/ts_client.mjs stdio TOOLWARDEN_BIN CONFIG
//
// It lists, calls with progress, hits a timeout, cancels a call (its AbortSignal), answers an
// approval asked through input_required, and prints what it saw as one JSON line; the test
// asserts on it.
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';

const [transportKind, target, config] = process.argv.slice(2);

const client = new Client(
  { name: 'toolwarden-e2e-ts', version: '0.0.0' },
  {
    capabilities: { elicitation: { form: {} } },
    versionNegotiation: { mode: { pin: '2026-07-28' } },
  },
);
const asked = [];
client.setRequestHandler('elicitation/create', async (request) => {
  asked.push(request.params.message);
  return { action: 'accept', content: { approve: true } };
});

const transport =
  transportKind === 'http'
    ? new StreamableHTTPClientTransport(new URL(target))
    : new StdioClientTransport({ command: target, args: ['mcp', '--config', config], stderr: 'inherit' });
await client.connect(transport);

const out = {};
const outcome = (r) => (r._meta ?? {})['toolwarden/outcome'] ?? null;
const text = (r) => r.content.filter((c) => c.type === 'text').map((c) => c.text).join('\n');

const tools = await client.listTools();
out.tools = tools.tools.map((t) => t.name).sort();

const progress = [];
const r = await client.callTool(
  { name: 'test__progress', arguments: { every_ms: 40, count: 3 } },
  { onprogress: (p) => progress.push([p.progress, p.total ?? null, p.message ?? null]) },
);
out.progress = { text: text(r), outcome: outcome(r), reports: progress };

const t = await client.callTool({ name: 'test__sleep', arguments: { ms: 30000 } });
out.timeout = { isError: t.isError ?? false, outcome: outcome(t) };

// A cancel: the call's AbortSignal, once the server reported progress (it runs the call).
const cancelArgs = { every_ms: 50, count: 100000 + Math.floor(Math.random() * 100000) };
const abort = new AbortController();
let started;
const startedP = new Promise((resolve) => {
  started = resolve;
});
const cancelled = client
  .callTool(
    { name: 'test__progress', arguments: cancelArgs },
    { onprogress: () => started(), signal: abort.signal },
  )
  .then(
    () => 'answered',
    (e) => `rejected: ${e?.name ?? e}`,
  );
await startedP;
abort.abort();
out.cancel = { call: await cancelled };
const deadline = Date.now() + 10000;
for (;;) {
  const c = await client.callTool({ name: 'test__cancels', arguments: {} });
  if (!c.structuredContent) throw new Error(`test__cancels answered ${JSON.stringify(c)}`);
  const mine = c.structuredContent.cancels.filter((x) => x.arguments?.count === cancelArgs.count);
  if (mine.length > 0) {
    out.cancel.server = mine[0];
    break;
  }
  if (Date.now() > deadline) {
    out.cancel.server = null;
    out.cancel.seen = c.structuredContent.cancels;
    break;
  }
  // Another call between two polls: identical calls in a row would be a loop to toolwarden.
  await client.callTool({ name: 'test__progress', arguments: { every_ms: 1, count: 1 } });
  await new Promise((resolve) => setTimeout(resolve, 50));
}

const a = await client.callTool({ name: 'test__echo', arguments: { text: 'approved' } });
out.approval = { text: text(a), outcome: outcome(a), asked };

const s = await client.callTool({ name: 'toolwarden__status', arguments: {} });
out.status = s.structuredContent;

await client.close();
console.log(JSON.stringify(out));
