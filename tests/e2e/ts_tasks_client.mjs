// The official TypeScript SDK (@modelcontextprotocol/sdk 1.x), a handshake client of the
// 2025-11-25 revision that declares its experimental `tasks` capability, against toolwarden's
// gateway over Streamable HTTP or stdio. Run by tests/e2e/test_gateway_tasks.py:
//
//   node tests/e2e/ts_tasks_client.mjs MODE http URL
//   node tests/e2e/ts_tasks_client.mjs MODE stdio TOOLWARDEN_BIN CONFIG
//
// MODE `result`: a task for a slow sleep, polled to its result; `cancel`: a task for a long
// sleep, cancelled.
//
// It prints what it saw as one JSON line; the test asserts on it.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';

const [mode, transportKind, target, config] = process.argv.slice(2);

const client = new Client(
  { name: 'toolwarden-e2e-ts-tasks', version: '0.0.0' },
  { capabilities: { tasks: { list: {}, cancel: {} } } },
);
await client.connect(
  transportKind === 'http'
    ? new StreamableHTTPClientTransport(new URL(target))
    : new StdioClientTransport({ command: target, args: ['mcp', '--config', config], stderr: 'inherit' }),
);

const out = {
  protocolVersion: client.transport?.protocolVersion ?? null,
  tasksCapability: client.getServerCapabilities()?.tasks ?? null,
};

if (mode === 'result') {
  // Which tools may run as a task (execution.taskSupport).
  const tools = (await client.listTools()).tools;
  out.taskSupport = Object.fromEntries(tools.map((t) => [t.name, t.execution?.taskSupport ?? null]));
  // The SDK's own task flow: tools/call with params.task, tasks/get at the task's
  // pollInterval until it is terminal, then tasks/result.
  const seen = [];
  const stream = client.experimental.tasks.callToolStream(
    { name: 'test__sleep', arguments: { ms: 2500 } },
    CallToolResultSchema,
    { task: { ttl: 60000 } },
  );
  const started = Date.now();
  for await (const message of stream) {
    if (message.type === 'taskCreated') {
      out.created = message.task;
      out.createdAfterMs = Date.now() - started;
      out.listed = (await client.experimental.tasks.listTasks()).tasks.map((t) => t.taskId);
    } else if (message.type === 'taskStatus') {
      seen.push(message.task.status);
    } else if (message.type === 'result') {
      out.result = message.result;
    } else if (message.type === 'error') {
      out.error = String(message.error);
    }
  }
  out.tookMs = Date.now() - started;
  out.statuses = seen;
  out.final = await client.experimental.tasks.getTask(out.created.taskId);
} else if (mode === 'cancel') {
  const stream = client.experimental.tasks.callToolStream(
    { name: 'test__sleep', arguments: { ms: 60000 } },
    CallToolResultSchema,
    { task: { ttl: 60000 } },
  );
  for await (const message of stream) {
    if (message.type === 'taskCreated') {
      out.created = message.task;
      break;
    }
  }
  // Let the server start its sleep, then cancel the task.
  await new Promise((resolve) => setTimeout(resolve, 500));
  out.cancelled = await client.experimental.tasks.cancelTask(out.created.taskId);
  out.final = await client.experimental.tasks.getTask(out.created.taskId);
  // The test server counts the cancels it saw.
  const deadline = Date.now() + 10000;
  for (;;) {
    const r = await client.callTool({ name: 'test__cancels', arguments: {} });
    out.cancels = r.structuredContent.cancels;
    if (out.cancels.some((c) => c.tool === 'sleep') || Date.now() > deadline) break;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
} else {
  throw new Error(`unknown mode ${mode}`);
}

await client.close();
process.stdout.write(JSON.stringify(out) + '\n');
