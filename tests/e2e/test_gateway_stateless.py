"""The MCP gateway to clients of the stateless revision 2026-07-28 (docs/GATEWAY.md, "Both eras"),
on the real binary, driven by the official Python MCP SDK pinned to that revision
(`Client(..., mode="2026-07-28")`: no `initialize`, every request carrying its own `_meta`
envelope, and over HTTP the `Mcp-Method`/`Mcp-Name` headers).

Every test runs over stdio (`toolwarden mcp`) and Streamable HTTP (`toolwarden serve` at `/mcp`).
The backend is `tw-test-server` as `[servers.test]`, an ordinary handshake server: toolwarden
translates between the eras.
"""

from __future__ import annotations

import random

import anyio
import pytest
from conftest import Setup, add_config, gateway, outcome, text

pytestmark = pytest.mark.anyio

STATELESS = "2026-07-28"


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(params=["stdio", "http"])
def transport(request) -> str:
    return request.param


async def status(client) -> dict:
    result = await client.call_tool("toolwarden__status")
    assert not result.is_error, result
    return result.structured_content


async def test_a_stateless_client_lists_and_calls(setup: Setup, transport: str):
    async with gateway(setup, transport, mode=STATELESS) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        for name in ["test__echo", "test__sleep", "test__progress", "toolwarden__status"]:
            assert name in tools, sorted(tools)
        assert tools["test__echo"].input_schema["properties"]["text"] == {"type": "string"}
        result = await client.call_tool("test__echo", {"text": "stateless through toolwarden"})
        assert result.is_error is False, result
        assert text(result) == "stateless through toolwarden"
        assert outcome(result)["status"] == "ok"
        # Its requests share one governance session: the status tool sees its calls.
        answer = await status(client)
        assert answer["session_id"].startswith("mcp_"), answer
        assert answer["counts"].get("ok", 0) >= 1, answer


async def test_progress_reaches_a_stateless_client_under_its_token(setup: Setup, transport: str):
    async with gateway(setup, transport, mode=STATELESS) as client:
        seen: list[tuple[float, float | None, str | None]] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            seen.append((progress, total, message))

        result = await client.call_tool(
            "test__progress", {"every_ms": 40, "count": 4}, progress_callback=on_progress
        )
        assert result.is_error is False, result
        assert text(result) == "done after 4 steps"
        assert seen == [(float(i), 4.0, f"step {i}") for i in range(1, 5)]


async def test_a_timeout_is_an_error_result_with_the_outcome(setup: Setup, transport: str):
    add_config(setup, '[tools."test__sleep"]\ntimeout = "300ms"\n')
    async with gateway(setup, transport, mode=STATELESS) as client:
        result = await client.call_tool("test__sleep", {"ms": 30000})
        assert result.is_error is True
        got = outcome(result)
        assert (got["status"], got["kind"], got["after_ms"]) == ("timeout", "total", 300), got
        assert text(result).startswith('[TIMEOUT] Tool "test__sleep"')
        hinted = await client.call_tool("test__sleep", {"ms": 30000}, meta={"timeout_ms": 200})
        assert (outcome(hinted)["status"], outcome(hinted)["after_ms"]) == ("timeout", 200)
        assert "test__sleep" in (await status(client))["timed_out_tools"]


async def test_a_stateless_cancel_reaches_the_backend_server(setup: Setup, transport: str):
    # Over HTTP the client cancels by closing the request's response stream; on stdio it
    # sends notifications/cancelled. Either way the server hears of it.
    args = {"every_ms": 50, "count": 100_000 + random.randrange(100_000)}
    async with gateway(setup, transport, mode=STATELESS) as client:
        reported = anyio.Event()

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            reported.set()

        async with anyio.create_task_group() as tg:

            async def call() -> None:
                await client.call_tool("test__progress", args, progress_callback=on_progress)
                pytest.fail("the cancelled call answered")

            tg.start_soon(call)
            with anyio.fail_after(10):
                await reported.wait()
            tg.cancel_scope.cancel()

        with anyio.fail_after(10):
            while True:
                cancels = (await client.call_tool("test__cancels")).structured_content["cancels"]
                mine = [c for c in cancels if c["arguments"] == args]
                if mine:
                    break
                await anyio.sleep(0.05)
        assert mine[0]["tool"] == "progress"
        expected = "client_disconnect" if transport == "http" else "user"
        assert mine[0]["reason"] == expected, mine
        failures = (await status(client))["recent_failures"]
        ended = [f for f in failures if f["tool"] == "test__progress"]
        assert (ended[0]["status"], ended[0]["reason"]) == ("cancelled", expected), ended
        assert (await status(client))["running"] == []


async def test_an_approval_is_answered_through_input_required(setup: Setup, transport: str):
    from mcp import types

    add_config(setup, '[tools."test__echo"]\napproval = "ask"\n')
    asked: list[str] = []

    async def on_elicit(context, params):
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"approve": True})

    async with gateway(setup, transport, mode=STATELESS, elicitation_callback=on_elicit) as client:
        result = await client.call_tool("test__echo", {"text": "approved"})
        assert result.is_error is False, result
        assert text(result) == "approved"
        assert outcome(result)["status"] == "ok"
        assert len(asked) == 1 and "test__echo" in asked[0], asked

    declined: list[str] = []

    async def decline(context, params):
        declined.append(params.message)
        return types.ElicitResult(action="decline")

    async with gateway(setup, transport, mode=STATELESS, elicitation_callback=decline) as client:
        result = await client.call_tool("test__echo", {"text": "no"})
        assert result.is_error is True
        assert outcome(result)["status"] == "denied", outcome(result)
        assert declined
