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

- `tw-test-server`: this repository's test server (rmcp) with `--era both`, so that the
  2026-07-28 scenarios (no `initialize`, per-request `_meta`, headers, `input_required`) have a
  server that speaks that revision directly. It has none of the suite's `test_*` tools.

Two releases of the suite, each a pinned npm package (scripts/setup-test-deps.sh):

- 0.1.16, the suite of the handshake era: every server scenario (`--suite all`).
- 0.2.0-alpha.12, which adds the 2026-07-28 revision: every server scenario at each wire it
  applies to — `--spec-version 2025-11-25` (the handshake wire) and `--spec-version 2026-07-28`
  (stateless: no `initialize`, `_meta` on every request) — and the extension scenarios (tasks,
  skills), which belong to no dated revision, at the wire the suite picks for them.

A scenario passes when it has at least one passing check and no failing one; docs/CONFORMANCE.md
records the tables. Set `TW_CONFORMANCE_TABLE=FILE` to have this test write them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import ROOT, assert_no_process, free_port, node_bin_dir, serve, toml_str
from conftest import test_server_bin as tw_test_server_bin

CONFORMANCE_SERVER = Path(__file__).resolve().parent / "conformance_server.mjs"
RESULT_DIR = re.compile(r"^server-(?P<scenario>.+)-\d{4}-\d{2}-\d{2}T[\d-]+Z$")
# A run of every server scenario takes a few seconds; this is the backstop.
SUITE_TIMEOUT = 600


@dataclass(frozen=True)
class Suite:
    """A pinned release of the conformance suite and the runs it is given: (label, arguments).
    A scenario's result is keyed `scenario` when the suite has one run, else `scenario @label`."""

    version: str
    package: str  # its directory under node_modules
    runs: tuple[tuple[str, tuple[str, ...]], ...]

    @property
    def cli(self) -> Path:
        return ROOT / "node_modules" / self.package / "dist" / "index.js"


# The label `extension` is the run of every scenario, of which only those of no dated
# revision are kept (the others ran at their revisions' wires already).
EXTENSION = "extension"
SUITES = [
    Suite("0.1.16", "@modelcontextprotocol/conformance", (("", ("--suite", "all")),)),
    Suite(
        "0.2.0-alpha.12",
        "conformance-0.2",
        (
            ("2025-11-25", ("--suite", "all", "--spec-version", "2025-11-25")),
            ("2026-07-28", ("--suite", "all", "--spec-version", "2026-07-28")),
            (EXTENSION, ("--suite", "all")),
        ),
    ),
]
# Check statuses from the most to the least severe: a check id reported more than once
# stands at its most severe report (the suite's own rule for repeated ids).
SEVERITY = ("FAILURE", "WARNING", "SUCCESS", "SKIPPED", "INFO")

Results = dict[str, dict[str, dict]]  # scenario -> check id -> check


def node_env() -> dict[str, str]:
    """The environment with node_modules/.bin first on PATH, so that `#!/usr/bin/env node`
    scripts (server-everything) run on the pinned Node 22, as the suite does."""
    env = dict(os.environ)
    env["PATH"] = f"{node_bin_dir()}{os.pathsep}{env.get('PATH', '')}"
    return env


def suite_cli(suite: Suite) -> Path:
    if not suite.cli.is_file():
        pytest.fail(f"{suite.cli} is missing: run scripts/setup-test-deps.sh", pytrace=False)
    return suite.cli


