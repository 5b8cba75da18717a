"""The gateway in front of servers it reaches over Streamable HTTP (`[servers.NAME] url = ...`),
with clients of both eras (docs/GATEWAY.md, "Passthrough and routing").

A stateless (2026-07-28) client's requests used to reach such a server carrying the client's own
`_meta` envelope: rmcp's HTTP client took its `protocolVersion` as the connection's, the
handshake-only server refused the request (and every one after it), and the refusal, which names
no request, answered nothing — `resources/list` and `prompts/list` hung until the client gave up.
Here every passthrough request of a stateless client must answer what the server answers
directly, and a request the server never answers must end in a JSON-RPC error by its deadline.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from conftest import Setup, free_port, node_bin_dir, serve, toml_str
from conftest import test_server_bin as tw_test_server_bin

pytestmark = pytest.mark.anyio

STATELESS = "2026-07-28"
NEVER = "test://hang/never"


@pytest.fixture
def anyio_backend():
    return "asyncio"


@contextlib.contextmanager
def http_server(argv: list[str], cwd: Path, ready: str, port: int | None = None) -> Iterator[str]:
    """Runs an MCP server over Streamable HTTP; yields its `/mcp` URL. `ready` is what its
    output says once it listens (`{port}` is filled in); killed (its group) afterwards."""
    log_path = cwd / f"upstream-{time.monotonic_ns()}.log"
    env = {**os.environ, "PATH": f"{node_bin_dir()}{os.pathsep}{os.environ.get('PATH', '')}"}
    if port is not None:
        env["PORT"] = str(port)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            text = log_path.read_text()
            if port is None and text.strip():
                address = text.splitlines()[0].strip()
                break
            if port is not None and ready.format(port=port) in text:
                address = f"127.0.0.1:{port}"
                break
            assert proc.poll() is None, f"{argv[0]} exited:\n{text}"
            assert time.monotonic() < deadline, f"{argv[0]} did not start:\n{text}"
            time.sleep(0.05)
        yield f"http://{address}/mcp"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


@contextlib.contextmanager
def upstream(kind: str, cwd: Path) -> Iterator[str]:
    if kind == "tw-test-server":
        with http_server([str(tw_test_server_bin()), "--http", "127.0.0.1:0"], cwd, "") as url:
            yield url
    else:
        everything = str(node_bin_dir() / "mcp-server-everything")
        with http_server([everything, "streamableHttp"], cwd, "listening on port {port}", free_port()) as url:
            yield url


def write_config(setup: Setup, url: str, extra: str = "") -> None:
    setup.config.write_text(
        '[store]\nenabled = false\n\n[gateway]\nprefix = false\n' + extra + "\n"
        f"[servers.up]\nurl = {toml_str(url)}\n"
    )


async def views(client) -> dict:
    """What a client sees of a server's resources, prompts and completions."""
    from mcp.types import PromptReference, ResourceTemplateReference

    resources = await client.list_resources()
    templates = await client.list_resource_templates()
    prompts = await client.list_prompts()
    first = resources.resources[0]
    read = await client.read_resource(str(first.uri))
    seen = {
        "resources": sorted(str(r.uri) for r in resources.resources),
        "templates": sorted(t.uri_template for t in templates.resource_templates),
        "prompts": sorted(p.name for p in prompts.prompts),
        "read": [c.model_dump(exclude_none=True) for c in read.contents],
    }
    if prompts.prompts and prompts.prompts[0].arguments:
        prompt = prompts.prompts[0]
        done = await client.complete(PromptReference(type="ref/prompt", name=prompt.name),
                                     {"name": prompt.arguments[0].name, "value": ""})
        seen["prompt_completion"] = sorted(done.completion.values)
    if templates.resource_templates:
        template = templates.resource_templates[0]
        variable = template.uri_template.split("{", 1)[1].split("}", 1)[0]
        done = await client.complete(
            ResourceTemplateReference(type="ref/resource", uri=template.uri_template),
            {"name": variable, "value": ""},
        )
        seen["template_completion"] = sorted(done.completion.values)
    return seen


@pytest.mark.parametrize("kind", ["tw-test-server", "everything"])
async def test_a_stateless_client_sees_what_the_server_serves_directly(setup: Setup, kind: str):
    from mcp import Client

    with upstream(kind, setup.dir) as url:
        async with Client(url, mode="legacy") as direct:
            expected = await views(direct)
        write_config(setup, url)
        with serve(setup.dir, setup.config) as served:
            served.wait_stderr(r'server "up" is up', 30)
            for mode in (STATELESS, "legacy"):
                async with Client(served.url + "/mcp", mode=mode) as client:
                    with anyio.fail_after(20):
                        got = await views(client)
                    assert got == expected, mode
                    # The connection to the server is still sound for tool calls.
                    listed = await client.list_tools()
                    assert listed.tools


async def test_a_request_the_server_never_answers_ends_in_an_error_by_its_deadline(setup: Setup):
    from mcp import Client
    from mcp.shared.exceptions import MCPError

    with upstream("tw-test-server", setup.dir) as url:
        write_config(setup, url, 'request_timeout = "1s"\n')
        with serve(setup.dir, setup.config) as served:
            served.wait_stderr(r'server "up" is up', 30)
            for mode in (STATELESS, "legacy"):
                async with Client(served.url + "/mcp", mode=mode) as client:
                    # The gateway's default deadline ([gateway] request_timeout).
                    started = time.monotonic()
                    with anyio.fail_after(15), pytest.raises(MCPError) as failed:
                        await client.read_resource(NEVER)
                    elapsed = time.monotonic() - started
                    assert failed.value.error.code == -32001, failed.value.error
                    assert "did not answer resources/read within 1s" in failed.value.error.message
                    assert 0.9 <= elapsed < 10, elapsed
                    # The request's own deadline (`_meta.timeout_ms`) wins.
                    started = time.monotonic()
                    with anyio.fail_after(15), pytest.raises(MCPError) as failed:
                        await client.read_resource(NEVER, meta={"timeout_ms": 300})
                    assert failed.value.error.code == -32001
                    assert "within 300ms" in failed.value.error.message
                    assert time.monotonic() - started < 0.95
                    # The server heard that the request is withdrawn, and still answers.
                    got = await client.read_resource("test://static/hello")
                    assert got.contents[0].text == "hello"
                    cancels = (await client.call_tool("cancels")).structured_content
                    assert any(c["reason"] == "timed out in toolwarden" for c in cancels["cancels"]), cancels
