// Rules in a real headless Chromium against the real `toolwarden serve` with `[[rules]]` and an
// audit trail in the test's temp dir: a call a rule allows and one a rule denies, their
// `rule_decision` events on the audit history's timelines and in their lists of events, and the
// denial's reason wherever its outcome shows (the recent outcomes, the history's row).

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import {
  cleanupAll,
  launchBrowser,
  screenshot,
  startServe,
  startTurn,
  textOf,
  waitFor,
  waitText,
} from "./harness.mjs";

const CONFIG = `
[store]
path = "audit.db"

# rules[0]: no secrets through the echo.
[[rules]]
tools = ["test__echo"]
when = 'has(args.text) && args.text.contains("secret")'
decision = "deny"
reason = "no secrets"

# rules[1]: anything else it may echo.
[[rules]]
tools = ["test__echo"]
decision = "allow"
reason = "echo is harmless"
`;

/** The rows of the history as [call id, status]. */
async function rows(page) {
  return page.$$eval("#audit-body > tr[data-status]", (trs) => trs.map((tr) => [tr.dataset.key.split("/")[1], tr.dataset.status]));
}

/** The marks on a call's timeline, in order along it, as their classes after `mk`. */
async function marks(page, callId) {
  return page.$$eval(`#audit-body > tr[data-key$="/${callId}"] .track .mk`, (els) => els.map((e) => e.className.split(" ").slice(1).join(" ")));
}

