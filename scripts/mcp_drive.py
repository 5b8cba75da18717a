"""Drives `tools/call` of `echo` through a toolwarden `/mcp` (or `mcp-relay`'s) for
scripts/gateway-instructions.sh.

usage: mcp_drive.py HOST:PORT handshake|stateless N

One keep-alive connection. A handshake client initializes first and calls in its session; a
stateless (2026-07-28) client sends its `_meta` envelope and the `Mcp-Method`/`Mcp-Name` headers
with every call. After 500 warm-up calls it prints `ready` and waits for a line on stdin; then it
makes N calls and prints `done`. Every answer must be a successful `echo`.
"""

import http.client
import json
import sys

address, kind, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
host, port = address.rsplit(":", 1)
connection = http.client.HTTPConnection(host, int(port))
BASE = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


def post(body, headers):
    connection.request("POST", "/mcp", body=json.dumps(body), headers={**BASE, **headers})
    response = connection.getresponse()
    return response, response.read()


if kind == "handshake":
    response, _ = post(
        {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "mcp_drive", "version": "1"}}},
        {},
    )
    headers = {"mcp-protocol-version": "2025-06-18"}
    session = response.getheader("mcp-session-id")
    if session is not None:  # a server that keeps no session (mcp-relay) names none
        headers["mcp-session-id"] = session
    post({"jsonrpc": "2.0", "method": "notifications/initialized"}, headers)
    meta = None
elif kind == "stateless":
    headers = {"mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call",
               "mcp-name": "echo"}
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "mcp_drive", "version": "1"}}
else:
    sys.exit(f"unknown client kind {kind!r}: handshake or stateless")


def call(i):
    params = {"name": "echo", "arguments": {"text": "hello"}}
    if meta is not None:
        params["_meta"] = meta
    _, answer = post({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": params},
                     headers)
    if b'"isError":false' not in answer:
        sys.exit(f"echo failed: {answer!r}")


for i in range(1, 501):
    call(i)
print("ready", flush=True)
sys.stdin.readline()
for i in range(1000, 1000 + count):
    call(i)
print("done", flush=True)
