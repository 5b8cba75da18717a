// The dashboard in a real headless Chromium against the real `toolwarden serve` and the
// misbehaving MCP test server: what a person sees and what their clicks and keys really do.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import {
  cleanupAll,
  getJson,
  launchBrowser,
  screenshot,
  serverCancels,
  startRelay,
  startServe,
  startTurn,
  textOf,
  waitFor,
  waitText,
} from "./harness.mjs";

const CONFIG = `
# Asks a person before it runs (test__wipe asks for a confirmation on its own: it is destructive).
[tools."test__progress"]
approval = "ask"

# Ignores cancels: after a second it counts as abandoned, and its server keeps it.
[tools."test__hang"]
cancel_grace = "1s"
`;

/** The text of the first element `selector` finds, or "" when there is none (yet). */
/** Seconds shown by a clock ("3.4 s", "12 s", "1 m 05 s"). */
function seconds(text) {
  const m = text.match(/(?:(\d+) m )?([\d.]+) s/);
  assert.ok(m, `not a clock: ${JSON.stringify(text)}`);
  return Number(m[1] ?? 0) * 60 + Number(m[2]);
}

describe("the dashboard", { timeout: 240_000 }, () => {
  let server;
  let browser;
  let page;

  before(async () => {
    server = await startServe({ extra: CONFIG });
    browser = await launchBrowser();
    page = browser.page;
    await page.goto(`${server.url}/`);
    await waitText(page, "#conn", /^live$/);
  });

  after(async () => {
    const problems = browser?.problems ?? [];
    await cleanupAll();
    assert.deepEqual(problems, [], "the page logged no error and talked to 127.0.0.1 only");
  });

  test("is served with a strict content security policy, and knows the test server", async () => {
    const response = await fetch(`${server.url}/`);
    assert.equal(response.status, 200);
    assert.match(response.headers.get("content-type"), /^text\/html/);
    assert.match(response.headers.get("content-security-policy"), /default-src 'none'; script-src 'self'/);
    assert.equal(response.headers.get("x-content-type-options"), "nosniff");
    const etag = response.headers.get("etag");
    const again = await fetch(`${server.url}/dashboard/app.js`, { headers: { "if-none-match": etag } });
    assert.equal(again.status, 200, "another file, another tag");
    const same = await fetch(`${server.url}/`, { headers: { "if-none-match": etag } });
    assert.equal(same.status, 304);
    await waitText(page, '#servers-body tr[data-server="test"]', /test\s*up\s*25/);
  });

  test("a call that hangs ticks, and Cancel (by keyboard) ends it cancelled{user} and reaches its server", async () => {
    const turn = startTurn(server.url, [{ id: "hang-1", name: "test__hang", input: { progress_every_ms: 301 } }], {
      session: "browser-cancel",
    });
    const row = '#turns .row[data-key$="/hang-1"]';
    await waitText(page, `${row} .c-state`, /^running$/);
    await waitText(page, `${row} .msg`, /still working/);
    const first = seconds(await textOf(page, `${row} .elapsed`));
    await page.waitForTimeout(1200);
    const second = seconds(await textOf(page, `${row} .elapsed`));
    assert.ok(second >= first + 1, `the clock ticks: ${first} s, then ${second} s`);
    assert.match(await page.locator(`${row} .elapsed`).getAttribute("class"), /band-green/);
    await screenshot(page, "running-call");

    // Reach the call's Cancel button with Tab alone, and press Enter.
    const name = "Cancel call hang-1 (test__hang)";
    await page.locator("body").focus();
    await waitFor(
      async () => {
        await page.keyboard.press("Tab");
        return (await page.evaluate(() => document.activeElement?.getAttribute("aria-label"))) === name;
      },
      { timeout: 20_000, interval: 0, what: `Tab to reach "${name}"` },
    );
    await page.keyboard.press("Enter");

    const answer = await turn.answer;
    // The button went away with its call; the focus did not fall back to the page's start.
    await waitFor(async () => (await page.locator(row).count()) === 0, { what: "the call's row to go" });
    assert.equal(await page.evaluate(() => document.activeElement?.id), "running-heading");
    const outcome = answer.results[0].toolwarden;
    assert.equal(outcome.status, "cancelled");
    assert.equal(outcome.reason, "user");
    const recent = '#recent-body tr[data-key$="/hang-1"]';
    await waitText(page, recent, /cancelled\{user\}/);
    // The server was asked to stop; this tool ignores it, so after the grace its work is abandoned.
    await waitText(page, '#stopping-body tr[data-key$="/hang-1"]', /abandoned/);
    await waitText(page, recent, /stopped abandoned/);
    assert.equal(await page.locator(row).count(), 0, "no longer running");
    await screenshot(page, "cancelled-call");

    const cancels = await serverCancels(server.url);
    const ours = cancels.filter((c) => c.tool === "hang" && c.arguments?.progress_every_ms === 301);
    assert.equal(ours.length, 1, JSON.stringify(cancels));
    assert.equal(ours[0].reason, "user");
  });

  test("a call that honours the cancel is stopped cooperatively; Cancel turn stops the whole turn", async () => {
    const turn = startTurn(
      server.url,
      [
        { id: "sleep-a", name: "test__sleep", input: { ms: 600_001 } },
        { id: "sleep-b", name: "test__sleep", input: { ms: 600_002 } },
      ],
      { session: "browser-turn" },
    );
    await waitText(page, '#turns .row[data-key$="/sleep-b"] .c-state', /^running$/);
    const turnId = (await page.locator('#turns .row[data-key$="/sleep-a"]').getAttribute("data-key")).split("/")[0];
    await page.getByRole("button", { name: `Cancel turn ${turnId} and all its calls` }).click();
    const answer = await turn.answer;
    assert.deepEqual(
      answer.results.map((r) => [r.toolwarden.status, r.toolwarden.reason]),
      [
        ["cancelled", "user"],
        ["cancelled", "user"],
      ],
    );
    for (const id of ["sleep-a", "sleep-b"]) {
      await waitText(page, `#recent-body tr[data-key$="/${id}"]`, /cancelled\{user\}.*stopped cooperative/s);
    }
    assert.equal(await page.locator(`#turns [data-turn="${turnId}"]`).count(), 0);
    const cancels = await serverCancels(server.url);
    for (const ms of [600_001, 600_002]) {
      assert.equal(cancels.filter((c) => c.tool === "sleep" && c.arguments?.ms === ms).length, 1, `sleep ${ms}`);
    }
  });

  test("Approve lets a call run; Deny (by keyboard) ends the other denied{user}", async () => {
    const turn = startTurn(
      server.url,
      [
        { id: "ask-1", name: "test__progress", input: { every_ms: 150, count: 8 } },
        { id: "ask-2", name: "test__wipe", input: {} },
      ],
      { session: "browser-approvals" },
    );
    const approve = page.getByRole("button", { name: "Approve test__progress (call ask-1)" });
    const deny = page.getByRole("button", { name: "Deny test__wipe (call ask-2)" });
    await approve.waitFor();
    await deny.waitFor();
    await waitText(page, '#turns .row[data-key$="/ask-1"] .c-state', /waiting for approval/);
    await waitText(page, '#asks li:has-text("test__progress") .countdown', /^1 m 5\d s left$/);
    await waitText(page, '#asks li:has-text("test__wipe") .countdown', /^(60|5\d) s left$/);
    await screenshot(page, "approvals");

    await approve.click();
    await waitText(page, '#turns .row[data-key$="/ask-1"] .c-state', /^running$/);
    await deny.focus();
    await page.keyboard.press("Space");

    const answer = await turn.answer;
    const [ran, denied] = answer.results.map((r) => r.toolwarden);
    assert.equal(ran.status, "ok");
    assert.equal(answer.results[0].content[0].text, "done after 8 steps");
    assert.deepEqual([denied.status, denied.reason], ["denied", "user"]);
    await waitText(page, '#recent-body tr[data-key$="/ask-1"]', /ok.*done after 8 steps.*progress ×\d/s);
    await waitText(page, '#recent-body tr[data-key$="/ask-2"]', /\[DENIED\].*denied\{user\}/s);
    await waitText(page, "#asks-empty:not([hidden])", /Nothing waits/);
  });

  test("after the event stream is cut, the page reconnects and shows what happened meanwhile", async () => {
    const relay = await startRelay(server.url);
    const { page: watched, problems } = await launchBrowser();
    await watched.goto(`${relay.url}/`);
    await waitText(watched, "#conn", /^live$/);
    const slow = startTurn(server.url, [{ id: "slow-1", name: "test__sleep", input: { ms: 600_003 } }], {
      session: "browser-reconnect",
    });
    await waitText(watched, '#turns .row[data-key$="/slow-1"] .c-state', /^running$/);
    const turnId = (await watched.locator('#turns .row[data-key$="/slow-1"]').getAttribute("data-key")).split("/")[0];

    relay.cut();
    const cutAt = Date.now();
    await waitText(watched, "#conn", /reconnecting/);

    // Meanwhile: the slow call is cancelled by someone else, a quick call runs and ends, and a
    // call starts waiting for approval.
    const abort = await fetch(`${server.url}/v1/turns/${turnId}/calls/slow-1/abort`, { method: "POST" });
    assert.equal(abort.status, 200);
    assert.equal((await slow.answer).results[0].toolwarden.status, "cancelled");
    const quick = startTurn(server.url, [{ id: "quick-1", name: "test__sleep", input: { ms: 20 } }], {
      session: "browser-reconnect",
    });
    assert.equal((await quick.answer).results[0].toolwarden.status, "ok");
    const asking = startTurn(server.url, [{ id: "asked-1", name: "test__progress", input: { every_ms: 10, count: 1 } }], {
      session: "browser-reconnect",
    });
    await waitFor(async () => (await getJson(server.url, "/v1/interactions")).interactions.some((i) => i.call_id === "asked-1"), {
      what: "the approval to be pending",
    });
    const lastSeq = await watched.evaluate(() => window.toolwardenDashboard.model.lastSeq);
    relay.resume();

    await waitText(watched, "#conn", /^live$/, 20_000);
    await waitText(watched, '#recent-body tr[data-key$="/slow-1"]', /cancelled\{user\}/);
    await waitText(watched, '#recent-body tr[data-key$="/quick-1"]', /ok/);
    await watched.getByRole("button", { name: "Approve test__progress (call asked-1)" }).waitFor();
    assert.equal(await watched.locator('#turns .row[data-key$="/slow-1"]').count(), 0);
    await screenshot(watched, "reconnected");

    // It asked to resume after the last event it had. The outcomes above came from that replay:
    // no snapshot lists calls that have ended.
    const resumed = relay.requests.find((r) => r.at > cutAt && r.path === "/v1/events");
    assert.ok(resumed, JSON.stringify(relay.requests.map((r) => r.path)));
    assert.equal(resumed.headers["last-event-id"], String(lastSeq));
    assert.equal(resumed.headers.authorization, undefined, "no token on this server");

    await watched.getByRole("button", { name: "Deny test__progress (call asked-1)" }).click();
    assert.equal((await asking.answer).results[0].toolwarden.status, "denied");
    // The cut itself shows as failed loads — the stream broken mid-body, and reconnects that the
    // relay accepts and drops at once (which Chromium reports as reset, closed, empty or not
    // connected, depending on when the drop lands); nothing else may.
    const cutLoad = /net::ERR_(INCOMPLETE_CHUNKED_ENCODING|CONNECTION_RESET|CONNECTION_CLOSED|CONNECTION_ABORTED|EMPTY_RESPONSE|SOCKET_NOT_CONNECTED)/;
    assert.deepEqual(problems.filter((p) => !cutLoad.test(p)), []);
  });
});

