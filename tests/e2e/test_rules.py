"""`[[rules]]` through the MCP gateway, with the official Python client of either era (docs/RULES.md).

tw-test-server as `[servers.test]` (tools `test__NAME`; `test__echo` takes `text`,
`test__sleep` takes `ms`), two token principals (`agent-7` and `alice`, `[[auth.tokens]]` from
environment variables) and two rules:

- `rules[0]`: `test__sleep` is denied to `agent-*`, without a `when`: it is left out of
  agent-7's `tools/list` (alice's has it), and agent-7 calling it by name anyway gets an
  `isError` result whose text gives the rule's reason — a denial, not an unknown tool;
- `rules[1]`: `test__echo` of a text containing `secret` is denied to everyone, with a `when`:
  nobody's list loses `test__echo`, `"my secret"` is an `isError` result giving the reason,
  `"hello"` is echoed.

Over `/mcp` of `toolwarden serve` (each principal's bearer token in an `Authorization` header),
and over stdio (`toolwarden mcp --principal NAME`, or `$TOOLWARDEN_PRINCIPAL`), in
`mode="legacy"` (handshake, session) and `mode="2026-07-28"` (stateless).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import AsyncIterator

import pytest
from conftest import Setup, add_config, outcome, serve, text, toolwarden_bin

pytestmark = pytest.mark.anyio

STATELESS = "2026-07-28"
ERAS = ["legacy", STATELESS]

RULES = """\
[[rules]]
tools = ["test__sleep"]
principals = ["agent-*"]
decision = "deny"
reason = "agents may not sleep"

[[rules]]
tools = ["test__echo"]
when = 'has(args.text) && args.text.contains("secret")'
decision = "deny"
reason = "no secrets"

[[auth.tokens]]
principal = "agent-7"
token_env = "TW_E2E_RULES_AGENT_TOKEN"

[[auth.tokens]]
principal = "alice"
token_env = "TW_E2E_RULES_ALICE_TOKEN"
"""

TOKEN_ENV = {"agent-7": "TW_E2E_RULES_AGENT_TOKEN", "alice": "TW_E2E_RULES_ALICE_TOKEN"}


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def rules(setup: Setup) -> Setup:
    add_config(setup, RULES)
    return setup


# --- clients -----------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def http_client_as(url: str, token: str, mode: str, seen: list) -> AsyncIterator:
    """The official Python client of `mode` at `url` (`/mcp`), every request carrying `token`;
    each response's (method, status) goes to `seen`."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async def record(response) -> None:
        seen.append((response.request.method, response.status_code))

    async with httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"},
        timeout=httpx2.Timeout(30, read=300),
        event_hooks={"response": [record]},
    ) as http:
        async with Client(streamable_http_client(url, http_client=http), mode=mode) as client:
            yield client


@contextlib.asynccontextmanager
async def stdio_client_as(setup: Setup, principal: str, how: str, mode: str) -> AsyncIterator:
    """The official Python client of `mode`, having started `toolwarden mcp` over stdio as
    `principal`, named by `--principal` (`how == "flag"`) or `$TOOLWARDEN_PRINCIPAL` (`"env"`)."""
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    args = ["mcp", "--config", str(setup.config)]
    env: dict[str, str] = {}
    if how == "flag":
        args += ["--principal", principal]
    elif how == "env":
        env["TOOLWARDEN_PRINCIPAL"] = principal
    else:
        raise ValueError(how)
    params = StdioServerParameters(command=str(toolwarden_bin()), args=args, env=env, cwd=setup.dir)
    stderr = setup.dir / f"toolwarden-mcp-{principal}-{how}.stderr"
    with open(stderr, "w") as errlog:
        async with Client(stdio_client(params, errlog=errlog), mode=mode) as client:
            yield client
    # The SDK closed stdin: toolwarden shut down in order, not at once.
    assert "exiting at once" not in stderr.read_text(), stderr.read_text()


# --- what the tests check ----------------------------------------------------------------------


async def listed(client) -> dict:
    """Every tool of the client's `tools/list`, by name (all pages)."""
    tools: dict = {}
    cursor = None
    while True:
        page = await client.list_tools(cursor=cursor, cache_mode="refresh")
        tools.update({tool.name: tool for tool in page.tools})
        cursor = page.next_cursor
        if not cursor:
            return tools


