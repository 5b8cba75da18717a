"""A real server of the current MCP revision (2026-07-28) behind toolwarden, used by a client of
the handshake era: the official Python SDK on both sides (`stateless_server.py` as
`[servers.py]`, `mcp.Client` in `mode="legacy"`). toolwarden speaks 2026-07-28 to the server
and the handshake revision to the client: the server's `input_required` reaches the client as
an ordinary `elicitation/create`, and the server's progress as the client's own.

The SDK's server speaks both eras, which toolwarden reaches in the handshake era by default
(`protocol = "auto"`); here it is pinned to 2026-07-28 (`protocol = "2026-07-28"`), the
revision under test.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import Setup, add_config, gateway, outcome, text, toml_str

import mcp.types as types

pytestmark = pytest.mark.anyio

SERVER = Path(__file__).resolve().parent / "stateless_server.py"


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(params=["stdio", "http"])
def transport(request) -> str:
    return request.param


def add_python_server(setup: Setup) -> None:
    add_config(
        setup,
        "[servers.py]\n"
        f"command = {toml_str(sys.executable)}\n"
        f"args = [{toml_str(SERVER)}, {toml_str(setup.mark)}]\n"
        'protocol = "2026-07-28"\n',
    )


async def test_a_2026_server_is_used_by_a_handshake_client(setup: Setup, transport: str):
    add_python_server(setup)
    asked: list[str] = []

    async def elicit(context, params: types.ElicitRequestParams):
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"word": "Hello"})

    async with gateway(setup, transport, mode="legacy", elicitation_callback=elicit) as client:
        result = await client.call_tool("py__era")
        assert text(result) == "2026-07-28", result
        assert outcome(result)["status"] == "ok"

        result = await client.call_tool("py__greet", {"name": "Ada"})
        assert not result.is_error, result
        assert text(result) == "Hello, Ada!"
        assert asked == ["How should Ada be greeted?"]

        seen: list[float] = []

        async def progress(value: float, total: float | None, message: str | None) -> None:
            seen.append(value)

        result = await client.call_tool("py__slow", {"seconds": 0.5}, progress_callback=progress)
        assert text(result) == "slept"
        assert seen and seen == sorted(seen), seen
