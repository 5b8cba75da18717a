"""Tasks toward clients (docs/GATEWAY.md, "Tasks"), on the real binary, driven by the official
Python MCP SDK pinned to the stateless revision (`Client(..., mode="2026-07-28")`).

The SDK has no tasks client of its own; it has extensions (`Client(extensions=[...])`), which
declare an extension in every request's client capabilities and claim a result shape of
`tools/call`. `Tasks` below is one: it declares `io.modelcontextprotocol/tasks`, and finishes a
`resultType: "task"` answer by polling `tasks/get` at the task's `pollIntervalMs`, each poll its
own short request — so that a tool running far longer than the client's HTTP read timeout still
ends in its result.

The long call is a 60 s tool behind a client whose HTTP read timeout is 5 s: the call lives twelve
times longer than any one of the client's requests may, and its result still arrives.

The last tests drive the experimental tasks of the 2025-11-25 revision with a handshake client:
the Python SDK's legacy mode has no tasks client (it builds its `initialize` capabilities
itself, never with `tasks`, and has no `tasks/*` calls), the official TypeScript SDK 1.x has one (`client.experimental.tasks`), so
`ts_tasks_client.mjs` runs it with `node_modules/.bin/node`, over Streamable HTTP and stdio,
and prints what it saw.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any, ClassVar, Literal

import anyio
import pytest
from conftest import ROOT, Served, Setup, add_config, gateway, node_bin_dir, serve, text, toolwarden_bin
from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp_types import CallToolResult, Request, Result
from mcp_types._types import MCPModel
from pydantic import ConfigDict, TypeAdapter

pytestmark = pytest.mark.anyio

STATELESS = "2026-07-28"
TASKS = "io.modelcontextprotocol/tasks"
READ_TIMEOUT = 5.0
LONG_MS = 60_000


@pytest.fixture
def anyio_backend():
    return "asyncio"


class TaskParams(MCPModel):
    task_id: str


class TaskRequest(Request[TaskParams, str]):
    """`tasks/get` or `tasks/cancel` (SEP-2663): the task id rides `Mcp-Name` too."""

    method: str
    name_param: ClassVar[str | None] = "taskId"


class TaskHandle(Result):
    """The `CreateTaskResult` a `tools/call` may be answered with."""

    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"]
    task_id: str
    status: str
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None


ANY = TypeAdapter(dict[str, Any])


async def tasks_request(session, method: str, task_id: str) -> dict[str, Any]:
    return await session.send_request(
        TaskRequest(method=method, params=TaskParams(task_id=task_id)), ANY
    )


async def poll(session, task_id: str, until: set[str], timeout: float = 60.0) -> dict[str, Any]:
    """`tasks/get` at the task's `pollIntervalMs` until its status is one of `until`."""
    deadline = time.monotonic() + timeout
    while True:
        got = await tasks_request(session, "tasks/get", task_id)
        if got["status"] in until:
            return got
        assert time.monotonic() < deadline, got
        await anyio.sleep(got.get("pollIntervalMs", 1000) / 1000)


class Tasks(ClientExtension):
    """Declares the tasks extension and resolves a task answer into the call's result."""

    identifier = TASKS

    def claims(self):
        async def resolve(handle: TaskHandle, ctx: ClaimContext) -> CallToolResult:
            done = await poll(ctx.session, handle.task_id, {"completed", "failed", "cancelled"})
            assert done["status"] == "completed", done
            return CallToolResult.model_validate(done["result"])

        return [ResultClaim(result_type="task", model=TaskHandle, resolve=resolve)]


def client(url: str, **options) -> Client:
    return Client(
        url + "/mcp",
        mode=STATELESS,
        read_timeout_seconds=READ_TIMEOUT,
        extensions=[Tasks()],
        **options,
    )


async def start_task(c: Client, tool: str, arguments: dict) -> TaskHandle:
    """Calls `tool`, expecting a task answer; the handle."""
    handle = await c.session.call_tool(tool, arguments, allow_claimed=True)
    assert isinstance(handle, TaskHandle), handle
    assert handle.status == "working" and handle.ttl_ms == 3_600_000, handle
    assert handle.poll_interval_ms == 1000, handle
    return handle


