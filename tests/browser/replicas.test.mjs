// The Replicas panel of the dashboard, in a real headless Chromium against the real `toolwarden
// serve`: with the default SQLite trail (one process) the panel is absent and the page stops
// asking; with a PostgreSQL trail shared by two replicas, `a` and `b` (each `serve` with
// TOOLWARDEN_REPLICA, a lease of 1 s, in a throwaway schema of the test server's database), the
// page of `a` lists both live, `a` marked as the replica it talks to, their heartbeats moving;
// `b` is killed (SIGKILL) in the middle of a call, and within seconds the page shows it dead,
// taken over by `a` with its one call interrupted, and says so to a screen reader. A principal
// without `read` sees no panel (the page does not even ask; the server would refuse it 403).
//
// PostgreSQL is $TOOLWARDEN_TEST_POSTGRES_URL, else the one scripts/setup-test-deps.sh wrote to
// .test-deps/postgres-url, else postgres://postgres@127.0.0.1:5432/test; the schema is made
// and dropped with `psql`.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import { agoText, leaseText, replicaStateTitle, takeoverText } from "../../crates/http/assets/format.js";
import { Model } from "../../crates/http/assets/model.js";
import {
  cleanupAll,
  getJson,
  launchBrowser,
  onCleanup,
  pidsWith,
  ROOT,
  screenshot,
  startServe,
  startTurn,
  testServerBin,
  textOf,
  waitFor,
  waitText,
} from "./harness.mjs";

// Long and random-looking, as docs/AUTH.md asks.
const OPS = "ops-7c2e9a4b1d8f3e6a5c0b9d8e7f6a5b4c3d2e1f0a";
const CALLER = "caller-1f2e3d4c5b6a7980a1b2c3d4e5f6a7b8c9d0e1f2";
const as = (token) => ({ authorization: `Bearer ${token}` });
const ENV = { TW_BROWSER_TOKEN_OPS: OPS, TW_BROWSER_TOKEN_CALLER: CALLER };

/** Marks the test servers' command lines, so that the test can tell none is left running. */
const MARK = `tw-replicas-browser-${process.pid}-${Date.now()}`;

/** The PostgreSQL server of the tests (see the top of this file). */
function postgresUrl() {
  const fromEnv = process.env.TOOLWARDEN_TEST_POSTGRES_URL?.trim();
  if (fromEnv) return fromEnv;
  try {
    const written = readFileSync(join(ROOT, ".test-deps/postgres-url"), "utf8").trim();
    if (written) return written;
  } catch {
    // not written: the default
  }
  return "postgres://postgres@127.0.0.1:5432/test";
}

