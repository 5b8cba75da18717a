// A conformance reference server: an MCP server that implements what the official conformance
// suite's server scenarios ask for (tools `test_*`, resources `test://...`, prompts, completion,
// logging), written for these tests with the official TypeScript SDK (pinned in package.json),
// from the requirements each scenario states (`conformance list --server`, and the suite's
// scenario descriptions). `@modelcontextprotocol/server-everything` does not implement them,
// so against it most feature scenarios fail both directly and through toolwarden and prove
// nothing; against this server they pass directly, so the gateway must pass them too.
//
//   node conformance_server.mjs stdio          MCP over stdin/stdout
//   node conformance_server.mjs http PORT      Streamable HTTP at http://127.0.0.1:PORT/mcp
//                                              (stateful sessions, Host checked against
//                                              DNS rebinding); prints "listening on PORT"

import { randomUUID } from "node:crypto";
import { createServer } from "node:http";

import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import {
  CallToolRequestSchema,
  CompleteRequestSchema,
  CreateMessageResultSchema,
  ElicitResultSchema,
  GetPromptRequestSchema,
  ListPromptsRequestSchema,
  ListResourcesRequestSchema,
  ListResourceTemplatesRequestSchema,
  ListToolsRequestSchema,
  McpError,
  ReadResourceRequestSchema,
  SetLevelRequestSchema,
  SubscribeRequestSchema,
  UnsubscribeRequestSchema,
} from "@modelcontextprotocol/sdk/types.js";

// A 1x1 red PNG, and a WAV of 8 silent samples.
const PNG =
  "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
const WAV = Buffer.concat([
  Buffer.from("RIFF"), u32(36 + 8), Buffer.from("WAVEfmt "), u32(16), u16(1), u16(1),
  u32(8000), u32(8000), u16(1), u16(8), Buffer.from("data"), u32(8), Buffer.alloc(8, 128),
]).toString("base64");

function u16(n) { const b = Buffer.alloc(2); b.writeUInt16LE(n); return b; }
function u32(n) { const b = Buffer.alloc(4); b.writeUInt32LE(n); return b; }
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const noArgs = { type: "object", properties: {} };

const TOOLS = [
  { name: "test_simple_text", description: "Returns simple text.", inputSchema: noArgs },
  { name: "test_image_content", description: "Returns an image.", inputSchema: noArgs },
  { name: "test_audio_content", description: "Returns audio.", inputSchema: noArgs },
  { name: "test_embedded_resource", description: "Returns an embedded resource.", inputSchema: noArgs },
  { name: "test_multiple_content_types", description: "Returns text, an image and a resource.", inputSchema: noArgs },
  { name: "test_tool_with_logging", description: "Sends three log messages while it runs.", inputSchema: noArgs },
  { name: "test_error_handling", description: "Always fails.", inputSchema: noArgs },
  { name: "test_tool_with_progress", description: "Reports progress 0, 50, 100 of 100.", inputSchema: noArgs },
  {
    name: "test_sampling",
    description: "Asks the client's model.",
    inputSchema: { type: "object", properties: { prompt: { type: "string" } }, required: ["prompt"] },
  },
  {
    name: "test_elicitation",
    description: "Asks the client's user.",
    inputSchema: { type: "object", properties: { message: { type: "string" } }, required: ["message"] },
  },
  { name: "test_elicitation_sep1034_defaults", description: "Elicitation with defaults (SEP-1034).", inputSchema: noArgs },
  { name: "test_elicitation_sep1330_enums", description: "Elicitation with enums (SEP-1330).", inputSchema: noArgs },
  {
    name: "json_schema_2020_12_tool",
    description: "Tool with JSON Schema 2020-12 features",
    inputSchema: {
      $schema: "https://json-schema.org/draft/2020-12/schema",
      type: "object",
      $defs: {
        address: { type: "object", properties: { street: { type: "string" }, city: { type: "string" } } },
      },
      properties: { name: { type: "string" }, address: { $ref: "#/$defs/address" } },
      additionalProperties: false,
    },
  },
];

