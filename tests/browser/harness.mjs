// Helpers of the browser tests: the real `toolwarden serve` with the misbehaving MCP test server,
// Debian's Chromium driven headless by playwright-core, and a TCP relay that can cut the page's
// connections. Everything listens and connects on 127.0.0.1 only, and every process a test
// starts is ended when the test ends, whether it passed or not.
//
// The binaries come from the cargo build that scripts/test.sh runs: $TOOLWARDEN_BIN and
// $TW_TEST_SERVER, else `toolwarden` and `tw-test-server` in $CARGO_TARGET_DIR/debug (or
// target/debug). A missing binary or browser fails the test; nothing is skipped.

import { spawn } from "node:child_process";
import { accessSync, constants, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
export const SCREENSHOTS = join(ROOT, "tests/browser/screenshots");
export const CHROMIUM = process.env.TW_CHROMIUM ?? "/usr/bin/chromium";

/** Flags this machine's Chromium needs: no sandbox or GPU, and no traffic beyond 127.0.0.1. */
export const CHROMIUM_ARGS = [
  "--no-sandbox",
  "--disable-gpu",
  "--disable-dev-shm-usage",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
  "--disable-quic",
  "--disable-features=Translate,MediaRouter,OptimizationHints",
];

function built(envVar, name) {
  const path =
    process.env[envVar] ?? join(process.env.CARGO_TARGET_DIR ?? join(ROOT, "target"), "debug", name);
  try {
    accessSync(path, constants.X_OK);
  } catch {
    throw new Error(
      `${name} not found at ${path}: build it (cargo build --workspace --all-targets) or set ${envVar}; scripts/test.sh does both`,
    );
  }
  return path;
}

export const toolwardenBin = () => built("TOOLWARDEN_BIN", "toolwarden");
export const testServerBin = () => built("TW_TEST_SERVER", "tw-test-server");

const tomlStr = (s) => JSON.stringify(String(s));

/** Every cleanup still to run, newest first; `cleanupAll` runs them (also on an early exit). */
const cleanups = [];
export function onCleanup(fn) {
  cleanups.push(fn);
}
export async function cleanupAll() {
  while (cleanups.length > 0) {
    const fn = cleanups.pop();
    try {
      await fn();
    } catch (e) {
      console.error("cleanup failed:", e);
    }
  }
}
// A test process that dies some other way still takes its children and temp dirs with it.
const children = new Set();
const tempDirs = new Set();
process.on("exit", () => {
  for (const child of children) {
    try {
      child.kill("SIGKILL");
    } catch {
      // already gone
    }
  }
  for (const dir of tempDirs) rmSync(dir, { recursive: true, force: true });
});

function tempDir(prefix) {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  tempDirs.add(dir);
  return dir;
}

function removeDir(dir) {
  rmSync(dir, { recursive: true, force: true });
  tempDirs.delete(dir);
}

/** Waits until `check()` is truthy (it may be async); its value. */
export async function waitFor(check, { timeout = 15_000, interval = 50, what = "a condition" } = {}) {
  const deadline = Date.now() + timeout;
  let last;
  for (;;) {
    try {
      last = await check();
      if (last) return last;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) throw new Error(`timed out after ${timeout} ms waiting for ${what} (last: ${last})`);
    await new Promise((r) => setTimeout(r, interval));
  }
}

/** A temp dir of the test's own, removed when the test ends (e.g. for two runs of serve on one audit trail). */
export function makeTempDir(prefix = "tw-browser-") {
  const dir = tempDir(prefix);
  onCleanup(() => removeDir(dir));
  return dir;
}

/**
 * `toolwarden serve` on an ephemeral port of 127.0.0.1, with the test server as `test` and
 * `extra` TOML appended (keys before its first table go to `[servers.test]`); resolves once the
 * test server is up. `env` adds variables (a token), `args` arguments of `serve` (`--headless`).
 * `dir`: run in this directory (from makeTempDir: it stays when serve stops, so a later serve
 * finds its audit trail); by default a temp dir of its own, removed when it stops. `stop()`
 * resolves with how the process exited ({code, signal}); `kill(signal)` sends it a signal
 * (SIGKILL by default) and resolves the same way once it exited.
 */
export async function startServe({ extra = "", env = {}, args = [], dir: givenDir = null } = {}) {
  const dir = givenDir ?? tempDir("tw-browser-");
  const config = `[servers.test]\ncommand = ${tomlStr(testServerBin())}\n\n${extra}\n`;
  writeFileSync(join(dir, "toolwarden.toml"), config);
  // The audit trail, unless `extra` gives it a [store] path, goes to the platform data dir: this
  // temp dir's, never the user's (two tests there would also fight over the one writer's lock).
  const childEnv = { ...process.env, XDG_DATA_HOME: join(dir, "data"), ...env };
  for (const k of ["TOOLWARDEN_CONFIG", "TOOLWARDEN_TOOL_TIMEOUT", "RUST_LOG"]) delete childEnv[k];
  if (!("TOOLWARDEN_TOKEN" in env)) delete childEnv.TOOLWARDEN_TOKEN;
  const child = spawn(toolwardenBin(), ["serve", "--config", "toolwarden.toml", "--listen", "127.0.0.1:0", ...args], {
    cwd: dir,
    env: childEnv,
    stdio: ["ignore", "ignore", "pipe"],
  });
  children.add(child);
  let stderr = "";
  child.stderr.setEncoding("utf8");
  child.stderr.on("data", (chunk) => {
    stderr += chunk;
  });
  const exited = new Promise((resolve) => child.once("exit", (code, signal) => resolve({ code, signal })));
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill("SIGTERM");
      const timer = setTimeout(() => child.kill("SIGKILL"), 15_000);
      await exited;
      clearTimeout(timer);
    }
    children.delete(child);
    if (!givenDir) removeDir(dir);
    return exited;
  };
  onCleanup(stop);
  const url = await waitFor(() => stderr.match(/listening on (http:\/\/127\.0\.0\.1:\d+)/)?.[1], {
    timeout: 30_000,
    what: `serve to listen; stderr:\n${stderr}`,
  });
  await waitFor(() => stderr.includes('server "test" is up'), { timeout: 30_000, what: "the test server to be up" });
  // `kill(signal)`: a death without shutdown (SIGKILL), for a survivor to notice; stop() still
  // cleans up after it.
  const kill = (signal = "SIGKILL") => {
    child.kill(signal);
    return exited;
  };
  return { url, dir, stop, kill, pid: child.pid, stderr: () => stderr };
}

