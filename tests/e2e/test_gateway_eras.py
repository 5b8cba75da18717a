"""Nothing lost between MCP eras (docs/GATEWAY.md, "Both eras"; docs/MCP-BACKEND.md, "Eras").

A server of both eras (tw-test-server `--era both`) and one of 2026-07-28 alone (`--era
2026-07-28`), each behind toolwarden, with the official Python client of each era: what a client
does with the server directly, it does through toolwarden, with the same results — resource
subscriptions (`resources/subscribe` for a handshake client, `subscriptions/listen` for a
stateless one), a tool's mid-call elicitation and sampling (requests to a handshake client,
`input_required` rounds for a stateless one), and roots.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator

import anyio
import pytest
from conftest import Setup, serve, text
from conftest import test_server_bin as tw_test_server_bin

pytestmark = pytest.mark.anyio

STATELESS = "2026-07-28"
HELLO = "test://static/hello"


@pytest.fixture
def anyio_backend():
    return "asyncio"


def callbacks(seen: list):
    """Client callbacks that answer as a person and a model would, and record what they saw."""
    from mcp import types

    async def elicitation(context, params):
        seen.append(("elicit", params.message))
        return types.ElicitResult(action="accept", content={"answer": "forty-two"})

    async def sampling(context, params):
        seen.append(("sample", params.messages[0].content.text))
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text="a model's reply"),
            model="test-model",
        )

    async def roots(context):
        seen.append(("roots",))
        return types.ListRootsResult(roots=[types.Root(uri="file:///work", name="work")])

    return {"elicitation_callback": elicitation, "sampling_callback": sampling, "list_roots_callback": roots}


@contextlib.asynccontextmanager
async def connect(target, mode: str, seen: list, updates: list) -> AsyncIterator:
    """A client of `mode` to `target` (a stdio server's parameters, or a URL)."""
    from mcp import Client, types

    async def messages(message) -> None:
        root = getattr(message, "root", message)
        if isinstance(root, types.ResourceUpdatedNotification):
            updates.append(str(root.params.uri))

    async with Client(target, mode=mode, message_handler=messages, **callbacks(seen)) as client:
        yield client


async def tool_text(client, name: str, args: dict) -> str:
    result = await client.call_tool(name, args)
    assert not result.is_error, result
    return text(result)


async def scenario(client, mode: str, prefix: str, updates: list) -> dict:
    """What a client of `mode` gets from the server: mid-call questions answered, and a
    resource's update heard."""
    got = {
        "elicit": json.loads(await tool_text(client, f"{prefix}elicit", {"message": "What is it?"})),
        "sample": await tool_text(client, f"{prefix}sample", {"prompt": "Say something"}),
        "roots": json.loads(await tool_text(client, f"{prefix}roots", {})),
    }
    if mode == STATELESS:
        async with client.listen(resource_subscriptions=[HELLO]) as sub:
            assert str(sub.honored.resource_subscriptions) and HELLO in sub.honored.resource_subscriptions
            await tool_text(client, f"{prefix}touch", {"uri": HELLO})
            with anyio.fail_after(10):
                event = await sub.__anext__()
            got["update"] = str(event.uri)
    else:
        await client.subscribe_resource(HELLO)
        await tool_text(client, f"{prefix}touch", {"uri": HELLO})
        with anyio.fail_after(10):
            while not updates:
                await anyio.sleep(0.02)
        got["update"] = updates[0]
        await client.unsubscribe_resource(HELLO)
    return got


@pytest.mark.parametrize("era", ["both", "2026-07-28"])
@pytest.mark.parametrize("mode", ["legacy", STATELESS])
async def test_a_client_of_either_era_gets_from_the_server_through_toolwarden_what_it_gets_directly(
    setup: Setup, era: str, mode: str
):
    from mcp import StdioServerParameters

    if era == STATELESS and mode == "legacy":
        # Directly, a handshake client cannot talk to a 2026-07-28-only server at all; through
        # toolwarden it can (below), so there is no direct run to compare with.
        direct = None
    else:
        seen_direct: list = []
        updates_direct: list = []
        params = StdioServerParameters(command=str(tw_test_server_bin()), args=["--era", era])
        async with connect(params, mode, seen_direct, updates_direct) as client:
            direct = await scenario(client, mode, "", updates_direct)

    setup.config.write_text(
        '[store]\npath = "audit.db"\n\n'
        f'[servers.test]\ncommand = {json.dumps(str(tw_test_server_bin()))}\n'
        f'args = ["--era", "{era}", "--stderr-line", "{setup.mark}"]\n'
    )
    seen: list = []
    updates: list = []
    with serve(setup.dir, setup.config) as served:
        served.wait_stderr(r'server "test" is up', 30)
        async with connect(served.url + "/mcp", mode, seen, updates) as client:
            through = await scenario(client, mode, "test__", updates)
    # The tool got the client's answers, each asked of the client once.
    assert through["elicit"] == {"action": "accept", "content": {"answer": "forty-two"}}, through
    assert through["sample"] == "a model's reply", through
    assert through["roots"]["roots"] == [{"uri": "file:///work", "name": "work"}], through
    assert through["update"] == HELLO
    assert [s[0] for s in seen] == ["elicit", "sample", "roots"], seen
    if direct is not None:
        assert through == direct


TS_SCRIPT = __import__("pathlib").Path(__file__).with_name("ts_eras_client.mjs")


def run_ts(mode: str, transport: list[str], prefix: str) -> dict:
    import subprocess

    from conftest import ROOT, node_bin_dir

    node = node_bin_dir() / "node"
    argv = [str(node), str(TS_SCRIPT), mode, prefix or "-", *transport]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mode", ["legacy", STATELESS])
def test_the_typescript_v2_client_of_either_era_gets_through_toolwarden_what_it_gets_directly(
    setup: Setup, mode: str
):
    direct = run_ts(mode, ["stdio", str(tw_test_server_bin()), "--era", "both"], "")
    setup.config.write_text(
        '[store]\npath = "audit.db"\n\n'
        f'[servers.test]\ncommand = {json.dumps(str(tw_test_server_bin()))}\n'
        f'args = ["--era", "both", "--stderr-line", "{setup.mark}"]\n'
    )
    with serve(setup.dir, setup.config) as served:
        served.wait_stderr(r'server "test" is up', 30)
        through = run_ts(mode, ["http", served.url + "/mcp"], "test__")
    assert through["elicit"] == {"action": "accept", "content": {"answer": "forty-two"}}, through
    assert through["sample"] == "a model's reply", through
    assert through["update"] == HELLO, through
    assert through["asked"] == ["elicit", "sample", "roots"], through
    assert through == direct