const text = (t) => ({ type: "text", text: t });

async function callTool(server, { name, arguments: args = {}, _meta }, extra) {
  const log = (data) =>
    extra.sendNotification({ method: "notifications/message", params: { level: "info", logger: "conformance", data } });
  switch (name) {
    case "test_simple_text":
      return { content: [text("This is a simple text response for testing.")] };
    case "test_image_content":
      return { content: [{ type: "image", data: PNG, mimeType: "image/png" }] };
    case "test_audio_content":
      return { content: [{ type: "audio", data: WAV, mimeType: "audio/wav" }] };
    case "test_embedded_resource":
      return {
        content: [{
          type: "resource",
          resource: { uri: "test://embedded-resource", mimeType: "text/plain", text: "This is an embedded resource content." },
        }],
      };
    case "test_multiple_content_types":
      return {
        content: [
          text("Multiple content types test:"),
          { type: "image", data: PNG, mimeType: "image/png" },
          {
            type: "resource",
            resource: { uri: "test://mixed-content-resource", mimeType: "application/json", text: '{"test":"data","value":123}' },
          },
        ],
      };
    case "test_tool_with_logging":
      await log("Tool execution started");
      await sleep(50);
      await log("Tool processing data");
      await sleep(50);
      await log("Tool execution completed");
      return { content: [text("Tool with logging executed successfully")] };
    case "test_error_handling":
      return { isError: true, content: [text("This tool intentionally returns an error for testing")] };
    case "test_tool_with_progress": {
      const token = _meta?.progressToken;
      for (const [i, progress] of [0, 50, 100].entries()) {
        if (i > 0) await sleep(50);
        if (token !== undefined) {
          await extra.sendNotification({ method: "notifications/progress", params: { progressToken: token, progress, total: 100 } });
        }
      }
      return { content: [text("Tool with progress executed successfully")] };
    }
    case "test_sampling": {
      const answer = await extra.sendRequest(
        {
          method: "sampling/createMessage",
          params: { messages: [{ role: "user", content: text(String(args.prompt ?? "")) }], maxTokens: 100 },
        },
        CreateMessageResultSchema,
      );
      const said = answer.content?.type === "text" ? answer.content.text : JSON.stringify(answer.content);
      return { content: [text(`LLM response: ${said}`)] };
    }
    case "test_elicitation":
      return elicit(extra, String(args.message ?? ""), {
        type: "object",
        properties: {
          username: { type: "string", description: "User's response" },
          email: { type: "string", description: "User's email address" },
        },
        required: ["username", "email"],
      }, "User response");
    case "test_elicitation_sep1034_defaults":
      return elicit(extra, "Please review and update the form fields with defaults", {
        type: "object",
        properties: {
          name: { type: "string", description: "User name", default: "John Doe" },
          age: { type: "integer", description: "User age", default: 30 },
          score: { type: "number", description: "User score", default: 95.5 },
          status: { type: "string", description: "User status", enum: ["active", "inactive", "pending"], default: "active" },
          verified: { type: "boolean", description: "Verification status", default: true },
        },
      }, "Elicitation completed");
    case "test_elicitation_sep1330_enums":
      return elicit(extra, "Please select options from the enum fields", {
        type: "object",
        properties: {
          untitledSingle: { type: "string", enum: ["option1", "option2", "option3"] },
          titledSingle: {
            type: "string",
            oneOf: [
              { const: "value1", title: "First Option" },
              { const: "value2", title: "Second Option" },
              { const: "value3", title: "Third Option" },
            ],
          },
          legacyEnum: { type: "string", enum: ["opt1", "opt2", "opt3"], enumNames: ["Option One", "Option Two", "Option Three"] },
          untitledMulti: { type: "array", items: { type: "string", enum: ["option1", "option2", "option3"] } },
          titledMulti: {
            type: "array",
            items: {
              anyOf: [
                { const: "value1", title: "First Choice" },
                { const: "value2", title: "Second Choice" },
                { const: "value3", title: "Third Choice" },
              ],
            },
          },
        },
      }, "Elicitation completed");
    case "json_schema_2020_12_tool":
      return { content: [text(`Received: ${JSON.stringify(args)}`)] };
    default:
      throw new McpError(-32602, `Tool ${name} not found`);
  }
}