function psql(url, sql) {
  try {
    return execFileSync("psql", [url, "-v", "ON_ERROR_STOP=1", "-Atqc", sql], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
  } catch (e) {
    throw new Error(
      `psql ${url} -c ${JSON.stringify(sql)} failed (run scripts/setup-test-deps.sh, which starts a PostgreSQL and installs psql): ${e.stderr ?? e.message}`,
    );
  }
}

/** A schema of the test's own on the test server, dropped (with the trail in it) when the test ends; the store URL that uses it. */
function throwawaySchema() {
  const base = postgresUrl();
  const name = `tw_browser_${process.pid}_${Math.random().toString(36).slice(2, 10)}`;
  psql(base, `CREATE SCHEMA ${name}`);
  onCleanup(() => psql(base, `DROP SCHEMA IF EXISTS ${name} CASCADE`));
  const sep = base.includes("?") ? "&" : "?";
  return { name, url: `${base}${sep}options=-csearch_path%3D${name}` };
}

/** The keys of `[servers.test]`, then a PostgreSQL trail with a lease of 1 s, and two principals. */
function sharedConfig(storeUrl) {
  return `args = ${JSON.stringify(["--stderr-line", MARK])}

[store]
url = ${JSON.stringify(storeUrl)}
lease = "1s"

[[auth.tokens]]
principal = "ops"
token_env = "TW_BROWSER_TOKEN_OPS"
scopes = ["call", "read"]

[[auth.tokens]]
principal = "caller"
token_env = "TW_BROWSER_TOKEN_CALLER"
scopes = ["call"]
`;
}


/** Counts the page's requests of `GET /v1/replicas`. */
function countReplicaRequests(page) {
  const seen = { n: 0 };
  page.on("request", (r) => {
    if (new URL(r.url()).pathname === "/v1/replicas") seen.n += 1;
  });
  return seen;
}

/** Opens the dashboard in a browser of its own and logs in with `token` through the token box. */
async function logIn(url, token, name) {
  const browser = await launchBrowser({ viewport: { width: 1400, height: 1000 } });
  const { page } = browser;
  browser.replicaRequests = countReplicaRequests(page);
  await page.goto(`${url}/`);
  await page.getByRole("dialog", { name: "This server needs a token" }).waitFor();
  await page.getByRole("textbox", { name: "Token" }).fill(token);
  await page.getByRole("button", { name: "Use this token" }).click();
  await waitText(page, "#conn", /^live$/);
  await waitText(page, "#who", new RegExp(`^Signed in as ${name}$`));
  return browser;
}

const row = (id) => `#replicas-body tr[data-replica="${id}"]`;

describe("replicas in the page's logic", () => {
  test("ages, leases and takeovers in words", () => {
    assert.equal(agoText(0), "just now");
    assert.equal(agoText(999), "just now");
    assert.equal(agoText(2_400), "2 s ago");
    assert.equal(agoText(59_999), "59 s ago");
    assert.equal(agoText(125_000), "2 m 05 s ago");
    assert.equal(agoText(3_720_000), "1 h 02 m ago");
    assert.equal(agoText(3 * 86_400_000), "3 d ago");
    assert.equal(agoText(Number.NaN), "");
    assert.equal(leaseText(1000), "1 s");
    assert.equal(leaseText(5000), "5 s");
    assert.equal(leaseText(1500), "1.5 s");
    assert.equal(leaseText(250), "250 ms");
    assert.equal(leaseText(120_000), "2 m");
    assert.equal(leaseText(90_000), "1 m 30 s");
    assert.equal(takeoverText({ state: "live" }), "");
    assert.equal(takeoverText({ state: "dead", taken_over_by: "a", interrupted: 2 }), "taken over by a, 2 calls interrupted");
    assert.equal(takeoverText({ state: "dead", taken_over_by: "a", interrupted: 1 }), "taken over by a, 1 call interrupted");
    assert.equal(takeoverText({ state: "dead", taken_over_by: "a", interrupted: 0 }), "taken over by a, 0 calls interrupted");
    assert.equal(takeoverText({ state: "dead", taken_over_by: "a" }), "being taken over by a");
    assert.equal(takeoverText({ state: "dead" }), "not taken over yet");
    assert.match(replicaStateTitle("dead"), /surviving replica records the calls it left open/);
    assert.equal(replicaStateTitle("odd"), "State odd.");
  });

  test("the model shows the panel only for a shared trail, and only to a principal with read", () => {
    const m = new Model();
    assert.deepEqual(m.replicas, { shown: false, list: [], error: null });
    assert.equal(m.mayReadReplicas(), true, "until /v1/me answers, the server decides");
    m.applyReplicas({ shared: false, replicas: [] });
    assert.equal(m.replicas.shown, false);
    assert.equal(m.takeDirty().replicas, true);
    m.applyReplicas({ shared: true, replicas: [{ replica: "a", state: "live", this: true }, { state: "odd" }, { replica: "b", state: "dead" }] });
    assert.equal(m.replicas.shown, true);
    assert.deepEqual(m.replicas.list.map((r) => r.replica), ["a", "b"]);
    m.setReplicasError("The replicas could not be read: down");
    assert.deepEqual([m.replicas.shown, m.replicas.list.length, m.replicas.error], [true, 2, "The replicas could not be read: down"]);
    m.hideReplicas();
    assert.deepEqual(m.replicas, { shown: false, list: [], error: null });
    m.setReplicasError("x");
    assert.equal(m.replicas.shown, false, "an error alone does not show the panel");
    m.setReplicasError("x", { show: true });
    assert.equal(m.replicas.shown, true, "unless it says the trail is shared (503)");
    m.setMe({ principal: "caller", scopes: ["call"] });
    assert.equal(m.mayReadReplicas(), false);
    m.setMe({ principal: "ops", scopes: ["call", "read"] });
    assert.equal(m.mayReadReplicas(), true);
    m.setMe({ principal: "root", scopes: ["admin"] });
    assert.equal(m.mayReadReplicas(), true);
  });
});

describe("the replicas panel with the default SQLite trail", { timeout: 90_000 }, () => {
  let server;
  let browser;

  before(async () => {
    testServerBin();
    server = await startServe();
  });

  after(async () => {
    const problems = [...(browser?.problems ?? [])];
    await cleanupAll();
    assert.deepEqual(problems, [], "the page logged no error and talked to 127.0.0.1 only");
  });

  test("one process: the server says so, and the page shows no panel and stops asking", async () => {
    assert.deepEqual(await getJson(server.url, "/v1/replicas"), { shared: false, replicas: [] });
    browser = await launchBrowser();
    const { page } = browser;
    const requests = countReplicaRequests(page);
    const answered = page.waitForResponse((r) => new URL(r.url()).pathname === "/v1/replicas");
    await page.goto(`${server.url}/`);
    const response = await answered;
    assert.equal(response.status(), 200);
    assert.deepEqual(await response.json(), { shared: false, replicas: [] });
    await waitText(page, "#conn", /^live$/);
    // Longer than the panel's refresh: still hidden, and asked once.
    await page.waitForTimeout(3_000);
    assert.equal(await page.locator("#replicas-section").isVisible(), false);
    assert.equal(await page.locator("#replicas-section").getAttribute("hidden"), "");
    assert.equal(await page.getByRole("heading", { name: /^Replicas/ }).count(), 0, "no heading for a panel that is not there");
    assert.equal(await page.locator("#replicas-body tr").count(), 0);
    assert.equal(requests.n, 1);
    assert.equal(await page.evaluate(() => window.toolwardenDashboard.model.replicas.shown), false);
  });
});

describe("the replicas panel with a PostgreSQL trail shared by two replicas", { timeout: 180_000 }, () => {
  let a;
  let b;
  let ops;
  let caller;

  before(async () => {
    testServerBin();
    const schema = throwawaySchema();
    const extra = sharedConfig(schema.url);
    a = await startServe({ extra, env: { ...ENV, TOOLWARDEN_REPLICA: "a" } });
    b = await startServe({ extra, env: { ...ENV, TOOLWARDEN_REPLICA: "b" } });
    assert.match(a.stderr(), /audit trail: postgres:.*\(replica "a"\)/);
    assert.match(b.stderr(), /audit trail: postgres:.*\(replica "b"\)/);
  });

  after(async () => {
    const problems = [...(ops?.problems ?? []), ...(caller?.problems ?? [])];
    const stderr = { a: a?.stderr() ?? "", b: b?.stderr() ?? "" };
    await cleanupAll();
    await waitFor(() => pidsWith(MARK).length === 0, { timeout: 10_000, what: "every test server to be gone" }).catch(() => {
      assert.deepEqual(pidsWith(MARK), [], "no test server is left running");
    });
    // The 401s before each token was entered are how the page learns it needs one.
    const unexpected = problems.filter((p) => !/status of 401/.test(p));
    assert.deepEqual(unexpected, [], `the pages logged no error and talked to 127.0.0.1 only\nstderr of a:\n${stderr.a}\nstderr of b:\n${stderr.b}`);
  });

  test("the server lists both replicas, each live, the one answering as this one", async () => {
    const answer = await waitFor(
      async () => {
        const r = await getJson(a.url, "/v1/replicas", as(OPS));
        return r.replicas.length === 2 ? r : null;
      },
      { what: "both replicas to be listed" },
    );
    assert.equal(answer.shared, true);
    assert.deepEqual(
      answer.replicas.map((r) => [r.replica, r.state, r.this, r.lease_ms]),
      [
        ["a", "live", true, 1000],
        ["b", "live", false, 1000],
      ],
    );
    for (const r of answer.replicas) {
      assert.ok(Number.isFinite(Date.parse(r.heartbeat_at)) && Number.isFinite(Date.parse(r.started_at)), JSON.stringify(r));
      assert.equal(r.dead_at, undefined);
    }
    const fromB = await getJson(b.url, "/v1/replicas", as(OPS));
    assert.deepEqual(fromB.replicas.map((r) => [r.replica, r.this]), [["a", false], ["b", true]]);
    const refused = await fetch(`${a.url}/v1/replicas`, { headers: as(CALLER) });
    assert.equal(refused.status, 403, "listing the replicas needs read");
  });

  test("the page of a lists both live in a table, a marked as this replica, their heartbeats moving", async () => {
    ops = await logIn(a.url, OPS, "ops");
    const { page } = ops;
    const section = page.locator("#replicas-section");
    await section.waitFor({ state: "visible" });
    const heading = page.getByRole("heading", { name: /^Replicas/, level: 2 });
    assert.equal(await heading.textContent(), "Replicas ");
    const table = page.getByRole("table", { name: /^Replicas/ });
    assert.equal(await table.count(), 1);
    assert.deepEqual(await table.getByRole("columnheader").allTextContents(), ["Replica", "State", "Last heartbeat", "Lease"]);
    await page.locator(row("b")).waitFor();
    assert.deepEqual(await page.locator("#replicas-body tr").evaluateAll((trs) => trs.map((tr) => tr.dataset.replica)), ["a", "b"]);
    // Each row is headed by its replica; the one this page talks to says so in words.
    assert.deepEqual(await table.getByRole("rowheader").evaluateAll((ths) => ths.map((th) => th.innerText.replace(/\s+/g, " ").trim())), ["a this replica", "b"]);
    assert.equal(await page.locator(`${row("a")} .replica-this`).isVisible(), true);
    assert.equal(await page.locator(`${row("b")} .replica-this`).isVisible(), false);
    for (const id of ["a", "b"]) {
      await waitText(page, `${row(id)} .replica-state`, /^live$/);
      assert.match(await page.locator(`${row(id)} .replica-state`).getAttribute("class"), /\breplica-live\b/);
      assert.match(await textOf(page, `${row(id)} .replica-heartbeat`), /^(just now|[1-3] s ago)$/);
      assert.equal(await textOf(page, `${row(id)} .replica-lease`), "1 s");
      assert.equal(await page.locator(`${row(id)} .replica-takeover`).isVisible(), false);
    }
    assert.equal(await textOf(page, "#replicas-count"), "");
    assert.equal(await page.locator("#replicas-error").isVisible(), false);
    assert.match(await page.locator(`${row("a")} th`).getAttribute("title"), /^started .+, generation 1$/);

    // The panel reads the replicas again every few seconds: b's last heartbeat moves on the page.
    const first = await page.locator(`${row("b")} time`).getAttribute("datetime");
    await waitFor(async () => (await page.locator(`${row("b")} time`).getAttribute("datetime")) !== first, {
      timeout: 8_000,
      what: "the heartbeat of b to move on the page",
    });
    await screenshot(section, "replicas-live");
  });

  test("a principal without read sees no panel, and the page does not ask", async () => {
    caller = await logIn(a.url, CALLER, "caller");
    const { page } = caller;
    await page.waitForTimeout(3_000);
    assert.equal(await page.locator("#replicas-section").isVisible(), false);
    assert.equal(caller.replicaRequests.n, 0, "a principal without read is not offered what the server would refuse");
  });

  test("b killed mid-call: within seconds it is dead on the page, taken over by a, its call interrupted", async () => {
    const { page } = ops;
    // A call that runs on b when it dies, recorded in the shared trail before it runs.
    startTurn(b.url, [{ id: "doomed", name: "test__sleep", input: { ms: 120_000 } }], { session: "replicas", headers: as(OPS) });
    await waitFor(
      async () => {
        const { calls } = await getJson(a.url, "/v1/audit/calls?status=running&limit=10", as(OPS));
        return calls.some((c) => c.call_id === "doomed");
      },
      { what: "the call on b to be recorded as running in the shared trail" },
    );
    const exit = await b.kill("SIGKILL");
    assert.deepEqual(exit, { code: null, signal: "SIGKILL" });
    const killedAt = Date.now();

    await waitText(page, `${row("b")} .replica-state`, /^dead$/, 15_000);
    await waitText(page, `${row("b")} .replica-takeover`, /^taken over by a, 1 call interrupted$/, 15_000);
    console.log(`b shown dead with its call interrupted ${Date.now() - killedAt} ms after its SIGKILL`);
    const badge = page.locator(`${row("b")} .replica-state`);
    assert.match(await badge.getAttribute("class"), /\breplica-dead\b/);
    assert.match(await badge.getAttribute("title"), /^Declared dead/);
    assert.match(await page.locator(`${row("b")} .replica-takeover`).getAttribute("title"), /^declared dead at \d\d:\d\d:\d\d\.\d{3}$/);
    assert.equal(await textOf(page, "#replicas-count"), "(1 dead)");
    assert.equal(await textOf(page, `${row("a")} .replica-state`), "live");
    assert.equal(await page.locator("#replicas-error").isVisible(), false);
    // Dead is prominent: a red badge unlike a live one, and its row marked on its edge.
    const [dead, live, edge] = await page.evaluate(() => [
      getComputedStyle(document.querySelector('#replicas-body tr[data-replica="b"] .replica-state')).backgroundColor,
      getComputedStyle(document.querySelector('#replicas-body tr[data-replica="a"] .replica-state')).backgroundColor,
      getComputedStyle(document.querySelector('#replicas-body tr[data-replica="b"]')).boxShadow,
    ]);
    assert.notEqual(dead, live);
    assert.notEqual(edge, "none");
    // Said to a screen reader, since it happened while the page was open.
    // (Once, when the page first sees it dead: its survivor may still be at work then.)
    await waitText(page, "#announcer", /Replica b is dead: (being taken over by a|taken over by a, 1 call interrupted)/);
    // Its last heartbeat stays where it was and grows older.
    await waitText(page, `${row("b")} .replica-heartbeat`, /^[2-9] s ago$|^\d\d s ago$/, 10_000);

    // The server says the same, and the call's outcome is the survivor's.
    const answer = await getJson(a.url, "/v1/replicas", as(OPS));
    const deadB = answer.replicas.find((r) => r.replica === "b");
    assert.deepEqual([deadB.state, deadB.taken_over_by, deadB.interrupted], ["dead", "a", 1]);
    const { calls } = await getJson(a.url, "/v1/audit/calls?call=doomed&limit=10", as(OPS));
    assert.equal(calls[0]?.status, "interrupted", JSON.stringify(calls));

    await screenshot(page.locator("#replicas-section"), "replicas-dead-light");
    await page.emulateMedia({ colorScheme: "dark" });
    await page.waitForTimeout(200);
    await screenshot(page.locator("#replicas-section"), "replicas-dead-dark");
    await page.emulateMedia({ colorScheme: "light" });
  });
});
