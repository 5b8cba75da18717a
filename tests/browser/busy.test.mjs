// A busy page, as a person would keep it open beside their agents: turns of several sessions
// running for different lengths of time (green, yellow and red clocks), progress bars and
// messages, questions waiting, work being stopped, a tripped breaker, and recent outcomes of
// every kind. Saved in light and dark (docs/dashboard.png is the light one).

import assert from "node:assert/strict";
import { after, test } from "node:test";

import { cleanupAll, launchBrowser, screenshot, startServe, startTurn, waitFor } from "./harness.mjs";

const CONFIG = `
[tools."test__echo"]
approval = "ask"

[tools."test__hang"]
cancel_grace = "1s"

# One infrastructure failure (a timeout) opens its breaker.
[tools."test__sleep"]
breaker = { failures = 1, open_for = "5m" }
`;

after(cleanupAll);

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

test("a busy page shows every kind of state at once", { timeout: 120_000 }, async () => {
  const server = await startServe({ extra: CONFIG });
  const { page, problems } = await launchBrowser({ viewport: { width: 1400, height: 1050 } });
  await page.goto(`${server.url}/`);
  await waitFor(async () => (await page.locator("#conn").textContent()) === "live");
  const t0 = Date.now();

  // Running for over 30 s by the time of the picture: red clocks.
  startTurn(
    server.url,
    [
      { id: "toolu_crawl", name: "test__progress", input: { every_ms: 700, count: 90 } },
      { id: "toolu_index", name: "test__hang", input: { progress_every_ms: 1000 } },
      { id: "toolu_wait", name: "test__sleep", input: { ms: 110_000 } },
    ],
    { session: "research-agent" },
  );
  await sleep(1500);

  // Outcomes of every kind.
  const quick = async (calls, session = "research-agent") => (await startTurn(server.url, calls, { session }).answer).results;
  await quick([{ id: "toolu_fetch", name: "test__progress", input: { every_ms: 100, count: 4 } }]);
  await quick([{ id: "toolu_slow", name: "test__sleep", input: { ms: 5000 }, timeout_ms: 400 }]);
  await quick([{ id: "toolu_retry", name: "test__sleep", input: { ms: 10 } }]);
  await quick([{ id: "toolu_lint", name: "test__fail", input: {} }], "coder-agent");
  await quick([{ id: "toolu_typo", name: "test__nope", input: {} }], "coder-agent");
  const stuck = startTurn(server.url, [{ id: "toolu_stuck", name: "test__hang", input: { progress_every_ms: 500 } }], {
    session: "coder-agent",
  });
  await waitFor(async () => (await page.locator('#turns .row[data-key$="/toolu_stuck"] .c-state').textContent()) === "running");
  await page.waitForTimeout(800);
  const stuckKey = await page.locator('#turns .row[data-key$="/toolu_stuck"]').getAttribute("data-key");
  await fetch(`${server.url}/v1/turns/${stuckKey.split("/")[0]}/calls/toolu_stuck/abort`, { method: "POST" });
  await stuck.answer;

  // Started about 20 s later: yellow clocks by the time of the picture.
  await sleep(Math.max(0, 21_000 - (Date.now() - t0)));
  startTurn(
    server.url,
    [
      { id: "call_build", name: "test__progress", input: { every_ms: 450, count: 200 } },
      { id: "call_test", name: "test__progress", input: { every_ms: 900, count: 60 } },
    ],
    { session: "coder-agent" },
  );
  // And just now: green clocks, and two questions for a person.
  await sleep(Math.max(0, 28_000 - (Date.now() - t0)));
  startTurn(
    server.url,
    [
      { id: "call_deploy", name: "test__echo", input: { text: "deploy staging" } },
      { id: "call_wipe", name: "test__wipe", input: {} },
      { id: "call_watch", name: "test__progress", input: { every_ms: 600, count: 40 } },
    ],
    { session: "ops-agent" },
  );
  await sleep(Math.max(0, 33_000 - (Date.now() - t0)));

  const bands = await page.$$eval("#turns .elapsed", (els) => els.map((e) => e.className.replace("elapsed band-", "")));
  for (const band of ["green", "yellow", "red"]) assert.ok(bands.includes(band), `a ${band} clock among ${bands}`);
  assert.equal(await page.locator("#asks li").count(), 2);
  assert.match(await page.locator('#stopping-body tr[data-key$="/toolu_stuck"]').textContent(), /abandoned/);
  assert.match(await page.locator('#servers-body tr[data-server="test"]').textContent(), /test__sleep: open/);
  const recent = await page.locator("#recent-body").textContent();
  for (const outcome of ["timeout{total}", "circuit_open", "error{tool_error}", "invalid{unknown_tool}", "cancelled{user}", "ok"]) {
    assert.ok(recent.includes(outcome), `${outcome} among the recent outcomes`);
  }
  await screenshot(page, "busy-light", { fullPage: false });
  await page.emulateMedia({ colorScheme: "dark" });
  await page.waitForTimeout(200);
  await screenshot(page, "busy-dark", { fullPage: false });
  assert.deepEqual(problems, []);
});