async function elicit(extra, message, requestedSchema, label) {
  const answer = await extra.sendRequest(
    { method: "elicitation/create", params: { message, requestedSchema } },
    ElicitResultSchema,
  );
  return { content: [text(`${label}: action=${answer.action}, content=${JSON.stringify(answer.content ?? {})}`)] };
}

const RESOURCES = [
  { uri: "test://static-text", name: "static-text", description: "A static text resource", mimeType: "text/plain" },
  { uri: "test://static-binary", name: "static-binary", description: "A static binary resource (PNG)", mimeType: "image/png" },
  { uri: "test://watched-resource", name: "watched-resource", description: "A resource to subscribe to", mimeType: "text/plain" },
];

function readResource(uri) {
  if (uri === "test://static-text") {
    return { contents: [{ uri, mimeType: "text/plain", text: "This is the content of the static text resource." }] };
  }
  if (uri === "test://static-binary") return { contents: [{ uri, mimeType: "image/png", blob: PNG }] };
  if (uri === "test://watched-resource") return { contents: [{ uri, mimeType: "text/plain", text: "Watched." }] };
  const templated = /^test:\/\/template\/([^/]+)\/data$/.exec(uri);
  if (templated) {
    const id = templated[1];
    return {
      contents: [{
        uri,
        mimeType: "application/json",
        text: JSON.stringify({ id, templateTest: true, data: `Data for ID: ${id}` }),
      }],
    };
  }
  throw new McpError(-32002, `Resource ${uri} not found`);
}

const PROMPTS = [
  { name: "test_simple_prompt", description: "A simple prompt without arguments" },
  {
    name: "test_prompt_with_arguments",
    description: "A prompt with two required arguments",
    arguments: [
      { name: "arg1", description: "First test argument", required: true },
      { name: "arg2", description: "Second test argument", required: true },
    ],
  },
  {
    name: "test_prompt_with_embedded_resource",
    description: "A prompt that embeds a resource",
    arguments: [{ name: "resourceUri", description: "URI of the resource to embed", required: true }],
  },
  { name: "test_prompt_with_image", description: "A prompt with an image" },
];

function getPrompt({ name, arguments: args = {} }) {
  const user = (content) => ({ role: "user", content });
  switch (name) {
    case "test_simple_prompt":
      return { messages: [user(text("This is a simple prompt for testing."))] };
    case "test_prompt_with_arguments":
      return { messages: [user(text(`Prompt with arguments: arg1='${args.arg1}', arg2='${args.arg2}'`))] };
    case "test_prompt_with_embedded_resource":
      return {
        messages: [
          user({ type: "resource", resource: { uri: args.resourceUri, mimeType: "text/plain", text: "Embedded resource content for testing." } }),
          user(text("Please process the embedded resource above.")),
        ],
      };
    case "test_prompt_with_image":
      return {
        messages: [user({ type: "image", data: PNG, mimeType: "image/png" }), user(text("Please analyze the image above."))],
      };
    default:
      throw new McpError(-32602, `Prompt ${name} not found`);
  }
}