async def test_a_call_longer_than_the_clients_timeout_completes_as_a_task(setup: Setup):
    add_config(setup, '[tools."test__sleep"]\ntask_after = "1s"\n')
    with serve(setup.dir, setup.config) as served:
        served.wait_stderr(r'server "test" is up', 30)
        # Without tasks, the client gives up on the call after its read timeout.
        async with Client(served.url + "/mcp", mode=STATELESS, read_timeout_seconds=1.0) as plain:
            with pytest.raises(Exception):  # noqa: B017 (the SDK's timeout error)
                await plain.call_tool("test__sleep", {"ms": 3000})
        # With tasks, the call is answered with a task after task_after, runs on past the
        # request (whose stream closes with that answer), and its result is fetched.
        async with client(served.url) as c:
            started = time.monotonic()
            result = await c.call_tool("test__sleep", {"ms": LONG_MS})
            took = time.monotonic() - started
        assert result.is_error is False, result
        assert text(result) == f"slept {LONG_MS} ms"
        assert result.meta["toolwarden/outcome"]["status"] == "ok", result.meta
        assert took >= LONG_MS / 1000 > 2 * READ_TIMEOUT, took


async def test_tasks_cancel_stops_the_work_on_the_server(setup: Setup):
    add_config(setup, '[tools."test__sleep"]\ntask = "always"\n')
    async with gateway(setup, "http", mode=STATELESS, extensions=[Tasks()]) as c:
        handle = await start_task(c, "test__sleep", {"ms": 60_000})
        await anyio.sleep(0.5)
        ack = await tasks_request(c.session, "tasks/cancel", handle.task_id)
        assert ack.get("resultType", "complete") == "complete", ack
        got = await poll(c.session, handle.task_id, {"cancelled", "completed", "failed"}, 20)
        assert got["status"] == "cancelled", got
        # The server saw the cancel of its sleep.
        deadline = time.monotonic() + 10
        while True:
            seen = (await c.call_tool("test__cancels")).structured_content["cancels"]
            if any(cancel["tool"] == "sleep" for cancel in seen):
                break
            assert time.monotonic() < deadline, seen
            await anyio.sleep(0.1)


async def test_a_task_is_followed_by_a_new_client_after_the_first_went_away(setup: Setup):
    add_config(setup, '[tools."test__sleep"]\ntask = "always"\n')
    with serve(setup.dir, setup.config) as served:
        served.wait_stderr(r'server "test" is up', 30)
        async with client(served.url) as first:
            handle = await start_task(first, "test__sleep", {"ms": 3000})
        # The first client is gone (its process could have restarted): a new one, knowing only
        # the task's id, follows it to its result.
        async with client(served.url) as second:
            done = await poll(second.session, handle.task_id, {"completed", "failed", "cancelled"})
        assert done["status"] == "completed", done
        assert done["result"]["content"][0]["text"] == "slept 3000 ms", done


async def test_a_task_cut_off_by_a_kill_reads_failed_interrupted_after_a_restart(setup: Setup):
    add_config(setup, '[tools."test__sleep"]\ntask = "always"\n')
    argv = [str(toolwarden_bin()), "serve", "--config", str(setup.config), "--listen", "127.0.0.1:0"]
    first = Served(argv, setup.dir)
    try:
        first.wait_stderr(r'server "test" is up', 30)
        async with client(first.url) as c:
            handle = await start_task(c, "test__sleep", {"ms": 60_000})
            got = await tasks_request(c.session, "tasks/get", handle.task_id)
            assert got["status"] == "working", got
    finally:
        # kill -9 of toolwarden's whole process group (it and its server), mid-task.
        first.kill()
    # The same config, the same audit trail: recovery marks the cut-off call interrupted.
    with serve(setup.dir, setup.config) as second:
        second.wait_stderr(r'server "test" is up', 30)
        async with client(second.url) as c:
            got = await tasks_request(c.session, "tasks/get", handle.task_id)
        assert got["status"] == "failed", got
        assert got["error"]["data"]["toolwarden/outcome"]["status"] == "interrupted", got
        assert "toolwarden stopped" in got["error"]["message"], got


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_task_on_either_transport_is_followed_to_its_result(setup: Setup, transport: str):
    add_config(setup, '[tools."test__progress"]\ntask = "always"\n')
    async with gateway(setup, transport, mode=STATELESS, extensions=[Tasks()]) as c:
        handle = await start_task(c, "test__progress", {"every_ms": 300, "count": 4})
        # While it runs, tasks/get carries its last progress.
        deadline = time.monotonic() + 10
        while True:
            got = await tasks_request(c.session, "tasks/get", handle.task_id)
            if got.get("statusMessage", "").startswith("step"):
                break
            assert got["status"] == "working" and time.monotonic() < deadline, got
            await anyio.sleep(0.05)
        assert got["_meta"]["toolwarden/progress"]["total"] == 4, got
        done = await poll(c.session, handle.task_id, {"completed", "failed", "cancelled"}, 20)
        assert done["status"] == "completed", done
        assert done["result"]["content"][0]["text"] == "done after 4 steps", done