/** Debian's Chromium, headless, with a fresh profile that is removed afterwards. */
export async function launchBrowser({ colorScheme = "light", viewport = { width: 1400, height: 1000 } } = {}) {
  try {
    accessSync(CHROMIUM, constants.X_OK);
  } catch {
    throw new Error(`${CHROMIUM} is missing: run scripts/setup-test-deps.sh (it installs Debian's chromium)`);
  }
  const { chromium } = await import("playwright-core");
  const profile = tempDir("tw-chromium-");
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: CHROMIUM_ARGS,
    viewport,
    colorScheme,
  });
  const close = async () => {
    await context.close().catch(() => {});
    removeDir(profile);
  };
  onCleanup(close);
  const page = context.pages()[0] ?? (await context.newPage());
  const problems = [];
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  page.on("console", (m) => {
    // The audit probe's 503 is how the page learns the server keeps no audit trail.
    if (m.type() === "error" && !/status of 503/.test(m.text())) problems.push(`console: ${m.text()}`);
  });
  // The page may only ever talk to 127.0.0.1.
  page.on("request", (r) => {
    const u = new URL(r.url());
    if (u.protocol !== "data:" && u.hostname !== "127.0.0.1") problems.push(`request to ${r.url()}`);
  });
  return { context, page, problems, close };
}

/** Saves a screenshot of a page (whole, or its viewport) or of one element (a locator). */
export async function screenshot(target, name, { fullPage = true } = {}) {
  mkdirSync(SCREENSHOTS, { recursive: true });
  const path = join(SCREENSHOTS, `${name}.png`);
  if (typeof target.goto === "function") await target.screenshot({ path, fullPage });
  else await target.screenshot({ path });
  return path;
}

/**
 * Starts a turn with `POST /v1/turns` and keeps its request open (the request owns the turn).
 * `answer` resolves with the JSON answer; `close()` drops the request, which aborts the turn.
 */