function makeServer() {
  const server = new Server(
    { name: "tw-conformance-server", version: "1.0.0" },
    {
      capabilities: {
        tools: { listChanged: true },
        resources: { subscribe: true, listChanged: true },
        prompts: { listChanged: true },
        logging: {},
        completions: {},
      },
    },
  );
  server.setRequestHandler(ListToolsRequestSchema, async () => ({ tools: TOOLS }));
  server.setRequestHandler(CallToolRequestSchema, async (request, extra) => callTool(server, request.params, extra));
  server.setRequestHandler(ListResourcesRequestSchema, async () => ({ resources: RESOURCES }));
  server.setRequestHandler(ListResourceTemplatesRequestSchema, async () => ({
    resourceTemplates: [{
      uriTemplate: "test://template/{id}/data",
      name: "template",
      description: "A resource template",
      mimeType: "application/json",
    }],
  }));
  server.setRequestHandler(ReadResourceRequestSchema, async (request) => readResource(request.params.uri));
  server.setRequestHandler(SubscribeRequestSchema, async () => ({}));
  server.setRequestHandler(UnsubscribeRequestSchema, async () => ({}));
  server.setRequestHandler(ListPromptsRequestSchema, async () => ({ prompts: PROMPTS }));
  server.setRequestHandler(GetPromptRequestSchema, async (request) => getPrompt(request.params));
  server.setRequestHandler(CompleteRequestSchema, async (request) => {
    const prefix = String(request.params.argument?.value ?? "");
    const values = ["paris", "park", "party", "test", "testing"].filter((v) => v.startsWith(prefix));
    return { completion: { values, total: values.length, hasMore: false } };
  });
  server.setRequestHandler(SetLevelRequestSchema, async () => ({}));
  return server;
}

async function serveHttp(port) {
  const sessions = new Map();
  const loopback = /^(localhost|127\.0\.0\.1|\[::1\])(:\d+)?$/;
  const http = createServer(async (req, res) => {
    const url = new URL(req.url ?? "/", "http://localhost");
    // DNS-rebinding protection: loopback names only, in Host and (when sent) Origin.
    const origin = req.headers.origin;
    const originHost = origin ? (() => { try { return new URL(origin).host; } catch { return "bad"; } })() : null;
    if (!loopback.test(req.headers.host ?? "") || (originHost !== null && !loopback.test(originHost))) {
      res.writeHead(403, { "content-type": "application/json" }).end(
        JSON.stringify({ jsonrpc: "2.0", error: { code: -32000, message: "Forbidden: Host or Origin not allowed" }, id: null }),
      );
      return;
    }
    if (url.pathname !== "/mcp") {
      res.writeHead(404).end();
      return;
    }
    let body;
    if (req.method === "POST") {
      const chunks = [];
      for await (const chunk of req) chunks.push(chunk);
      try {
        body = JSON.parse(Buffer.concat(chunks).toString("utf8"));
      } catch {
        res.writeHead(400).end();
        return;
      }
    }
    const id = req.headers["mcp-session-id"];
    let transport = typeof id === "string" ? sessions.get(id) : undefined;
    if (!transport) {
      if (id !== undefined || req.method !== "POST" || body?.method !== "initialize") {
        res.writeHead(id !== undefined ? 404 : 400, { "content-type": "application/json" }).end(
          JSON.stringify({ jsonrpc: "2.0", error: { code: -32000, message: "No valid session" }, id: null }),
        );
        return;
      }
      transport = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        onsessioninitialized: (sid) => sessions.set(sid, transport),
      });
      transport.onclose = () => transport.sessionId && sessions.delete(transport.sessionId);
      await makeServer().connect(transport);
    }
    await transport.handleRequest(req, res, body);
  });
  http.listen(port, "127.0.0.1", () => console.log(`listening on ${http.address().port}`));
}

const [mode, port] = process.argv.slice(2);
if (mode === "stdio") {
  await makeServer().connect(new StdioServerTransport());
} else if (mode === "http") {
  await serveHttp(Number(port ?? 0));
} else {
  console.error("usage: conformance_server.mjs stdio | http PORT");
  process.exit(2);
}
