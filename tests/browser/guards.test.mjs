// Hooks and quotas in a real headless Chromium against the real `toolwarden serve --headless`
// with a command hook, a hook that fails, a `[[quotas]]` entry and an audit trail in the test's
// temp dir: a call a hook denies, one whose arguments it rewrites, one a failed hook lets through,
// and a call the quota turns away; their `hook_decision` and `quota_exceeded` events on the live
// recent outcomes' timelines and on the audit history's (marks coloured as rule decisions are),
// in the lists of their events, and each denial's reason wherever its outcome shows. Event data
// is shown as text, never as markup.

import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import { callTimeline, eventLabel, eventPayloads } from "../../crates/http/assets/audit.js";
import { hookDecisionText, quotaExceededText, retryText } from "../../crates/http/assets/format.js";
import { callKey, Model } from "../../crates/http/assets/model.js";
import {
  cleanupAll,
  launchBrowser,
  onCleanup,
  screenshot,
  startServe,
  startTurn,
  textOf,
  waitFor,
  waitText,
} from "./harness.mjs";

/** The hook: denies an echo of "deny…", rewrites an echo of "rewrite…", allows the rest. */
const HOOK = `input=$(cat); case "$input" in *'"text":"deny'*) echo '{"decision":"deny","reason":"not on a Friday"}' ;; *'"text":"rewrite'*) echo '{"decision":"allow","args":{"text":"rewritten by the hook"}}' ;; *) echo '{"decision":"allow"}' ;; esac
`;

const config = (hookPath) => `
[store]
path = "audit.db"

[hooks.review]
command = ["sh", ${JSON.stringify(hookPath)}]
tools = ["test__echo"]

# Answers garbage: it fails, and its on_error lets the call through.
[hooks.broken]
command = ["sh", "-c", "echo sure, why not"]
tools = ["test__log"]
on_error = "allow"

# quotas[0]: one sleep a minute.
[[quotas]]
tools = ["test__sleep"]
rate = "1/min"
`;

// Markup in an argument: it must reach the page as text.
const REWRITE_TEXT = "rewrite <b>me</b> & <img src=x>";

/** The rows of the history as [call id, status]. */
async function rows(page) {
  return page.$$eval("#audit-body > tr[data-status]", (trs) => trs.map((tr) => [tr.dataset.key.split("/")[1], tr.dataset.status]));
}

/** The marks on a call's timeline, in order along it, as their classes after `mk`. */
async function marks(page, callId) {
  return page.$$eval(`#audit-body > tr[data-key$="/${callId}"] .track .mk`, (els) => els.map((e) => e.className.split(" ").slice(1).join(" ")));
}

/** A call's result from a turn's answer, by the call's id. */
function resultOf(answer, id) {
  const r = answer.results.find((x) => x.tool_use_id === id);
  assert.ok(r, `no result for ${id} in ${JSON.stringify(answer)}`);
  return r;
}

