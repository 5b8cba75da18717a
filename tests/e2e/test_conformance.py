"""The official MCP conformance suite, run against MCP servers directly and through toolwarden's
gateway: every check that passes directly must pass through toolwarden (docs/CONFORMANCE.md: a
server put behind toolwarden passes the same conformance scenarios as it does directly).

Two servers, each run directly over Streamable HTTP and, through toolwarden, as its one
`[servers.NAME]` over stdio behind `toolwarden serve` at `/mcp` with `[gateway] prefix = false`
(so names are the server's own):

- `everything`: `@modelcontextprotocol/server-everything`, the official reference server. The
  suite targets its own reference server (tools such as `test_simple_text`), so many scenarios
  fail both ways against it; that is fine.
- `conformance`: `conformance_server.mjs`, written for these tests with the official TypeScript
  SDK to do what each scenario asks. It passes every scenario directly, so through toolwarden
  every one is a real check of the gateway (content types, logging, progress, sampling,
  elicitation, resources, prompts, completion, Host checks).

All suites are run (`--suite all`: the active scenarios and the pending ones). A scenario
passes when it has at least one passing check and no failing one; docs/CONFORMANCE.md records
the tables. Set `TW_CONFORMANCE_TABLE=FILE` to have this test write them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import ROOT, assert_no_process, free_port, node_bin_dir, serve, toml_str

SUITE = ROOT / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
CONFORMANCE_SERVER = Path(__file__).resolve().parent / "conformance_server.mjs"
RESULT_DIR = re.compile(r"^server-(?P<scenario>.+)-\d{4}-\d{2}-\d{2}T[\d-]+Z$")
# A run of every server scenario takes a few seconds; this is the backstop.
SUITE_TIMEOUT = 180

Results = dict[str, dict[str, dict]]  # scenario -> check id -> check


def node_env() -> dict[str, str]:
    """The environment with node_modules/.bin first on PATH, so that `#!/usr/bin/env node`
    scripts (server-everything) run on the pinned Node 22, as the suite does."""
    env = dict(os.environ)
    env["PATH"] = f"{node_bin_dir()}{os.pathsep}{env.get('PATH', '')}"
    return env


def run_suite(url: str, out: Path) -> Results:
    """Runs every server scenario of the suite against `url`; the checks by scenario."""
    out.mkdir(parents=True)
    done = subprocess.run(
        [str(node_bin_dir() / "node"), str(SUITE), "server", "--url", url, "--suite", "all", "-o", str(out)],
        cwd=out,
        env=node_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=SUITE_TIMEOUT,
    )
    (out / "suite.log").write_text(done.stdout + done.stderr)
    # The suite exits 1 when any scenario fails; the per-scenario results are what counts.
    results: Results = {}
    for entry in sorted(out.iterdir()):
        found = RESULT_DIR.match(entry.name)
        if not found:
            continue
        checks = json.loads((entry / "checks.json").read_text())
        # A check id may repeat (INFO records); the last one of an id stands.
        results[found["scenario"]] = {c["id"]: c for c in checks}
    assert results, f"the suite wrote no results for {url}:\n{done.stdout}\n{done.stderr}"
    return results


def succeeded(checks: dict[str, dict]) -> int:
    return sum(c["status"] == "SUCCESS" for c in checks.values())


def failed(checks: dict[str, dict]) -> int:
    return sum(c["status"] == "FAILURE" for c in checks.values())


def passed(checks: dict[str, dict]) -> bool:
    """At least one check passed and none failed (INFO and WARNING records do not count)."""
    return succeeded(checks) > 0 and failed(checks) == 0


def regressions(direct: Results, through: Results) -> list[str]:
    """What passes directly but not through toolwarden: every passing check, and every passing
    scenario (which must not gain a failing check), as `scenario[/check]: why`."""
    found = []
    for scenario, checks in sorted(direct.items()):
        other_checks = through.get(scenario)
        if other_checks is None:
            if succeeded(checks):
                found.append(f"{scenario}: not run through toolwarden")
            continue
        for check_id, check in sorted(checks.items()):
            if check["status"] != "SUCCESS":
                continue
            other = other_checks.get(check_id)
            if other is None:
                found.append(f"{scenario}/{check_id}: not reported through toolwarden")
            elif other["status"] != "SUCCESS":
                found.append(f"{scenario}/{check_id}: {other['status']}: {other.get('errorMessage', '')}")
        if passed(checks) and not passed(other_checks):
            found.append(f"{scenario}: fails through toolwarden: {why(other_checks)}")
    return found


def why(checks: dict[str, dict]) -> str:
    return "; ".join(
        f"{c['id']}: {c.get('errorMessage') or c['status']}" for c in checks.values() if c["status"] == "FAILURE"
    )


def table(direct: Results, through: Results) -> str:
    def mark(checks: dict[str, dict] | None) -> str:
        if checks is None:
            return "not run"
        verdict = "pass" if passed(checks) else ("FAIL" if failed(checks) else "no check passed")
        return f"{verdict} ({succeeded(checks)}/{succeeded(checks) + failed(checks)})"

    lines = ["| scenario | direct | through toolwarden | failures |", "|---|---|---|---|"]
    for scenario in sorted(set(direct) | set(through)):
        d, t = direct.get(scenario), through.get(scenario)
        dw, tw = why(d or {}), why(t or {})
        notes = dw if dw == tw else " / ".join(
            f"{side}: {text}" for side, text in (("direct", dw), ("through", tw)) if text
        )
        lines.append(f"| {scenario} | {mark(d)} | {mark(t)} | {notes.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def test_the_comparison_fails_on_what_passes_only_directly():
    ok = {"id": "a", "status": "SUCCESS"}
    bad = {"id": "a", "status": "FAILURE", "errorMessage": "boom"}
    info = {"id": "b", "status": "INFO"}
    failing_b = {"id": "b", "status": "FAILURE", "errorMessage": "late"}
    assert regressions({"s": {"a": ok}}, {"s": {"a": ok}}) == []
    assert regressions({"s": {"a": bad}}, {"s": {"a": bad}}) == []
    assert regressions({"s": {"a": bad}}, {"s": {"a": ok}}) == []
    assert regressions({"s": {"a": ok}}, {"s": {"a": bad}}) == [
        "s/a: FAILURE: boom",
        "s: fails through toolwarden: a: boom",
    ]
    assert regressions({"s": {"a": ok}}, {}) == ["s: not run through toolwarden"]
    assert regressions({"s": {"a": ok, "b": info}}, {"s": {"a": ok, "b": failing_b}}) == [
        "s: fails through toolwarden: b: late"
    ]
    # Nothing passed directly: nothing to keep.
    assert regressions({"s": {"b": info}}, {"s": {"b": failing_b}}) == []


class Upstream:
    """An MCP server the suite runs against, directly and through toolwarden."""

    def __init__(self, name: str, http: list[str], stdio: list[str], ready: str, must_pass: set[str] | None):
        self.name, self.http, self.stdio, self.ready = name, http, stdio, ready
        # Scenarios it passes directly with this suite (None: every scenario but the pending
        # `server-sse-polling`, which needs a `test_reconnection` tool that closes the request's
        # stream mid-call). If one fails directly, the environment is broken and the comparison
        # would prove little.
        self.must_pass = must_pass


def upstreams() -> list[Upstream]:
    node = str(node_bin_dir() / "node")
    everything = str(node_bin_dir() / "mcp-server-everything")
    return [
        Upstream(
            "everything",
            http=[everything, "streamableHttp"],  # its port comes from $PORT
            stdio=[everything, "stdio"],
            ready="listening on port {port}",
            must_pass={"server-initialize", "ping", "tools-list", "resources-list", "prompts-list"},
        ),
        Upstream(
            "conformance",
            http=[node, str(CONFORMANCE_SERVER), "http", "{port}"],
            stdio=[node, str(CONFORMANCE_SERVER), "stdio"],
            ready="listening on {port}",
            must_pass=None,
        ),
    ]


def direct_run(upstream: Upstream, workdir: Path) -> Results:
    port = free_port()
    log_path = workdir / f"{upstream.name}.log"
    argv = [a.replace("{port}", str(port)) for a in upstream.http]
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            argv,
            cwd=workdir,
            env={**node_env(), "PORT": str(port)},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            ready = upstream.ready.replace("{port}", str(port))
            deadline = time.monotonic() + 30
            while ready not in log_path.read_text():
                assert server.poll() is None, f"{upstream.name} exited:\n{log_path.read_text()}"
                assert time.monotonic() < deadline, f"{upstream.name} did not start:\n{log_path.read_text()}"
                time.sleep(0.05)
            return run_suite(f"http://127.0.0.1:{port}/mcp", workdir / "direct")
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(10)


def gateway_run(upstream: Upstream, workdir: Path) -> Results:
    command, *args = upstream.stdio
    config = workdir / "toolwarden.toml"
    config.write_text(
        "[gateway]\nprefix = false\n\n"
        f"[servers.{upstream.name}]\n"
        f"command = {toml_str(command)}\n"
        f"args = [{', '.join(toml_str(a) for a in args)}]\n"
    )
    with serve(workdir, config, env=node_env()) as served:
        served.wait_stderr(rf'server "{upstream.name}" is up', 60)
        return run_suite(served.url + "/mcp", workdir / "through")


@pytest.mark.parametrize("upstream", upstreams(), ids=lambda u: u.name)
def test_every_conformance_check_that_passes_directly_passes_through_toolwarden(upstream: Upstream, tmp_path: Path):
    direct = direct_run(upstream, tmp_path)
    through = gateway_run(upstream, tmp_path)
    assert_no_process(str(tmp_path))

    report = f"### {upstream.name}\n\n" + table(direct, through)
    print("\n" + report)
    if os.environ.get("TW_CONFORMANCE_TABLE"):
        with open(os.environ["TW_CONFORMANCE_TABLE"], "a") as out:
            out.write(report + "\n")
    must_pass = upstream.must_pass if upstream.must_pass is not None else set(direct) - {"server-sse-polling"}
    failing = sorted(s for s in must_pass if not passed(direct.get(s, {})))
    assert not failing, f"{upstream.name} fails {failing} directly; see {tmp_path}\n{report}"
    lost = regressions(direct, through)
    assert not lost, "passes directly, fails through toolwarden:\n" + "\n".join(lost) + "\n\n" + report
