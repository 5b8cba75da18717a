// The official TypeScript v2 client (@modelcontextprotocol/client) of either era against a server
// behind toolwarden (or directly), for tests/e2e/test_gateway_eras.py:
//
//   node tests/e2e/ts_eras_client.mjs legacy|2026-07-28 PREFIX|- http URL
//   node tests/e2e/ts_eras_client.mjs legacy|2026-07-28 PREFIX|- stdio COMMAND ARGS...
//
// A tool's mid-call elicitation, sampling and roots (answered here), and a resource's update
// (`resources/subscribe` for a handshake client, `subscriptions/listen` for a stateless one);
// it prints what it saw as one JSON line.
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';

const [mode, prefixArg, transportKind, target, ...args] = process.argv.slice(2);
const prefix = prefixArg === '-' ? '' : prefixArg;
const HELLO = 'test://static/hello';

const client = new Client(
  { name: 'toolwarden-e2e-ts-eras', version: '0.0.0' },
  {
    capabilities: { elicitation: { form: {} }, sampling: {}, roots: {} },
    versionNegotiation: { mode: mode === 'legacy' ? 'legacy' : { pin: mode } },
  },
);
const asked = [];
client.setRequestHandler('elicitation/create', async (request) => {
  asked.push('elicit');
  return { action: 'accept', content: { answer: 'forty-two' } };
});
client.setRequestHandler('sampling/createMessage', async () => {
  asked.push('sample');
  return { role: 'assistant', content: { type: 'text', text: "a model's reply" }, model: 'test-model' };
});
client.setRequestHandler('roots/list', async () => {
  asked.push('roots');
  return { roots: [{ uri: 'file:///work', name: 'work' }] };
});
const updates = [];
let updated;
const gotUpdate = new Promise((resolve) => {
  updated = resolve;
});
client.setNotificationHandler('notifications/resources/updated', (n) => {
  updates.push(n.params.uri);
  updated();
});

const transport =
  transportKind === 'http'
    ? new StreamableHTTPClientTransport(new URL(target))
    : new StdioClientTransport({ command: target, args, stderr: 'inherit' });
await client.connect(transport);

const text = (r) => r.content.filter((c) => c.type === 'text').map((c) => c.text).join('\n');
const call = async (name, args) => {
  const r = await client.callTool({ name: `${prefix}${name}`, arguments: args });
  if (r.isError) throw new Error(`${name} failed: ${JSON.stringify(r)}`);
  return text(r);
};

const out = {};
out.elicit = JSON.parse(await call('elicit', { message: 'What is it?' }));
out.sample = await call('sample', { prompt: 'Say something' });
out.roots = JSON.parse(await call('roots', {}));

// A deadline that does not keep the process alive once what it guards has come.
const timeout = (ms, what) =>
  new Promise((_, reject) => setTimeout(() => reject(new Error(`no ${what} within ${ms} ms`)), ms).unref());
if (mode === 'legacy') {
  await client.subscribeResource({ uri: HELLO });
  await call('touch', { uri: HELLO });
  await Promise.race([gotUpdate, timeout(10000, 'resource update')]);
  await client.unsubscribeResource({ uri: HELLO });
} else {
  const sub = await client.listen({ resourceSubscriptions: [HELLO] });
  out.honored = sub.honoredFilter;
  await call('touch', { uri: HELLO });
  await Promise.race([gotUpdate, timeout(10000, 'resource update')]);
  await sub.close();
}
out.update = updates[0];
out.asked = asked;
await client.close();
console.log(JSON.stringify(out));