describe("hooks and quotas in the page's logic", () => {
  const T0 = Date.parse("2026-11-22T10:00:00.000Z");
  const ev = (type, ms, fields) => ({ seq: ms + 1, ts: new Date(T0 + ms).toISOString(), type, turn_id: "t_1", call_id: "c1", ...fields });

  test("a hook's decision in words: its name, decision, time, reason, failure and rewrite", () => {
    assert.equal(hookDecisionText({ hook: "review", decision: "deny", duration_ms: 12, rewritten: false, reason: "not on a Friday" }), "hook review: deny (12 ms) — not on a Friday");
    assert.equal(hookDecisionText({ hook: "review", decision: "allow", duration_ms: 3, rewritten: false }), "hook review: allow (3 ms)");
    assert.equal(
      hookDecisionText({ hook: "down", decision: "deny", duration_ms: 1500, rewritten: false, failed: true, reason: "is down" }),
      "hook down: deny (1.5 s) — failed: is down",
    );
    const rewrite = { hook: "review", decision: "allow", duration_ms: 4, rewritten: true, original_args: { text: "a" }, args: { text: "b", n: 1 } };
    assert.equal(hookDecisionText(rewrite), 'hook review: allow (4 ms) — arguments rewritten: {"text":"a"} → {"text":"b","n":1}');
    assert.deepEqual(eventPayloads({ type: "hook_decision", ...rewrite }), [
      ["arguments before the hook", { text: "a" }],
      ["arguments the hook gave", { text: "b", n: 1 }],
    ]);
    // Long arguments are cut on the line (the list of events shows them whole); ones the trail truncated show their head.
    const long = hookDecisionText({ ...rewrite, args: { text: "x".repeat(500) } });
    assert.ok(long.length < 300 && long.endsWith("…"), long);
    assert.match(hookDecisionText({ ...rewrite, original_args: { truncated: true, bytes: 9000, head: '{"text":"aaa' } }), /rewritten: \{"text":"aaa… →/);
  });

  test("a quota that ran out in words, and when to try again", () => {
    assert.equal(quotaExceededText({ quota: 0, reason: "rate_limit", bucket: "local", retry_after_ms: 12_000 }), "quota 0: rate_limit for local — retry in 12 s");
    assert.equal(quotaExceededText({ quota: 2, reason: "concurrency", bucket: "global", retry_after_ms: 250 }), "quota 2: concurrency for global — retry in 250 ms");
    assert.deepEqual([retryText(58_001), retryText(59_001), retryText(3_725_000)], ["59 s", "1 m 00 s", "1 h 02 m"]);
  });

  test("both on a call's timeline, hooks marked with their decision, in the live model too", () => {
    const denied = callTimeline({
      status: "denied",
      started_at: new Date(T0).toISOString(),
      events: [
        ev("hook_decision", 0, { hook: "review", decision: "deny", duration_ms: 4, rewritten: false, reason: "not on a Friday" }),
        ev("tool_call_denied", 0, { decider: "hook", reason: "rule" }),
        ev("tool_result", 0, { outcome: { status: "denied", decider: "hook", reason: "rule", detail: 'not on a Friday (hook "review")' }, duration_ms: 0 }),
      ],
    });
    assert.deepEqual(denied.marks.map((m) => [m.kind, m.decision]), [["hook", "deny"], ["denied", undefined], ["result", undefined]]);
    assert.equal(denied.text, "hook review: deny (4 ms) — not on a Friday → denied by hook (rule) → denied{rule} after 0 ms");
    const failed = callTimeline({ started_at: new Date(T0).toISOString(), events: [ev("hook_decision", 0, { hook: "x", decision: "maybe", failed: true, reason: "?" })] });
    assert.deepEqual([failed.marks[0].decision, failed.marks[0].failed], ["unknown", true]);

    const quota = ev("quota_exceeded", 0, { quota: 0, reason: "rate_limit", bucket: "alice", retry_after_ms: 60_000 });
    assert.equal(eventLabel(quota), "quota 0: rate_limit for alice — retry in 1 m 00 s");
    assert.equal(callTimeline({ started_at: new Date(T0).toISOString(), events: [quota] }).marks[0].kind, "quota");

    const m = new Model({ now: () => T0 });
    m.apply(ev("turn_start", 0, { seq: 1, calls: [{ call_id: "c1", tool: "sleep" }] }));
    m.apply({ ...quota, seq: 2 });
    m.apply(ev("tool_call_denied", 0, { seq: 3, decider: "quota", reason: "rate_limit" }));
    m.apply(ev("tool_result", 0, { seq: 4, outcome: { status: "denied", decider: "quota", reason: "rate_limit", retry_after_ms: 60_000, detail: "quota 0: 1/1m per principal" }, duration_ms: 0 }));
    assert.deepEqual(
      m.recentByKey.get(callKey("t_1", "c1")).timeline.map((s) => [s.kind, s.text]),
      [["quota", "quota 0: rate_limit for alice — retry in 1 m 00 s"], ["denied", "denied by quota (rate_limit)"], ["result", "result"]],
    );
  });
});

describe("hooks and quotas on the dashboard", { timeout: 120_000 }, () => {
  let server;
  let browser;
  let page;

  before(async () => {
    const hookDir = mkdtempSync(join(tmpdir(), "tw-hook-"));
    onCleanup(() => rmSync(hookDir, { recursive: true, force: true }));
    const hookPath = join(hookDir, "hook.sh");
    writeFileSync(hookPath, HOOK);

    server = await startServe({ extra: config(hookPath), args: ["--headless"] });
    browser = await launchBrowser({ viewport: { width: 1400, height: 1000 } });
    page = browser.page;
    await page.goto(`${server.url}/`);
    await waitText(page, "#conn", /^live$/);
    await page.locator("#audit-section").waitFor({ state: "visible" });

    // With the page live: the recent outcomes see every call end.
    const session = "guards-a";
    const echoes = await startTurn(
      server.url,
      [
        { id: "deny-1", name: "test__echo", input: { text: "deny me" } },
        { id: "rewrite-1", name: "test__echo", input: { text: REWRITE_TEXT } },
      ],
      { session },
    ).answer;
    const denied = resultOf(echoes, "deny-1").toolwarden;
    assert.deepEqual([denied.status, denied.decider, denied.reason, denied.detail], ["denied", "hook", "rule", 'not on a Friday (hook "review")']);
    const rewritten = resultOf(echoes, "rewrite-1");
    assert.equal(rewritten.toolwarden.status, "ok");
    assert.equal(rewritten.content[0].text, "rewritten by the hook");

    // One sleep a minute: the first runs, the second (a turn later) is turned away.
    assert.equal(resultOf(await startTurn(server.url, [{ id: "sleep-1", name: "test__sleep", input: { ms: 10 } }], { session }).answer, "sleep-1").toolwarden.status, "ok");
    const quota = resultOf(await startTurn(server.url, [{ id: "sleep-2", name: "test__sleep", input: { ms: 10 } }], { session }).answer, "sleep-2").toolwarden;
    assert.deepEqual([quota.status, quota.decider, quota.reason], ["denied", "quota", "rate_limit"]);
    assert.ok(quota.retry_after_ms > 0 && quota.retry_after_ms <= 60_000, `retry_after_ms ${quota.retry_after_ms}`);
    assert.match(quota.detail, /^quota 0: /);

    // The broken hook fails; its on_error lets the call run.
    assert.equal(resultOf(await startTurn(server.url, [{ id: "log-1", name: "test__log", input: { message: "hi" } }], { session }).answer, "log-1").toolwarden.status, "ok");
  });

  after(async () => {
    const problems = browser?.problems ?? [];
    await cleanupAll();
    assert.deepEqual(problems, [], "the page logged no error and talked to 127.0.0.1 only");
  });

  test("the recent outcomes: each hook's decision and the quota on the call's timeline, the denials' reasons", async () => {
    const row = (id) => `#recent-body tr[data-key$="/${id}"]`;
    await waitText(page, row("deny-1"), /\[DENIED\].*denied\{rule\}/s);
    const deny = await textOf(page, row("deny-1"));
    assert.match(deny, /not on a Friday \(hook "review"\)/);
    assert.match(deny, /hook review: deny \(\d+ ms\) — not on a Friday → denied by hook \(rule\) → denied\{rule\} after \d+ ms/);

    const rewrite = await waitText(page, row("rewrite-1"), /→ ok after/);
    assert.ok(
      rewrite.includes(`hook review: allow (`) &&
        rewrite.includes(` ms) — arguments rewritten: {"text":"rewrite <b>me</b> & <img src=x>"} → {"text":"rewritten by the hook"} → start `),
      rewrite,
    );

    const sleep = await waitText(page, row("sleep-2"), /\[DENIED\].*denied\{rate_limit\}/s);
    assert.match(sleep, /quota 0: /);
    assert.match(sleep, /quota 0: rate_limit for local — retry in (1 m 00 s|\d+ s) → denied by quota \(rate_limit\) → denied\{rate_limit\} after \d+ ms/);
    await waitText(page, row("sleep-1"), /start [\d:]+ → ok after/);
    assert.doesNotMatch(await textOf(page, row("sleep-1")), /quota/);

    await waitText(page, row("log-1"), /hook broken: allow \(\d+ ms\) — failed: .+ → start [\d:]+ → ok after/);

    // The arguments' markup is text: no element was made of it.
    assert.equal(await page.locator("#recent-body b, #recent-body img").count(), 0);
  });

  test("the audit history: hooks and the quota on the timelines, the denials' reasons on their rows, the events readable", async () => {
    await page.getByRole("searchbox", { name: "Session" }).fill("guards-a");
    await page.getByRole("searchbox", { name: "Session" }).press("Enter");
    await waitText(page, "#audit-status", /^5 calls with session guards-a, newest first\.$/);
    assert.deepEqual((await rows(page)).sort(), [
      ["deny-1", "denied"],
      ["log-1", "ok"],
      ["rewrite-1", "ok"],
      ["sleep-1", "ok"],
      ["sleep-2", "denied"],
    ]);

    // The hook's denial: its outcome, and why.
    const denyRow = '#audit-body > tr[data-key$="/deny-1"]';
    assert.equal(await textOf(page, `${denyRow} .tag`), "[DENIED]");
    assert.equal(await textOf(page, `${denyRow} .chip`), "denied{rule}");
    assert.equal(await textOf(page, `${denyRow} .outcome .why`), ' not on a Friday (hook "review")');
    assert.match(await page.locator(`${denyRow} .outcome`).getAttribute("title"), /not on a Friday \(hook "review"\)/);
    // The quota's denial: its outcome, and which quota.
    const quotaRow = '#audit-body > tr[data-key$="/sleep-2"]';
    assert.equal(await textOf(page, `${quotaRow} .chip`), "denied{rate_limit}");
    assert.match(await textOf(page, `${quotaRow} .outcome .why`), /^ quota 0: \S+ per principal$/);

    // Each decision is a mark in the decision's colour; the failed hook's is striped; the quota's its own.
    assert.deepEqual(await marks(page, "deny-1"), ["mk-hook mk-hook-deny", "mk-denied", "mk-result mk-denied"]);
    assert.deepEqual(await marks(page, "rewrite-1"), ["mk-hook mk-hook-allow", "mk-start", "mk-result mk-ok"]);
    assert.deepEqual(await marks(page, "log-1"), ["mk-hook mk-hook-allow mk-hook-failed", "mk-start", "mk-result mk-ok"]);
    assert.deepEqual(await marks(page, "sleep-2"), ["mk-quota", "mk-denied", "mk-result mk-denied"]);
    assert.deepEqual(await marks(page, "sleep-1"), ["mk-start", "mk-result mk-ok"]);
    assert.match(
      await page.locator(`${denyRow} .track`).getAttribute("aria-label"),
      /^Timeline: hook review: deny \(\d+ ms\) — not on a Friday → denied by hook \(rule\) → denied\{rule\} after \d+ ms$/,
    );
    assert.match(
      await page.locator(`${quotaRow} .track`).getAttribute("aria-label"),
      /^Timeline: quota 0: rate_limit for local — retry in (1 m 00 s|\d+ s) → denied by quota \(rate_limit\) → denied\{rate_limit\} after \d+ ms$/,
    );
    // Coloured as a rule's decisions are.
    const colours = await page.evaluate(() => {
      const probe = (cls) => {
        const el = document.createElement("span");
        el.className = cls;
        document.querySelector("#audit-body .track").append(el);
        const c = getComputedStyle(el).backgroundColor;
        el.remove();
        return c;
      };
      const of = (sel) => getComputedStyle(document.querySelector(sel)).backgroundColor;
      return {
        hookDeny: of('#audit-body > tr[data-key$="/deny-1"] .mk-hook'),
        ruleDeny: probe("mk mk-rule mk-rule-deny"),
        hookAllow: of('#audit-body > tr[data-key$="/rewrite-1"] .mk-hook'),
        ruleAllow: probe("mk mk-rule mk-rule-allow"),
        quota: of('#audit-body > tr[data-key$="/sleep-2"] .mk-quota'),
      };
    });
    assert.equal(colours.hookDeny, colours.ruleDeny);
    assert.equal(colours.hookAllow, colours.ruleAllow);
    assert.equal(colours.quota, colours.ruleDeny);
    assert.notEqual(colours.hookDeny, colours.hookAllow);

    // The denied call's events: the hook's decision first, its decision styled as one.
    await page.getByRole("button", { name: "Events of call deny-1 (test__echo)" }).click();
    const events = page.getByRole("table", { name: "Events of call deny-1 (test__echo)" });
    assert.deepEqual(await events.locator("tbody tr").evaluateAll((trs) => trs.map((tr) => tr.dataset.type)), ["hook_decision", "tool_call_denied", "tool_result"]);
    const decision = events.locator('tr[data-type="hook_decision"] td.what');
    assert.match(await decision.textContent(), /^hook review: deny \(\d+ ms\) — not on a Friday$/);
    assert.equal(await decision.locator(".chip").getAttribute("class"), "chip decision decision-deny");
    const [chipColour, failColour] = await page.evaluate(() => {
      const probe = document.createElement("span");
      probe.className = "chip out-error";
      document.body.append(probe);
      const fail = getComputedStyle(probe).color;
      probe.remove();
      return [getComputedStyle(document.querySelector('#audit-body tr[data-type="hook_decision"] .chip')).color, fail];
    });
    assert.equal(chipColour, failColour);
    assert.match(await events.locator('tr[data-type="tool_result"]').textContent(), /denied\{rule\} after \d+ ms · 0 attempts · not on a Friday \(hook "review"\)/);

    // The rewrite: both arguments, on the line and whole below it, as text.
    await page.getByRole("button", { name: "Events of call rewrite-1 (test__echo)" }).click();
    const rewrite = page.getByRole("table", { name: "Events of call rewrite-1 (test__echo)" });
    assert.deepEqual(await rewrite.locator("tbody tr").evaluateAll((trs) => trs.map((tr) => tr.dataset.type)), ["hook_decision", "tool_start", "tool_result"]);
    const hookRow = rewrite.locator('tr[data-type="hook_decision"]');
    assert.equal(await hookRow.locator(".chip").getAttribute("class"), "chip decision decision-allow");
    assert.match(
      await hookRow.locator("td.what > span").textContent(),
      /^hook review: allow \(\d+ ms\) — arguments rewritten: \{"text":"rewrite <b>me<\/b> & <img src=x>"\} → \{"text":"rewritten by the hook"\}$/,
    );
    assert.deepEqual(await hookRow.locator(".payload-name").allTextContents(), ["arguments before the hook", "arguments the hook gave"]);
    assert.deepEqual(
      (await hookRow.locator(".payload pre").allTextContents()).map((t) => JSON.parse(t)),
      [{ text: REWRITE_TEXT }, { text: "rewritten by the hook" }],
    );
    // The tool got the hook's arguments.
    assert.equal(JSON.parse(await rewrite.locator('tr[data-type="tool_start"] .payload pre').textContent()).text, "rewritten by the hook");

    // The failed hook: the failure marked as one.
    await page.getByRole("button", { name: "Events of call log-1 (test__log)" }).click();
    const failed = page.getByRole("table", { name: "Events of call log-1 (test__log)" }).locator('tr[data-type="hook_decision"] td.what');
    assert.match(await failed.textContent(), /^hook broken: allow \(\d+ ms\) — failed: .+$/);
    assert.deepEqual(await failed.locator(".chip").evaluateAll((els) => els.map((e) => [e.className, e.textContent])), [
      ["chip decision decision-allow", "allow"],
      ["chip out-error", "failed"],
    ]);

    // The quota: what ran out, whose bucket, when to try again; the outcome says it too.
    await page.getByRole("button", { name: "Events of call sleep-2 (test__sleep)" }).click();
    const quota = page.getByRole("table", { name: "Events of call sleep-2 (test__sleep)" });
    assert.deepEqual(await quota.locator("tbody tr").evaluateAll((trs) => trs.map((tr) => tr.dataset.type)), ["quota_exceeded", "tool_call_denied", "tool_result"]);
    const exceeded = quota.locator('tr[data-type="quota_exceeded"] td.what');
    assert.match(await exceeded.textContent(), /^quota 0: rate_limit for local — retry in (1 m 00 s|\d+ s)$/);
    assert.equal(await exceeded.locator(".chip").getAttribute("class"), "chip decision decision-deny");
    assert.match(await quota.locator('tr[data-type="tool_call_denied"]').textContent(), /denied by quota \(rate_limit\)/);
    assert.match(await quota.locator('tr[data-type="tool_result"]').textContent(), /denied\{rate_limit\} after \d+ ms · 0 attempts · quota 0: .+ · retry after (1 m 00 s|\d+ s)/);

    // Nothing of the events' data became markup.
    assert.equal(await page.locator("#audit-body b, #audit-body img").count(), 0);
  });

  test("looks right in light and dark", async () => {
    await page.evaluate(() => {
      document.querySelector("header.top").style.position = "static";
    });
    const section = page.locator("#audit-section");
    await screenshot(section, "audit-guards-light");
    await page.emulateMedia({ colorScheme: "dark" });
    await page.waitForTimeout(200);
    await screenshot(section, "audit-guards-dark");
    // The live view's recent outcomes, dark, with the same calls.
    await screenshot(page.locator("#recent-section"), "recent-guards-dark");
    await page.emulateMedia({ colorScheme: "light" });
  });
});