def extension_scenarios(suite: Suite) -> set[str]:
    """The server scenarios that `list` tags `[extension]` (no dated revision)."""
    listed = subprocess.run(
        [str(node_bin_dir() / "node"), str(suite_cli(suite)), "list", "--server"],
        env=node_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    found = set(re.findall(r"^\s*- (\S+) \[extension\]$", listed, re.MULTILINE))
    assert found, f"`conformance list --server` names no extension scenario:\n{listed}"
    return found


def run_suite(suite: Suite, url: str, out: Path) -> Results:
    """Runs the suite's server scenarios against `url`, every run of it; the checks by scenario."""
    results: Results = {}
    for label, args in suite.runs:
        run_out = out / (label or "all")
        found = run_once(suite, url, list(args), run_out)
        if label == EXTENSION:
            extensions = extension_scenarios(suite)
            found = {s: c for s, c in found.items() if s in extensions}
        keyed = {(f"{s} @{label}" if len(suite.runs) > 1 else s): c for s, c in found.items()}
        results.update(keyed)
    return results


def run_once(suite: Suite, url: str, args: list[str], out: Path) -> Results:
    out.mkdir(parents=True)
    done = subprocess.run(
        [str(node_bin_dir() / "node"), str(suite_cli(suite)), "server", "--url", url, *args, "-o", str(out)],
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
        scenario = found["scenario"]
        checks_file = entry / "checks.json"
        if checks_file.is_file():
            results[scenario] = collapse(json.loads(checks_file.read_text()))
        else:
            # The scenario threw before it recorded anything; the suite counts it as failed.
            thrown = re.search(rf"^Failed to run scenario {re.escape(scenario)}: (.*)$", done.stderr, re.MULTILINE)
            message = thrown[1] if thrown else "the scenario wrote no checks.json"
            results[scenario] = {"scenario-error": {"id": "scenario-error", "status": "FAILURE", "errorMessage": message}}
    assert results, f"the suite wrote no results for {url}:\n{done.stdout}\n{done.stderr}"
    return results


def collapse(checks: list[dict]) -> dict[str, dict]:
    """The checks by id; an id reported more than once stands at its most severe report."""
    by_id: dict[str, dict] = {}
    for check in checks:
        kept = by_id.get(check["id"])
        if kept is None or rank(check) < rank(kept):
            by_id[check["id"]] = check
    return by_id


def rank(check: dict) -> int:
    status = check["status"]
    return SEVERITY.index(status) if status in SEVERITY else len(SEVERITY)


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


# Known differences, each explained (docs/CONFORMANCE.md): what passes directly and not
# through toolwarden, by (scenario, check id — "" for the scenario's own verdict), with the
# upstreams it is known for and why. The test lists them with the table and fails on any other
# difference — and on a listed one that no longer occurs (then the entry goes), unless the
# upstream is in the entry's third member: there the direct side itself varies from run to run
# (server-everything's SSE answer to an unknown tool is sometimes an error event).
JSON_ANSWER = (
    "toolwarden answers a tools/call whose answer is the first thing to send with one JSON body, "
    "whatever the order of the client's Accept (the transport allows either answer; "
    "docs/GATEWAY.md); the suite's client lists text/event-stream first and then records the "
    "stream's priming checks as not applicable"
)
NULL_RESPONSES = (
    "rmcp parses `inputResponses: null` as absent before the gateway sees the request; directly "
    "the check passed only because the server refused every stateless request (a number in "
    "inputResponses is refused with -32602 through toolwarden)"
)
ALL_UPSTREAMS = frozenset({"everything", "conformance", "tw-test-server"})
KNOWN: dict[tuple[str, str], tuple[frozenset[str], str] | tuple[frozenset[str], str, frozenset[str]]] = {
    ("server-sse-polling", ""): (frozenset({"everything", "tw-test-server"}), JSON_ANSWER, frozenset({"everything"})),
    ("server-sse-polling", "server-sse-priming-event"): (
        frozenset({"everything", "tw-test-server"}),
        JSON_ANSWER,
        frozenset({"everything"}),
    ),
    ("server-sse-polling", "server-sse-retry-field"): (
        frozenset({"everything", "tw-test-server"}),
        JSON_ANSWER,
        frozenset({"everything"}),
    ),
    ("input-required-result-validate-input", "sep-2322-error-on-protocol-error"): (ALL_UPSTREAMS, NULL_RESPONSES),
}


def known_key(line: str) -> tuple[str, str]:
    """(scenario without its `@wire`, check id or "") of a line of `regressions`."""
    head = line.split(": ", 1)[0]
    scenario, _, check = head.partition("/")
    return scenario.split(" @")[0], check


def sort_out(lost: list[str], upstream: str, ran: set[str]) -> tuple[list[str], list[str], list[str]]:
    """The lines of `regressions` split into (unexplained, explained by KNOWN); and the KNOWN
    entries for `upstream` whose scenario ran but which did not occur (stale)."""
    unexplained, explained, seen = [], [], set()
    for line in lost:
        key = known_key(line)
        entry = KNOWN.get(key)
        if entry and upstream in entry[0]:
            explained.append(f"{line} — known: {entry[1]}")
            seen.add(key)
        else:
            unexplained.append(line)
    bases = {s.split(" @")[0] for s in ran}
    stale = [
        f"{scenario}/{check}"
        for (scenario, check), entry in sorted(KNOWN.items())
        if upstream in entry[0]
        and scenario in bases
        and (scenario, check) not in seen
        and upstream not in (entry[2] if len(entry) > 2 else ())
    ]
    return unexplained, explained, stale


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
        notes = " ".join(notes.split()).replace("|", "/")
        if len(notes) > 300:
            notes = notes[:299] + "…"
        lines.append(f"| {scenario} | {mark(d)} | {mark(t)} | {notes} |")
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

    def __init__(self, name: str, http: list[str], stdio: list[str], ready: str, must_pass: dict[str, set[str]]):
        self.name, self.http, self.stdio, self.ready = name, http, stdio, ready
        # By suite version, the scenarios it passes directly. If one fails directly, the
        # environment is broken and the comparison would prove little.
        self.must_pass = must_pass


# What the conformance server passes directly in 0.2.0-alpha.12, at the handshake wire: the
# scenarios of 0.1.16 and the new `server-session-lifecycle`.
HANDSHAKE_02 = {
    f"{s} @2025-11-25"
    for s in (
        "server-initialize", "server-session-lifecycle", "logging-set-level", "ping", "completion-complete",
        "tools-list", "tools-call-simple-text", "tools-call-image", "tools-call-audio",
        "tools-call-embedded-resource", "tools-call-mixed-content", "tools-call-with-logging",
        "tools-call-error", "tools-call-with-progress", "tools-call-sampling", "tools-call-elicitation",
        "json-schema-2020-12", "elicitation-sep1034-defaults", "server-sse-multiple-streams",
        "elicitation-sep1330-enums", "resources-list", "resources-read-text", "resources-read-binary",
        "resources-templates-read", "resources-subscribe", "resources-unsubscribe", "prompts-list",
        "prompts-get-simple", "prompts-get-with-args", "prompts-get-embedded-resource",
        "prompts-get-with-image", "dns-rebinding-protection",
    )
}


def upstreams() -> list[Upstream]:
    node = str(node_bin_dir() / "node")
    everything = str(node_bin_dir() / "mcp-server-everything")
    test_server = str(tw_test_server_bin())
    basics = {"server-initialize", "ping", "tools-list", "resources-list", "prompts-list"}
    return [
        Upstream(
            "everything",
            http=[everything, "streamableHttp"],  # its port comes from $PORT
            stdio=[everything, "stdio"],
            ready="listening on port {port}",
            must_pass={"0.1.16": basics, "0.2.0-alpha.12": {f"{s} @2025-11-25" for s in basics}},
        ),
        Upstream(
            "conformance",
            http=[node, str(CONFORMANCE_SERVER), "http", "{port}"],
            stdio=[node, str(CONFORMANCE_SERVER), "stdio"],
            ready="listening on {port}",
            # Every scenario but the pending `server-sse-polling`, which needs a
            # `test_reconnection` tool that closes the request's stream mid-call.
            must_pass={
                "0.1.16": {
                    "completion-complete", "dns-rebinding-protection", "elicitation-sep1034-defaults",
                    "elicitation-sep1330-enums", "json-schema-2020-12", "logging-set-level", "ping",
                    "prompts-get-embedded-resource", "prompts-get-simple", "prompts-get-with-args",
                    "prompts-get-with-image", "prompts-list", "resources-list", "resources-read-binary",
                    "resources-read-text", "resources-subscribe", "resources-templates-read",
                    "resources-unsubscribe", "server-initialize", "server-sse-multiple-streams",
                    "tools-call-audio", "tools-call-elicitation", "tools-call-embedded-resource",
                    "tools-call-error", "tools-call-image", "tools-call-mixed-content",
                    "tools-call-sampling", "tools-call-simple-text", "tools-call-with-logging",
                    "tools-call-with-progress", "tools-list",
                },
                "0.2.0-alpha.12": HANDSHAKE_02,
            },
        ),
        Upstream(
            "tw-test-server",
            http=[test_server, "--era", "both", "--http", "127.0.0.1:{port}"],
            stdio=[test_server, "--era", "both"],
            ready="127.0.0.1:{port}",
            must_pass={
                "0.1.16": basics,
                "0.2.0-alpha.12": {f"{s} @2025-11-25" for s in basics},
            },
        ),
    ]


def direct_run(suite: Suite, upstream: Upstream, workdir: Path) -> Results:
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
            return run_suite(suite, f"http://127.0.0.1:{port}/mcp", workdir / "direct")
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(10)


def gateway_run(suite: Suite, upstream: Upstream, workdir: Path) -> Results:
    command, *args = upstream.stdio
    config = workdir / "toolwarden.toml"
    config.write_text(
        "[gateway]\nprefix = false\n\n"
        f"[servers.{server_name(upstream)}]\n"
        f"command = {toml_str(command)}\n"
        f"args = [{', '.join(toml_str(a) for a in args)}]\n"
    )
    with serve(workdir, config, env=node_env()) as served:
        served.wait_stderr(rf'server "{server_name(upstream)}" is up', 60)
        return run_suite(suite, served.url + "/mcp", workdir / "through")


def server_name(upstream: Upstream) -> str:
    """Its `[servers.NAME]`: the upstream's name with `_` for what is not a letter or digit."""
    return re.sub(r"[^A-Za-z0-9]", "_", upstream.name)


@pytest.mark.parametrize("suite", SUITES, ids=lambda s: s.version)
@pytest.mark.parametrize("upstream", upstreams(), ids=lambda u: u.name)
def test_every_conformance_check_that_passes_directly_passes_through_toolwarden(
    suite: Suite, upstream: Upstream, tmp_path: Path
):
    direct = direct_run(suite, upstream, tmp_path)
    through = gateway_run(suite, upstream, tmp_path)
    assert_no_process(str(tmp_path))

    report = f"### {upstream.name}, suite {suite.version}\n\n" + table(direct, through)
    print("\n" + report)
    if os.environ.get("TW_CONFORMANCE_TABLE"):
        with open(os.environ["TW_CONFORMANCE_TABLE"], "a") as out:
            out.write(report + "\n")
    failing = sorted(s for s in upstream.must_pass[suite.version] if not passed(direct.get(s, {})))
    assert not failing, f"{upstream.name} fails {failing} directly; see {tmp_path}\n{report}"
    unexplained, explained, stale = sort_out(regressions(direct, through), upstream.name, set(direct))
    if explained:
        print("known differences:\n" + "\n".join(explained))
    assert not unexplained, (
        "passes directly, fails through toolwarden:\n" + "\n".join(unexplained) + "\n\n" + report
    )
    assert not stale, f"known differences that no longer occur (remove them from KNOWN): {stale}"


def timed_out(results: Results) -> set[str]:
    """The scenarios the suite stopped because they did not finish (`scenario-timeout`)."""
    return {s for s, checks in results.items() if "scenario-timeout" in checks}


@contextlib.contextmanager
def cpu_hog(processes: int = 2) -> Iterator[None]:
    """`processes` busy loops, as another workload on a shared machine."""
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in range(processes)
    ]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait(10)


def test_the_2026_suite_finishes_through_toolwarden_three_times_in_a_row_once_beside_a_cpu_hog(tmp_path: Path):
    """A stateless request that never ended was a `scenario-timeout` through toolwarden (twelve
    scenarios in one run against server-everything over Streamable HTTP). No forwarded request may
    hang: through toolwarden, in three runs in a row (the third beside two busy processes), no
    scenario times out that does not time out directly."""
    suite = SUITES[1]
    everything = next(u for u in upstreams() if u.name == "everything")
    port = free_port()
    log_path = tmp_path / "everything.log"
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            [a.replace("{port}", str(port)) for a in everything.http],
            cwd=tmp_path, env={**node_env(), "PORT": str(port)}, stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 30
        while everything.ready.replace("{port}", str(port)) not in log_path.read_text():
            assert server.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port}/mcp"
        direct = timed_out(run_suite(suite, url, tmp_path / "direct"))
        # The server reached over Streamable HTTP, as in the run that hung.
        config = tmp_path / "toolwarden.toml"
        config.write_text(f'[gateway]\nprefix = false\n\n[servers.everything]\nurl = "{url}"\n')
        with serve(tmp_path, config, env=node_env()) as served:
            served.wait_stderr(r'server "everything" is up', 60)
            for run in range(3):
                hog = cpu_hog() if run == 2 else contextlib.nullcontext()
                with hog:
                    through = timed_out(run_suite(suite, served.url + "/mcp", tmp_path / f"through-{run}"))
                assert through <= direct, f"run {run + 1}: timed out only through toolwarden: {sorted(through - direct)}"
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(10)
    assert_no_process(str(tmp_path))