async def test_a_task_stopped_by_a_graceful_shutdown_reads_its_outcome_after_a_restart(setup: Setup):
    add_config(setup, '[tools."test__sleep"]\ntask = "always"\n')
    with serve(setup.dir, setup.config) as first:
        first.wait_stderr(r'server "test" is up', 30)
        async with client(first.url) as c:
            handle = await start_task(c, "test__sleep", {"ms": 60_000})
    # SIGTERM ended the call cancelled{shutdown}, recorded; the restarted toolwarden reads it.
    with serve(setup.dir, setup.config) as second:
        second.wait_stderr(r'server "test" is up', 30)
        async with client(second.url) as c:
            got = await tasks_request(c.session, "tasks/get", handle.task_id)
    assert got["status"] == "completed", got
    assert got["result"]["isError"] is True, got
    assert got["result"]["_meta"]["toolwarden/outcome"]["status"] == "cancelled", got
    assert got["result"]["_meta"]["toolwarden/outcome"]["reason"] == "shutdown", got


# --- handshake clients: the experimental tasks of 2025-11-25 ---------------------------------

TS_TASKS = Path(__file__).with_name("ts_tasks_client.mjs")


def run_ts_tasks(setup: Setup, transport: str, mode: str, served: Served | None = None) -> dict:
    """`ts_tasks_client.mjs MODE ...`: what the TypeScript SDK's handshake client saw, over
    `served` (HTTP) or a `toolwarden mcp` it starts (stdio)."""
    node = str(node_bin_dir() / "node")
    if transport == "http":
        assert served is not None
        argv = [node, str(TS_TASKS), mode, "http", served.url + "/mcp"]
    else:
        argv = [node, str(TS_TASKS), mode, "stdio", str(toolwarden_bin()), str(setup.config)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def check_result(seen: dict) -> None:
    """What the client saw of a task for a 2.5 s sleep, polled to its result."""
    assert seen["tasksCapability"] == {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}, seen
    assert seen["taskSupport"]["test__sleep"] == "optional", seen
    assert seen["taskSupport"]["toolwarden__status"] == "forbidden", seen
    created = seen["created"]
    assert created["status"] == "working" and created["taskId"].startswith("task_"), seen
    assert (created["ttl"], created["pollInterval"]) == (3_600_000, 1000), seen
    # Answered at once, long before the sleep's end; polled (working) until completed.
    assert seen["createdAfterMs"] < 2000 <= seen["tookMs"], seen
    assert seen["listed"] == [created["taskId"]], seen
    assert seen["statuses"][0] == "working" and seen["statuses"][-1] == "completed", seen
    result = seen["result"]
    assert result["content"][0]["text"] == "slept 2500 ms", seen
    assert result["_meta"]["toolwarden/outcome"]["status"] == "ok", seen
    assert result["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": created["taskId"]}, seen
    assert seen["final"]["status"] == "completed", seen


async def test_a_handshake_client_of_2025_11_25_creates_polls_and_gets_a_task(setup: Setup):
    with serve(setup.dir, setup.config) as served:
        served.wait_stderr(r'server "test" is up', 30)
        seen = run_ts_tasks(setup, "http", "result", served)
    check_result(seen)
    # The task is recorded in the audit trail like every task: after a restart, a client that
    # knows its id (here a stateless one) reads its outcome there.
    with serve(setup.dir, setup.config) as again:
        again.wait_stderr(r'server "test" is up', 30)
        async with client(again.url) as c:
            got = await tasks_request(c.session, "tasks/get", seen["created"]["taskId"])
    assert got["status"] == "completed", got
    assert got["result"]["content"][0]["text"] == "slept 2500 ms", got


async def test_a_handshake_client_on_stdio_creates_polls_and_gets_a_task(setup: Setup):
    check_result(run_ts_tasks(setup, "stdio", "result"))


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_handshake_clients_tasks_cancel_stops_the_work_on_the_server(setup: Setup, transport: str):
    if transport == "http":
        with serve(setup.dir, setup.config) as served:
            served.wait_stderr(r'server "test" is up', 30)
            seen = run_ts_tasks(setup, "http", "cancel", served)
    else:
        seen = run_ts_tasks(setup, "stdio", "cancel")
    assert seen["created"]["status"] == "working", seen
    # tasks/cancel answers once the call has stopped: cancelled, and so reads tasks/get.
    assert seen["cancelled"]["taskId"] == seen["created"]["taskId"], seen
    assert seen["cancelled"]["status"] == "cancelled", seen
    assert seen["final"]["status"] == "cancelled", seen
    # The server saw the cancel of its sleep.
    assert any(cancel["tool"] == "sleep" for cancel in seen["cancels"]), seen
