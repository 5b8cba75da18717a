"""Helpers of the end-to-end tests: the real `toolwarden` binary, driven by official clients.

Each test runs in its own temp dir with its own config, starts its own `toolwarden` (and,
through it, its own `tw-test-server`), and ends with every process it started gone. The
binaries come from the cargo build that `scripts/test.sh` runs: `$TOOLWARDEN_BIN` and
`$TW_TEST_SERVER`, else `toolwarden` and `tw-test-server` in `$CARGO_TARGET_DIR/debug` (or
`target/debug`). A missing binary fails the test; nothing is skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _built(env_var: str, name: str) -> Path:
    explicit = os.environ.get(env_var)
    if explicit:
        path = Path(explicit)
    else:
        target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
        path = target / "debug" / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(
            f"{name} not found at {path}: build it (cargo build --workspace --all-targets) "
            f"or set {env_var}; scripts/test.sh does both",
            pytrace=False,
        )
    return path


def toolwarden_bin() -> Path:
    return _built("TOOLWARDEN_BIN", "toolwarden")


def test_server_bin() -> Path:
    return _built("TW_TEST_SERVER", "tw-test-server")


def node_bin_dir() -> Path:
    """`node_modules/.bin`, installed by scripts/setup-test-deps.sh (its `node` is Node 22)."""
    bin_dir = ROOT / "node_modules" / ".bin"
    for tool in ("node", "mcp-server-everything", "conformance"):
        if not (bin_dir / tool).exists():
            pytest.fail(
                f"{bin_dir / tool} is missing: run scripts/setup-test-deps.sh",
                pytrace=False,
            )
    return bin_dir


def toml_str(s: str | Path) -> str:
    # JSON string escapes are valid TOML basic-string escapes.
    return json.dumps(str(s))


def free_port() -> int:
    """A port that was free a moment ago on 127.0.0.1 (for programs that cannot bind port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- processes ----------------------------------------------------------------------------


def pids_with(needle: str) -> list[int]:
    """Live processes (not zombies) whose command line contains `needle`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        state = stat[stat.rfind(")") + 2 :][:1]
        if needle.encode() in cmdline and state not in ("Z", "X"):
            found.append(int(entry))
    return found


def assert_no_process(needle: str, grace: float = 5.0) -> None:
    """Asserts that no process's command line contains `needle` (after at most `grace` s);
    kills the leftovers so that a failing test leaves nothing behind either."""
    deadline = time.monotonic() + grace
    while True:
        pids = pids_with(needle)
        if not pids:
            return
        if time.monotonic() >= deadline:
            cmdlines = {}
            for pid in pids:
                with contextlib.suppress(OSError):
                    cmdlines[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            pytest.fail(f"processes with {needle!r} were left running: {cmdlines}")
        time.sleep(0.05)


class Served:
    """A `toolwarden serve` started by a test; its stderr goes to a file in the test's dir."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str] | None = None):
        self.stderr_path = cwd / "toolwarden.stderr"
        self._stderr = open(self.stderr_path, "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            argv,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
            env=env,
            start_new_session=True,
        )
        self.url = "http://" + self.wait_stderr(r"listening on http://(\S+)", 30).group(1)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def wait_stderr(self, pattern: str, timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            found = re.search(pattern, self.stderr())
            if found:
                return found
            if self.proc.poll() is not None:
                pytest.fail(f"toolwarden exited ({self.proc.returncode}) before {pattern!r}:\n{self.stderr()}")
            if time.monotonic() >= deadline:
                pytest.fail(f"no {pattern!r} on toolwarden's stderr within {timeout}s:\n{self.stderr()}")
            time.sleep(0.02)

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, then waits for the exit; its exit code (SIGKILL and a failure if it hangs)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"toolwarden did not exit within {timeout}s of SIGTERM:\n{self.stderr()}")
        self._stderr.close()
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._stderr.close()


@contextlib.contextmanager
def serve(cwd: Path, config: Path, *extra: str, env: dict[str, str] | None = None) -> Iterator[Served]:
    """`toolwarden serve --config CONFIG --listen 127.0.0.1:0`, stopped (SIGTERM, exit 0)
    when the block ends; killed if the block failed."""
    served = Served(
        [str(toolwarden_bin()), "serve", "--config", str(config), "--listen", "127.0.0.1:0", *extra],
        cwd,
        env,
    )
    try:
        yield served
    except BaseException:
        served.kill()
        raise
    code = served.stop()
    assert code == 0, f"toolwarden serve exited {code}:\n{served.stderr()}"


@pytest.fixture(autouse=True)
def _own_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every toolwarden a test starts keeps its audit trail (when no `[store] path` is
    configured) in the test's temp dir, never in the user's data dir."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))


# --- the gateway with tw-test-server --------------------------------------------------------


@dataclass
class Setup:
    """A test's dir, the marker on its processes' command lines, and its config."""

    dir: Path
    mark: str
    config: Path
    extra: list[str] = field(default_factory=list)


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    """A temp dir with `toolwarden.toml`: `[servers.test]` = tw-test-server, whose command
    line carries a unique marker. After the test, no process with that marker (the test
    server) or the dir (toolwarden, whose command line names its config) may be running."""
    mark = f"twe2e-{uuid.uuid4().hex[:12]}"
    config = tmp_path / "toolwarden.toml"
    # The audit trail in the test's dir: the SDK starts `toolwarden mcp` with a reduced
    # environment (no XDG_DATA_HOME), so the data-dir default would be the user's.
    config.write_text(
        "[store]\n"
        'path = "audit.db"\n\n'
        "[servers.test]\n"
        f"command = {toml_str(test_server_bin())}\n"
        f'args = ["--stderr-line", {toml_str(mark)}]\n'
    )
    yield Setup(tmp_path, mark, config)
    assert_no_process(mark)
    assert_no_process(str(tmp_path))


def add_config(setup: Setup, toml: str) -> None:
    with setup.config.open("a") as f:
        f.write("\n" + toml + "\n")


@contextlib.asynccontextmanager
async def gateway(setup: Setup, transport: str, **client_options) -> AsyncIterator:
    """An official `mcp.Client` connected to toolwarden's gateway over `transport`:
    `stdio` (`toolwarden mcp`, started and stopped by the SDK's stdio client) or `http`
    (`toolwarden serve`, at `/mcp`, with the SDK's Streamable HTTP client).

    The client speaks the handshake era (`mode="legacy"`: `initialize`, a session) unless the
    test pins another `mode` (`"2026-07-28"`: stateless). The SDK's own default, `"auto"`,
    would discover that toolwarden speaks 2026-07-28 and go stateless."""
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    client_options.setdefault("mode", "legacy")

    if transport == "stdio":
        params = StdioServerParameters(
            command=str(toolwarden_bin()),
            args=["mcp", "--config", str(setup.config)],
            cwd=setup.dir,
        )
        stderr = setup.dir / "toolwarden.stderr"
        with open(stderr, "w") as errlog:
            async with Client(stdio_client(params, errlog=errlog), **client_options) as client:
                yield client
        # The SDK closed stdin, and signalled if toolwarden was slow to exit: toolwarden must
        # have shut down in order (servers' process groups killed), not exited at once.
        assert "exiting at once" not in stderr.read_text(), stderr.read_text()
    elif transport == "http":
        with serve(setup.dir, setup.config) as served:
            served.wait_stderr(r'server "test" is up', 30)
            async with Client(served.url + "/mcp", **client_options) as client:
                yield client
    else:
        raise ValueError(transport)


def outcome(result) -> dict:
    """The structured outcome toolwarden puts in a CallToolResult's `_meta`."""
    meta = result.meta or {}
    assert "toolwarden/outcome" in meta, f"no toolwarden/outcome in {result!r}"
    return meta["toolwarden/outcome"]


def text(result) -> str:
    return "\n".join(block.text for block in result.content if getattr(block, "type", None) == "text")
