// Principals on the dashboard, in a real headless Chromium against the real `toolwarden serve`
// with token principals: alice (call, read) and bob (call, read, abort, approve), and carol (call)
// who reads only her own and may not answer approvals, not even her own call's. Each logs in through the page's token box; the page says who is signed in,
// shows whose every turn and call is (live and in the audit history), filters by principal, and
// offers Cancel only where the server would carry it out: alice sees none on bob's running call,
// bob sees one on alice's and stops it.
//
// The running calls are the test server's `test__sleep` for ten minutes, ended by the test (or by
// bob): nothing here waits for time to pass, only for what the page shows.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import {
  cleanupAll,
  getJson,
  launchBrowser,
  screenshot,
  startServe,
  startTurn,
  textOf,
  waitFor,
  waitText,
} from "./harness.mjs";

// Long and random-looking, as docs/AUTH.md asks (check warns about tokens under 32 bytes).
const ALICE = "alice-7c1e2f9a4b6d8e0f1a2b3c4d5e6f7a8b9c0d";
const BOB = "bob-0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2";
const CAROL = "carol-5d4c3b2a1f0e9d8c7b6a5f4e3d2c1b0a9f8e";

const CONFIG = `
[store]
path = "audit.db"

[tools."test__progress"]
approval = "ask"

[[auth.tokens]]
principal = "alice"
token_env = "TW_BROWSER_TOKEN_ALICE"
scopes = ["call", "read"]

[[auth.tokens]]
principal = "bob"
token_env = "TW_BROWSER_TOKEN_BOB"
scopes = ["call", "read", "abort", "approve"]

[[auth.tokens]]
principal = "carol"
token_env = "TW_BROWSER_TOKEN_CAROL"
scopes = ["call"]
`;

const as = (token) => ({ authorization: `Bearer ${token}` });

/** Opens the dashboard in a browser of its own and logs in with `token` through the token box. */
async function logIn(url, token, name) {
  const browser = await launchBrowser();
  const { page } = browser;
  await page.goto(`${url}/`);
  await page.getByRole("dialog", { name: "This server needs a token" }).waitFor();
  await page.getByRole("textbox", { name: "Token" }).fill(token);
  await page.getByRole("button", { name: "Use this token" }).click();
  await waitText(page, "#conn", /^live$/);
  await waitText(page, "#who", new RegExp(`^Signed in as ${name}$`));
  return browser;
}

const row = (callId) => `#turns .row[data-key$="/${callId}"]`;
const cancelCall = (page, callId) => page.getByRole("button", { name: `Cancel call ${callId} (test__sleep)`, exact: true });

