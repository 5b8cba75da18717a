// The times the dashboard shows are the events' own: a page opened long after calls ended shows
// when they started and ended, not when the page received their replayed events. "Long after"
// is made by running this browser's clock ten minutes ahead of the server's (Playwright's clock),
// which is also what a page sees whose machine's clock is off.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { cleanupAll, getJson, launchBrowser, startServe, startTurn, waitFor } from "./harness.mjs";

const AHEAD_MS = 10 * 60_000;

/** HH:MM:SS of an epoch time in this process's time zone (the browser's: both read TZ). */
function clock(epochMs) {
  const d = new Date(epochMs);
  return [d.getHours(), d.getMinutes(), d.getSeconds()].map((n) => String(n).padStart(2, "0")).join(":");
}

/** The `ts` of a call's first event of `type`, from the audit trail. */
async function eventTime(url, callId, type) {
  const { events } = await getJson(url, `/v1/audit?call=${callId}&type=${type}`);
  assert.ok(events.length > 0, `no ${type} for ${callId}`);
  return Date.parse(events[0].ts);
}

describe("the dashboard's times", { timeout: 120_000 }, () => {
  let server;
  let browser;

  before(async () => {
    server = await startServe({ extra: '[store]\npath = "audit.db"\n' });
    for (const id of ["early-1", "early-2"]) {
      await startTurn(server.url, [{ id, name: "test__sleep", input: { ms: 300 } }], { session: "times" }).answer;
    }
    browser = await launchBrowser();
  });

  after(async () => {
    const problems = browser?.problems ?? [];
    await cleanupAll();
    assert.deepEqual(problems, [], "the page logged no error and talked to 127.0.0.1 only");
  });

  test("calls that ended before the page opened show their real start and end times", async () => {
    const { page } = browser;
    await page.clock.install({ time: Date.now() + AHEAD_MS });
    await page.goto(`${server.url}/`);
    await waitFor(async () => (await page.locator("#conn").textContent()) === "live", { what: "the stream to be live" });
    for (const id of ["early-1", "early-2"]) {
      const row = `#recent-body tr[data-key$="/${id}"]`;
      await waitFor(async () => (await page.locator(row).count()) > 0, { what: `${id} in Recent outcomes` });
      const ended = await eventTime(server.url, id, "tool_result");
      assert.equal(await page.locator(`${row} .when`).textContent(), clock(ended), `${id} ended when it ended`);
      const started = await eventTime(server.url, id, "tool_start");
      const timeline = await page.locator(`${row} .timeline`).textContent();
      assert.ok(timeline?.startsWith(`start ${clock(started)} → `), `${id}'s timeline starts when it started: ${timeline}`);
    }
    // Running work still ticks in the server's time: a call started now shows a small elapsed
    // time, not ten minutes.
    const running = startTurn(server.url, [{ id: "now-1", name: "test__sleep", input: { ms: 60_000 } }], { session: "times" });
    const clockCell = '#turns [data-key$="/now-1"] .elapsed';
    const text = await waitFor(async () => {
      const t = (await page.locator(clockCell).count()) > 0 ? await page.locator(clockCell).textContent() : "";
      return /\d/.test(t ?? "") ? t : null;
    }, { what: "now-1's elapsed time" });
    assert.match(text, /^\d+(\.\d)? s$/, `a few seconds, not minutes: ${text}`);
    running.close();
  });
});