export function startTurn(url, calls, { session, headers = {} } = {}) {
  const controller = new AbortController();
  const answer = fetch(`${url}/v1/turns`, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify({ session_id: session, calls }),
    signal: controller.signal,
  }).then(async (r) => {
    if (r.status !== 200) throw new Error(`POST /v1/turns: ${r.status} ${await r.text()}`);
    return r.json();
  });
  answer.catch(() => {});
  const close = () => controller.abort();
  onCleanup(close);
  return { answer, close };
}

export async function getJson(url, path, headers = {}) {
  const r = await fetch(`${url}${path}`, { headers });
  if (!r.ok) throw new Error(`GET ${path}: ${r.status} ${await r.text()}`);
  return r.json();
}

/** What `tw-test-server` says it received as `notifications/cancelled`. */
export async function serverCancels(url, headers = {}) {
  const r = await fetch(`${url}/v1/turns`, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify({ calls: [{ id: "cancels", name: "test__cancels", input: {} }] }),
  });
  const answer = await r.json();
  return JSON.parse(answer.results[0].content[0].text);
}

/**
 * A TCP relay on 127.0.0.1 in front of `target` (host:port). `cut()` drops every connection
 * through it and refuses new ones until `resume()`; `requests` records the head of each HTTP
 * request that went through it (method, path, headers), so a test can see what the page sent.
 */
export async function startRelay(target) {
  const [host, port] = target.replace(/^http:\/\//, "").split(":");
  const sockets = new Set();
  const requests = [];
  let refusing = false;
  const server = net.createServer((client) => {
    if (refusing) {
      client.destroy();
      return;
    }
    const upstream = net.connect(Number(port), host);
    sockets.add(client);
    sockets.add(upstream);
    let head = "";
    client.on("data", (chunk) => {
      // Requests on a kept-alive connection: note each head that starts a chunk.
      const text = chunk.toString("latin1");
      if (/^[A-Z]+ \/\S* HTTP\/1\.1\r\n/.test(text) || head) {
        head += text;
        const end = head.indexOf("\r\n\r\n");
        if (end !== -1) {
          const [line, ...fields] = head.slice(0, end).split("\r\n");
          const [method, path] = line.split(" ");
          const headers = Object.fromEntries(
            fields.map((f) => [f.slice(0, f.indexOf(":")).toLowerCase(), f.slice(f.indexOf(":") + 1).trim()]),
          );
          requests.push({ method, path, headers, at: Date.now() });
          head = "";
        }
      }
    });
    client.pipe(upstream);
    upstream.pipe(client);
    const drop = () => {
      client.destroy();
      upstream.destroy();
      sockets.delete(client);
      sockets.delete(upstream);
    };
    client.on("error", drop);
    upstream.on("error", drop);
    client.on("close", drop);
    upstream.on("close", drop);
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const url = `http://127.0.0.1:${server.address().port}`;
  const cut = () => {
    refusing = true;
    for (const s of sockets) s.destroy();
    sockets.clear();
  };
  const resume = () => {
    refusing = false;
  };
  const close = () =>
    new Promise((resolve) => {
      cut();
      server.close(() => resolve());
    });
  onCleanup(close);
  return { url, cut, resume, requests, close };
}

/** The text of the first element `selector` finds on `page` ("" when there is none). */
export async function textOf(page, selector) {
  const el = page.locator(selector).first();
  return (await el.count()) > 0 ? ((await el.textContent()) ?? "") : "";
}

/** Waits until the text of `selector` matches `pattern`; answers that text. */
export async function waitText(page, selector, pattern, timeout = 15_000) {
  return waitFor(
    async () => {
      const t = await textOf(page, selector);
      return pattern.test(t) ? t : null;
    },
    { timeout, what: `${selector} to match ${pattern}` },
  );
}

/** Processes whose command line holds `mark` (the test servers of serves that should be gone). */
export function pidsWith(mark) {
  const found = [];
  for (const pid of readdirSync("/proc")) {
    if (!/^\d+$/.test(pid)) continue;
    try {
      if (readFileSync(`/proc/${pid}/cmdline`, "utf8").includes(mark)) found.push(Number(pid));
    } catch {
      // gone meanwhile
    }
  }
  return found;
}