describe("principals on the dashboard", { timeout: 240_000 }, () => {
  let server;
  let aliceTurn;
  let bobTurn;
  let turnOf;
  let alice;
  let bob;
  let carol;

  before(async () => {
    server = await startServe({
      extra: CONFIG,
      env: { TW_BROWSER_TOKEN_ALICE: ALICE, TW_BROWSER_TOKEN_BOB: BOB, TW_BROWSER_TOKEN_CAROL: CAROL },
    });
    // A call of each that ended, and one of each that runs until it is stopped.
    for (const [token, id] of [
      [CAROL, "carol-echo"],
      [ALICE, "alice-echo"],
      [BOB, "bob-echo"],
    ]) {
      const done = await startTurn(server.url, [{ id, name: "test__echo", input: { text: id } }], { session: "agent", headers: as(token) }).answer;
      assert.equal(done.results[0].toolwarden.status, "ok");
    }
    aliceTurn = startTurn(server.url, [{ id: "alice-sleep", name: "test__sleep", input: { ms: 600_001 } }], { session: "agent", headers: as(ALICE) });
    bobTurn = startTurn(server.url, [{ id: "bob-sleep", name: "test__sleep", input: { ms: 600_002 } }], { session: "agent", headers: as(BOB) });
    // Both run (bob reads everyone's turns).
    turnOf = await waitFor(
      async () => {
        const { turns } = await getJson(server.url, "/v1/turns/active", as(BOB));
        const running = (id) => turns.find((t) => t.calls.some((c) => c.call_id === id && c.state === "running"));
        const [a, b] = [running("alice-sleep"), running("bob-sleep")];
        return a && b ? { alice: a, bob: b } : null;
      },
      { what: "both sleeps to run" },
    );
    assert.equal(turnOf.alice.principal, "alice");
    assert.equal(turnOf.bob.principal, "bob");
  });

  after(async () => {
    const problems = [...(alice?.problems ?? []), ...(bob?.problems ?? []), ...(carol?.problems ?? [])];
    await cleanupAll();
    // The 401s before each token was entered are how the page learns it needs one.
    assert.deepEqual(problems.filter((p) => !/status of 401/.test(p)), [], "the pages logged no error and talked to 127.0.0.1 only");
  });

  test("alice logs in through the token box; the page names her and shows whose each turn and call is", async () => {
    alice = await logIn(server.url, ALICE, "alice");
    const { page } = alice;
    assert.match(await page.locator("#who").getAttribute("title"), /^Principal alice\. Scopes: call, read$/);
    await waitText(page, `${row("alice-sleep")} .c-principal`, /^alice$/);
    await waitText(page, `${row("bob-sleep")} .c-principal`, /^bob$/);
    assert.equal(await textOf(page, `#turns [data-turn="${turnOf.bob.turn_id}"] .turn-principal`), "bob");
    assert.equal(await textOf(page, `#turns [data-turn="${turnOf.alice.turn_id}"] .turn-principal`), "alice");
    assert.equal(await page.getByRole("columnheader", { name: "Principal" }).first().isVisible(), true);
    // Ended calls too.
    await waitText(page, '#recent-body tr[data-key$="/alice-echo"] .principal', /^alice$/);
    await waitText(page, '#recent-body tr[data-key$="/bob-echo"] .principal', /^bob$/);
    // The token is kept for the tab: a reload does not ask again, and knows who it is.
    await page.reload();
    await waitText(page, "#who", /^Signed in as alice$/);
    assert.equal(await page.getByRole("dialog", { name: "This server needs a token" }).isVisible(), false);
    await waitText(page, `${row("bob-sleep")} .c-principal`, /^bob$/);
  });

  test("alice, without abort, is offered no Cancel on bob's call or turn, and keeps hers", async () => {
    const { page } = alice;
    await cancelCall(page, "alice-sleep").waitFor();
    await page.getByRole("button", { name: `Cancel turn ${turnOf.alice.turn_id} and all its calls` }).waitFor();
    // Bob's row and turn are there, without their buttons.
    await page.locator(`${row("bob-sleep")} button[data-action="cancel-call"]`).waitFor({ state: "hidden" });
    await page.locator(`#turns [data-turn="${turnOf.bob.turn_id}"] button.cancel-turn`).waitFor({ state: "hidden" });
    assert.equal(await page.locator(row("bob-sleep")).isVisible(), true);
    assert.equal(await cancelCall(page, "bob-sleep").count(), 0);
    assert.equal(await page.getByRole("button", { name: `Cancel turn ${turnOf.bob.turn_id} and all its calls` }).count(), 0);
    await screenshot(page, "principals-alice");
    // The server would have refused it: the page offers nothing that answers 403.
    const refused = await fetch(`${server.url}/v1/turns/${turnOf.bob.turn_id}/calls/bob-sleep/abort`, { method: "POST", headers: as(ALICE) });
    assert.equal(refused.status, 403);
    assert.equal((await refused.json()).error.missing_scope, "abort");
  });

  test("the live view filters by principal", async () => {
    const { page } = alice;
    const filter = page.getByRole("combobox", { name: "Show calls of" });
    assert.deepEqual(await filter.locator("option").allTextContents(), ["everyone", "alice (you)", "bob", "carol"]);
    await filter.selectOption("bob");
    await page.locator(row("alice-sleep")).waitFor({ state: "hidden" });
    assert.equal(await page.locator(row("bob-sleep")).isVisible(), true);
    assert.equal(await page.locator('#recent-body tr[data-key$="/alice-echo"]').isVisible(), false);
    assert.equal(await page.locator('#recent-body tr[data-key$="/bob-echo"]').isVisible(), true);
    assert.equal(await page.locator("#turns-empty").isVisible(), false);
    await filter.selectOption("alice");
    await page.locator(row("bob-sleep")).waitFor({ state: "hidden" });
    assert.equal(await page.locator(row("alice-sleep")).isVisible(), true);
    // Nothing of carol's runs: the list says so, and that the others are only hidden.
    await filter.selectOption("carol");
    await waitText(page, "#turns-empty", /^No turn of carol is running \(the filter hides 2 others\)\.$/);
    assert.equal(await page.locator("#turns-empty").isVisible(), true);
    assert.equal(await page.locator('#recent-body tr[data-key$="/carol-echo"]').isVisible(), true);
    await filter.selectOption("");
    await page.locator(row("bob-sleep")).waitFor({ state: "visible" });
    assert.equal(await page.locator("#turns-empty").isVisible(), false);
    assert.equal(await page.locator(row("alice-sleep")).isVisible(), true);
    assert.equal(await page.locator('#recent-body tr[data-key$="/alice-echo"]').isVisible(), true);
  });

  test("bob, with abort, is offered Cancel on alice's call, and it stops it", async () => {
    bob = await logIn(server.url, BOB, "bob");
    const { page } = bob;
    await cancelCall(page, "bob-sleep").waitFor();
    const cancel = cancelCall(page, "alice-sleep");
    await cancel.waitFor();
    await page.getByRole("button", { name: `Cancel turn ${turnOf.alice.turn_id} and all its calls` }).waitFor();
    await screenshot(page, "principals-bob");
    await cancel.click();
    const answer = await aliceTurn.answer;
    assert.deepEqual([answer.results[0].toolwarden.status, answer.results[0].toolwarden.reason], ["cancelled", "user"]);
    // Both pages see it end, alice's call of alice's.
    for (const { page: p } of [bob, alice]) {
      await waitText(p, '#recent-body tr[data-key$="/alice-sleep"]', /alice.*cancelled\{user\}/s);
      await p.locator(row("alice-sleep")).waitFor({ state: "detached" });
    }
  });

  test("the audit history shows each call's principal and searches by principal", async () => {
    const { page } = alice;
    await page.locator("#audit-section").waitFor({ state: "visible" });
    await page.getByRole("button", { name: "Refresh the audit history" }).click();
    await waitText(page, "#audit-status", /^5 calls, newest first\.$/);
    const principals = () =>
      page.$$eval("#audit-body > tr[data-status]", (trs) => trs.map((tr) => [tr.dataset.key.split("/")[1], tr.querySelector(".principal").textContent]));
    assert.deepEqual((await principals()).sort(), [
      ["alice-echo", "alice"],
      ["alice-sleep", "alice"],
      ["bob-echo", "bob"],
      ["bob-sleep", "bob"],
      ["carol-echo", "carol"],
    ]);

    const field = page.getByRole("combobox", { name: "Principal", exact: true });
    await field.fill("bob");
    await field.press("Enter");
    await waitText(page, "#audit-status", /^2 calls with principal bob, newest first\.$/);
    assert.equal(new URL(page.url()).hash, "#audit?principal=bob");
    assert.deepEqual(await principals(), [
      ["bob-sleep", "bob"],
      ["bob-echo", "bob"],
    ]);
    assert.equal(await page.locator('#audit-body > tr[data-key$="/bob-sleep"]').getAttribute("data-status"), "running");
    // A call's events name its principal, and lead to all of its calls.
    await page.getByRole("button", { name: "Events of call bob-echo (test__echo)" }).click();
    assert.match(await textOf(page, "#audit-body tr.events-row .meta"), /Call bob-echo of turn t_\S+ by bob, session agent .* bob's calls/);
    await screenshot(page.locator("#audit-section"), "principals-audit");

    await page.goto(`${server.url}/#audit?principal=alice`);
    await waitText(page, "#audit-status", /^2 calls with principal alice, newest first\.$/);
    assert.equal(await field.inputValue(), "alice", "the form follows the URL");
    assert.deepEqual(await principals(), [
      ["alice-sleep", "alice"],
      ["alice-echo", "alice"],
    ]);
  });

  test("carol, without read, sees only her own work, and no filter to choose others with", async () => {
    carol = await logIn(server.url, CAROL, "carol");
    const { page } = carol;
    await waitText(page, '#recent-body tr[data-key$="/carol-echo"] .principal', /^carol$/);
    await page.locator("#audit-section").waitFor({ state: "visible" });
    await waitText(page, "#audit-status", /^1 call, newest first\.$/);
    // bob's call still runs, but is not hers to see: the server sends none of it.
    assert.equal((await getJson(server.url, "/v1/turns/active", as(BOB))).turns.length, 1);
    assert.equal(await page.locator("#turns .row").count(), 0);
    assert.equal(await page.locator("#recent-body tr").count(), 1);
    assert.equal(await page.locator("#principal-filter-label").isVisible(), false);
    assert.equal(await page.locator("#audit-principal-label").isVisible(), false);
    assert.equal(await page.locator('#audit-body > tr[data-key$="/carol-echo"] .principal').textContent(), "carol");
    bobTurn.close();
  });

  test("carol, without approve, sees her own call's question but is offered no answer to it", async () => {
    const { page } = carol;
    const asked = startTurn(server.url, [{ id: "carol-ask", name: "test__progress", input: { every_ms: 10, count: 1 } }], { session: "agent", headers: as(CAROL) });
    const ask = page.locator("#asks li.ask");
    await ask.waitFor();
    await waitText(page, "#asks li.ask .refusal", /needs the approve scope/);
    assert.equal(await page.getByRole("button", { name: /^Approve test__progress/ }).count(), 0);
    assert.equal(await page.getByRole("button", { name: /^Deny test__progress/ }).count(), 0);
    await screenshot(page, "principals-carol-ask");
    // bob, who holds approve, denies it; her page sees the question go.
    const { interactions } = await getJson(server.url, "/v1/interactions", as(BOB));
    const id = interactions.find((i) => i.call_id === "carol-ask").id;
    const resp = await fetch(`${server.url}/v1/interactions/${id}`, {
      method: "POST",
      headers: { ...as(BOB), "content-type": "application/json" },
      body: JSON.stringify({ action: "deny" }),
    });
    assert.equal(resp.status, 200);
    const answer = await asked.answer;
    assert.equal(answer.results[0].toolwarden.status, "denied");
    await ask.waitFor({ state: "detached" });
  });
});