describe("the dashboard with a token", { timeout: 120_000 }, () => {
  after(cleanupAll);

  test("asks for the token once, keeps it for the tab, and never puts it in a URL", async () => {
    const token = "tok-3f1b9c2e-browser";
    const server = await startServe({ env: { TOOLWARDEN_TOKEN: token } });
    const { page, problems } = await launchBrowser();
    const urls = [];
    const eventAuth = [];
    const auditAuth = [];
    page.on("request", (r) => {
      urls.push(r.url());
      if (new URL(r.url()).pathname === "/v1/events") eventAuth.push(r.headers().authorization ?? null);
      if (new URL(r.url()).pathname === "/v1/audit/calls") auditAuth.push(r.headers().authorization ?? null);
    });
    await page.goto(`${server.url}/`);
    const dialog = page.getByRole("dialog", { name: "This server needs a token" });
    await dialog.waitFor();
    await screenshot(page, "token");
    await page.getByRole("textbox", { name: "Token" }).fill("wrong");
    await page.keyboard.press("Enter");
    await page.locator("#token-refused:not([hidden])").waitFor();
    await page.getByRole("textbox", { name: "Token" }).fill(token);
    await page.getByRole("button", { name: "Use this token" }).click();
    await waitText(page, "#conn", /^live$/);
    await waitText(page, '#servers-body tr[data-server="test"]', /up/);
    assert.ok(eventAuth.includes(`Bearer ${token}`), JSON.stringify(eventAuth));
    // The audit history reads with the token too; its search goes in the URL, the token does not.
    await page.locator("#audit-section").waitFor({ state: "visible" });
    await page.getByRole("combobox", { name: "Status" }).selectOption("running");
    await page.getByRole("button", { name: "Search" }).click();
    await waitText(page, "#audit-status", /^No call with status running in the audit trail\.$/);
    assert.equal(new URL(page.url()).hash, "#audit?status=running");
    assert.ok(auditAuth.length >= 2 && auditAuth.every((a) => a === `Bearer ${token}`), JSON.stringify(auditAuth));

    await page.reload();
    await waitText(page, "#conn", /^live$/);
    assert.equal(await dialog.isVisible(), false, "not asked again in the same tab");
    await waitText(page, "#audit-status", /^No call with status running/);
    assert.ok(urls.length > 0);
    assert.ok(!urls.some((u) => u.includes(token)), "the token is in no URL");
    // Without the token the API refuses, while the page itself is open.
    assert.equal((await fetch(`${server.url}/v1/turns/active`)).status, 401);
    assert.equal((await fetch(`${server.url}/`)).status, 200);
    assert.deepEqual(problems.filter((p) => !/status of 401/.test(p)), []);
  });
});
