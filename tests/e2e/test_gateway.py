"""The MCP gateway (docs/GATEWAY.md) on the real binary, driven by the official Python MCP SDK.

Every test runs over both transports: stdio (`toolwarden mcp`, started by the SDK's stdio
client, which also stops it: stdin closed, then SIGTERM, then SIGKILL) and Streamable HTTP
(`toolwarden serve` at `/mcp`, stopped with SIGTERM and expected to exit 0). The backend is
`tw-test-server` as `[servers.test]`, so tools are `test__NAME`. After each test no process
of it may be left (the `setup` fixture checks).
"""

from __future__ import annotations

import random
import time

import anyio
import pytest
from conftest import Setup, add_config, gateway, outcome, text

pytestmark = pytest.mark.anyio

TRANSPORTS = ["stdio", "http"]


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(params=TRANSPORTS)
def transport(request) -> str:
    return request.param


async def status(client) -> dict:
    """`toolwarden__status` of the client's session, as structured content."""
    result = await client.call_tool("toolwarden__status")
    assert not result.is_error, result
    return result.structured_content


async def wait_running(client, tool: str, timeout: float = 10.0) -> dict:
    """Waits until the session's status lists a running call of `tool`; that call."""
    with anyio.fail_after(timeout):
        while True:
            for call in (await status(client))["running"]:
                if call["tool"] == tool and call["state"] == "running":
                    return call
            await anyio.sleep(0.05)


async def test_lists_the_servers_tools_prefixed_and_the_status_tool(setup: Setup, transport: str):
    async with gateway(setup, transport) as client:
        assert client.server_info.name == "toolwarden"
        tools = {t.name: t for t in (await client.list_tools()).tools}
        for name in ["test__echo", "test__sleep", "test__progress", "test__hang", "test__cancels"]:
            assert name in tools, sorted(tools)
        assert not [n for n in tools if n != "toolwarden__status" and not n.startswith("test__")]
        # Schemas and annotations pass through, renamed.
        assert tools["test__echo"].input_schema["properties"]["text"] == {"type": "string"}
        assert tools["test__echo"].annotations.read_only_hint is True
        assert tools["test__wipe"].annotations.destructive_hint is True
        status_tool = tools["toolwarden__status"]
        assert status_tool.annotations.read_only_hint is True
        # The status tool answers for this client's session.
        answer = await status(client)
        assert answer["session_id"].startswith("mcp_"), answer
        assert answer["running"] == []


async def test_a_call_answers_the_tools_content_with_an_ok_outcome(setup: Setup, transport: str):
    async with gateway(setup, transport) as client:
        result = await client.call_tool("test__echo", {"text": "hello through toolwarden"})
        assert result.is_error is False
        assert text(result) == "hello through toolwarden"
        got = outcome(result)
        assert got["status"] == "ok"
        assert got["tool"] == "test__echo"
        assert got["attempts"] == 1
        assert got["turn_id"].startswith("t_")
        assert got["provenance"]["source"] == "tool"
        # Structured content passes through too.
        structured = await client.call_tool("test__echo", {"text": "s", "structured": True})
        assert structured.structured_content == {"text": "s"}
        # An unknown tool is a result the model can read, not a JSON-RPC error.
        unknown = await client.call_tool("test__nope", {})
        assert unknown.is_error is True
        assert outcome(unknown)["status"] == "invalid"
        assert outcome(unknown)["reason"] == "unknown_tool"
        assert text(unknown).startswith("[INVALID]")


async def test_progress_is_relayed_to_the_clients_own_progress_token(setup: Setup, transport: str):
    async with gateway(setup, transport) as client:
        seen: list[tuple[float, float | None, str | None]] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            seen.append((progress, total, message))

        result = await client.call_tool(
            "test__progress", {"every_ms": 40, "count": 5}, progress_callback=on_progress
        )
        assert result.is_error is False, result
        assert text(result) == "done after 5 steps"
        # Every report of the server arrived, in order, under the token the SDK chose (the
        # SDK only calls the callback for its own token), before the result.
        assert seen == [(float(i), 5.0, f"step {i}") for i in range(1, 6)]
        # The server was given a token too: toolwarden's own, not the client's.
        assert result.structured_content["progressToken"] is not None


async def test_a_configured_timeout_is_an_error_result_with_the_outcome(setup: Setup, transport: str):
    add_config(setup, '[tools."test__sleep"]\ntimeout = "300ms"\n')
    async with gateway(setup, transport) as client:
        started = time.monotonic()
        result = await client.call_tool("test__sleep", {"ms": 30000})
        elapsed = time.monotonic() - started
        assert result.is_error is True
        got = outcome(result)
        assert (got["status"], got["kind"], got["after_ms"]) == ("timeout", "total", 300), got
        assert got["tool"] == "test__sleep"
        assert text(result).startswith('[TIMEOUT] Tool "test__sleep" exceeded its wall-clock limit of 300ms')
        assert elapsed < 5, f"the timeout came after {elapsed:.2f}s"
        # The session's status remembers it.
        assert "test__sleep" in (await status(client))["timed_out_tools"]


async def test_a_timeout_hint_in_meta_replaces_the_tools_timeout(setup: Setup, transport: str):
    async with gateway(setup, transport) as client:
        result = await client.call_tool("test__sleep", {"ms": 30000}, meta={"timeout_ms": 250})
        assert result.is_error is True
        got = outcome(result)
        assert (got["status"], got["kind"], got["after_ms"]) == ("timeout", "total", 250), got
        assert text(result).startswith("[TIMEOUT]")
        # An idle deadline, through toolwarden's own hint: no progress for 200 ms.
        idle = await client.call_tool(
            "test__hang", {}, meta={"timeout_ms": 10000, "toolwarden/idle_timeout_ms": 200}
        )
        got = outcome(idle)
        assert (got["status"], got["kind"], got["after_ms"]) == ("timeout", "idle", 200), got


async def test_a_client_cancel_reaches_the_backend_server(setup: Setup, transport: str):
    # A long call with a unique input, to find it among the server's cancels.
    args = {"every_ms": 50, "count": 100_000 + random.randrange(100_000)}
    async with gateway(setup, transport) as client:
        reported = anyio.Event()

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            reported.set()

        async with anyio.create_task_group() as tg:

            async def call() -> None:
                await client.call_tool("test__progress", args, progress_callback=on_progress)
                pytest.fail("the cancelled call answered")

            tg.start_soon(call)
            # Its progress proves the server runs it (a call cancelled before its request
            # reached the server would have nothing to cancel there).
            with anyio.fail_after(10):
                await reported.wait()
            running = await wait_running(client, "test__progress")
            # Cancelling the scope that awaits call_tool makes the SDK send
            # notifications/cancelled for the request.
            tg.cancel_scope.cancel()

        # toolwarden ended the call as the user's cancel ...
        with anyio.fail_after(10):
            while True:
                failures = (await status(client))["recent_failures"]
                ended = [f for f in failures if f["call_id"] == running["call_id"]]
                if ended:
                    break
                await anyio.sleep(0.05)
        assert (ended[0]["status"], ended[0]["reason"]) == ("cancelled", "user"), ended
        # ... and told the server, for that request only.
        with anyio.fail_after(10):
            while True:
                cancels = (await client.call_tool("test__cancels")).structured_content["cancels"]
                mine = [c for c in cancels if c["arguments"] == args]
                if mine:
                    break
                await anyio.sleep(0.05)
        assert len(cancels) == 1, cancels
        assert mine[0]["tool"] == "progress"
        assert mine[0]["reason"] == "user"
        assert (await status(client))["running"] == []