def assert_the_test_servers_tools(tools: dict, *, with_sleep: bool) -> None:
    """The tools the rules are about, with the inputs they take; `test__sleep` only `with_sleep`."""
    assert "test__echo" in tools, sorted(tools)
    assert "text" in tools["test__echo"].input_schema["properties"], tools["test__echo"].input_schema
    assert "toolwarden__status" in tools, sorted(tools)
    if with_sleep:
        assert "test__sleep" in tools, sorted(tools)
        assert "ms" in tools["test__sleep"].input_schema["properties"], tools["test__sleep"].input_schema
    else:
        assert "test__sleep" not in tools, sorted(tools)
        # A rule hides only what it names: the test server's other tools stay.
        assert {"test__progress", "test__hang"} <= set(tools), sorted(tools)


def assert_denied_by_rule(result, tool: str, reason: str, index: int) -> None:
    """An `isError` result of a call a rule denied: the text gives the rule's reason and index,
    the outcome is `denied{decider: "rule", reason: "rule"}`, and the tool never ran."""
    assert result.is_error is True, result
    said = text(result)
    assert said.startswith(f'[DENIED] Tool "{tool}" is not allowed with this input by a rule; '), said
    assert f"Reason: {reason} (rules[{index}])." in said, said
    got = outcome(result)
    assert (got["status"], got["decider"], got["reason"]) == ("denied", "rule", "rule"), got
    assert got["detail"] == f"{reason} (rules[{index}])", got
    assert got["attempts"] == 0, got
    assert got["tool"] == tool, got


async def assert_echoes(client, said: str) -> None:
    result = await client.call_tool("test__echo", {"text": said})
    assert not result.is_error, result
    assert text(result) == said, result
    assert outcome(result)["status"] == "ok", outcome(result)


async def as_agent(client) -> None:
    """What agent-7 sees and gets."""
    assert_the_test_servers_tools(await listed(client), with_sleep=False)
    # Called by name anyway: denied by rules[0] (not an unknown tool).
    assert_denied_by_rule(await client.call_tool("test__sleep", {"ms": 1}), "test__sleep", "agents may not sleep", 0)
    await as_anyone(client)


async def as_alice(client) -> None:
    """What alice sees and gets: rules[0] is not about her."""
    assert_the_test_servers_tools(await listed(client), with_sleep=True)
    slept = await client.call_tool("test__sleep", {"ms": 1})
    assert not slept.is_error, slept
    assert outcome(slept)["status"] == "ok", outcome(slept)
    await as_anyone(client)


async def as_anyone(client) -> None:
    """rules[1], which has a `when`, denies by the input, whoever calls."""
    assert_denied_by_rule(await client.call_tool("test__echo", {"text": "my secret"}), "test__echo", "no secrets", 1)
    await assert_echoes(client, "hello")


# --- over /mcp of toolwarden serve -------------------------------------------------------------


@pytest.mark.parametrize("mode", ERAS)
async def test_over_http_a_principals_rules_hide_and_deny_tools(rules: Setup, mode: str):
    tokens = {name: secrets.token_hex(32) for name in TOKEN_ENV}
    env = {**os.environ, **{TOKEN_ENV[name]: token for name, token in tokens.items()}}
    with serve(rules.dir, rules.config, env=env) as served:
        served.wait_stderr(r'server "test" is up', 30)
        url = served.url + "/mcp"
        for principal, scenario in (("agent-7", as_agent), ("alice", as_alice)):
            seen: list = []
            async with http_client_as(url, tokens[principal], mode, seen) as client:
                await scenario(client)
            # Every request was let in: a denial is a result, never an HTTP refusal.
            assert seen and all(status < 400 for _, status in seen), (principal, seen)


# --- over stdio (toolwarden mcp) ---------------------------------------------------------------


@pytest.mark.parametrize("how", ["flag", "env"])
@pytest.mark.parametrize("mode", ERAS)
async def test_over_stdio_the_principal_of_toolwarden_mcp_gets_the_same(rules: Setup, mode: str, how: str):
    async with stdio_client_as(rules, "agent-7", how, mode) as client:
        await as_agent(client)
    async with stdio_client_as(rules, "alice", how, mode) as client:
        await as_alice(client)