describe("rules on the dashboard", { timeout: 120_000 }, () => {
  let server;
  let browser;
  let page;

  before(async () => {
    server = await startServe({ extra: CONFIG });
    browser = await launchBrowser({ viewport: { width: 1400, height: 1000 } });
    page = browser.page;
    await page.goto(`${server.url}/`);
    await waitText(page, "#conn", /^live$/);
    await page.locator("#audit-section").waitFor({ state: "visible" });

    // With the page live: the recent outcomes see both calls end.
    const { results } = await startTurn(
      server.url,
      [
        { id: "allowed-1", name: "test__echo", input: { text: "hello" } },
        { id: "secret-1", name: "test__echo", input: { text: "my secret" } },
      ],
      { session: "rules-a" },
    ).answer;
    assert.equal(results[0].toolwarden.status, "ok");
    const denied = results[1].toolwarden;
    assert.deepEqual([denied.status, denied.decider, denied.detail], ["denied", "rule", "no secrets (rules[0])"]);
  });

  after(async () => {
    const problems = browser?.problems ?? [];
    await cleanupAll();
    assert.deepEqual(problems, [], "the page logged no error and talked to 127.0.0.1 only");
  });

  test("the recent outcomes show the rule's reason for the denial, and the rule's decision before it", async () => {
    const secret = '#recent-body tr[data-key$="/secret-1"]';
    await waitText(page, secret, /\[DENIED\].*denied\{rule\}/s);
    const text = await textOf(page, secret);
    assert.match(text, /no secrets \(rules\[0\]\)/);
    assert.match(text, /rules\[0\], rules\[1\]: deny — no secrets → denied by rule \(rule\) → denied\{rule\}/);
    await waitText(page, '#recent-body tr[data-key$="/allowed-1"]', /rules\[1\]: allow — echo is harmless → start [\d:]+ → ok/);
  });

  test("the audit history: the decision on each call's timeline, the denial's reason on its row, the rule_decision in its events", async () => {
    await page.getByRole("combobox", { name: "Tool" }).fill("test__echo");
    await page.getByRole("combobox", { name: "Tool" }).press("Enter");
    await waitText(page, "#audit-status", /^2 calls with tool test__echo, newest first\.$/);
    assert.deepEqual((await rows(page)).sort(), [
      ["allowed-1", "ok"],
      ["secret-1", "denied"],
    ]);

    // The denied call's row: its outcome, and why.
    const secretRow = '#audit-body > tr[data-key$="/secret-1"]';
    assert.equal(await textOf(page, `${secretRow} .tag`), "[DENIED]");
    assert.equal(await textOf(page, `${secretRow} .chip`), "denied{rule}");
    assert.equal(await textOf(page, `${secretRow} .outcome .why`), " no secrets (rules[0])");
    assert.match(await page.locator(`${secretRow} .outcome`).getAttribute("title"), /no secrets \(rules\[0\]\)/);
    // The rule's decision is the first mark, in the decision's colour.
    assert.deepEqual(await marks(page, "secret-1"), ["mk-rule mk-rule-deny", "mk-denied", "mk-result mk-denied"]);
    assert.deepEqual(await marks(page, "allowed-1"), ["mk-rule mk-rule-allow", "mk-start", "mk-result mk-ok"]);
    assert.match(
      await page.locator('#audit-body > tr[data-key$="/secret-1"] .track').getAttribute("aria-label"),
      /^Timeline: rules\[0\], rules\[1\]: deny — no secrets → denied by rule \(rule\) → denied\{rule\} after \d+ ms$/,
    );
    // An allowed call has no denial detail.
    assert.equal(await page.locator('#audit-body > tr[data-key$="/allowed-1"] .outcome .why').count(), 0);

    // The denied call's events: the rule's decision first, readable, its decision styled as one.
    await page.getByRole("button", { name: "Events of call secret-1 (test__echo)" }).click();
    const events = page.getByRole("table", { name: "Events of call secret-1 (test__echo)" });
    assert.deepEqual(await events.locator("tbody tr").evaluateAll((trs) => trs.map((tr) => tr.dataset.type)), ["rule_decision", "tool_call_denied", "tool_result"]);
    const decision = events.locator('tr[data-type="rule_decision"] td.what');
    assert.equal(await decision.textContent(), "rules[0], rules[1]: deny — no secrets");
    assert.equal(await decision.locator(".chip").getAttribute("class"), "chip decision decision-deny");
    // Styled as the failures are: red, not the text's colour.
    const [chipColour, failColour] = await page.evaluate(() => {
      const probe = document.createElement("span");
      probe.className = "chip out-error";
      document.body.append(probe);
      const fail = getComputedStyle(probe).color;
      probe.remove();
      return [getComputedStyle(document.querySelector('#audit-body tr[data-type="rule_decision"] .chip')).color, fail];
    });
    assert.equal(chipColour, failColour);
    assert.match(await events.locator('tr[data-type="tool_result"]').textContent(), /denied\{rule\} after \d+ ms · 0 attempts · no secrets \(rules\[0\]\)/);
    assert.match(await textOf(page, '#audit-body tr.events-row[data-key$="/secret-1"] .meta'), /no secrets \(rules\[0\]\)/);

    // The allowed call's: its rule's decision, and the reason it gives.
    await page.getByRole("button", { name: "Events of call allowed-1 (test__echo)" }).click();
    const allowed = page.getByRole("table", { name: "Events of call allowed-1 (test__echo)" });
    assert.deepEqual(await allowed.locator("tbody tr").evaluateAll((trs) => trs.map((tr) => tr.dataset.type)), ["rule_decision", "tool_start", "tool_result"]);
    assert.equal(await allowed.locator('tr[data-type="rule_decision"] td.what').textContent(), "rules[1]: allow — echo is harmless");
    assert.equal(await allowed.locator('tr[data-type="rule_decision"] .chip').getAttribute("class"), "chip decision decision-allow");
  });

  test("looks right in light and dark", async () => {
    await page.evaluate(() => {
      document.querySelector("header.top").style.position = "static";
    });
    const section = page.locator("#audit-section");
    await screenshot(section, "audit-rules-light");
    await page.emulateMedia({ colorScheme: "dark" });
    await page.waitForTimeout(200);
    await screenshot(section, "audit-rules-dark");
    await page.emulateMedia({ colorScheme: "light" });
  });
});
