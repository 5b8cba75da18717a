"""The gateway to the official TypeScript v2 client (`@modelcontextprotocol/client`, pinned in
package.json), speaking the stateless revision 2026-07-28, over stdio and Streamable HTTP.

`ts_client.mjs` (run with `node_modules/.bin/node`) lists, calls with progress, hits a
timeout, cancels a call, and answers an approval asked through `input_required`; it prints what
it saw as JSON, which this test checks.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, Setup, add_config, node_bin_dir, serve, toolwarden_bin

SCRIPT = Path(__file__).with_name("ts_client.mjs")


@pytest.fixture(params=["stdio", "http"])
def transport(request) -> str:
    return request.param


def run_client(setup: Setup, transport: str) -> dict:
    node = node_bin_dir() / "node"
    if transport == "stdio":
        argv = [str(node), str(SCRIPT), "stdio", str(toolwarden_bin()), str(setup.config)]
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    else:
        with serve(setup.dir, setup.config) as served:
            served.wait_stderr(r'server "test" is up', 30)
            argv = [str(node), str(SCRIPT), "http", served.url + "/mcp"]
            done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_typescript_v2_client_on_2026_07_28(setup: Setup, transport: str):
    add_config(
        setup,
        '[tools."test__sleep"]\ntimeout = "300ms"\n\n[tools."test__echo"]\napproval = "ask"\n',
    )
    seen = run_client(setup, transport)

    assert {"test__echo", "test__progress", "test__sleep", "toolwarden__status"} <= set(seen["tools"])

    progress = seen["progress"]
    assert progress["text"] == "done after 3 steps"
    assert progress["outcome"]["status"] == "ok"
    # In order, under the client's token. (The server's last report can reach toolwarden's
    # backend just after the server's answer; a report after the result is dropped, never sent
    # after it.)
    expected = [[float(i), 3.0, f"step {i}"] for i in range(1, 4)]
    assert len(progress["reports"]) >= 2 and progress["reports"] == expected[: len(progress["reports"])]

    timeout = seen["timeout"]
    assert timeout["isError"] is True
    assert (timeout["outcome"]["status"], timeout["outcome"]["after_ms"]) == ("timeout", 300)

    cancel = seen["cancel"]
    assert cancel["call"].startswith("rejected"), cancel
    assert cancel["server"] is not None, f"the server never heard of the cancel: {seen}"
    expected = "client_disconnect" if transport == "http" else "user"
    assert cancel["server"]["reason"] == expected, cancel

    approval = seen["approval"]
    assert approval["text"] == "approved", approval
    assert approval["outcome"]["status"] == "ok"
    assert len(approval["asked"]) == 1 and "test__echo" in approval["asked"][0]

    status = seen["status"]
    assert status["session_id"].startswith("mcp_"), status
    assert status["counts"].get("ok", 0) >= 2, status
