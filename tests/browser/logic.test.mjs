// The page's logic without a browser: the event-stream parser, the model the events build, the
// token handling, the formatting and the audit history's URL and timelines. These are the files
// the server embeds, imported as they are.

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { Api } from "../../crates/http/assets/api.js";
import { callsPath, callTimeline, describeFilters, eventLabel, hashOf, payloadText, searchFromHash } from "../../crates/http/assets/audit.js";
import {
  dateTime,
  denialDetail,
  elapsedBand,
  formatCountdown,
  formatElapsed,
  outcomeTag,
  outcomeText,
  preciseTime,
  progressText,
  ruleDecisionParts,
  ruleDecisionText,
  shortId,
  whoText,
} from "../../crates/http/assets/format.js";
import { callKey, hasScope, mayCancel, Model, passesFilter, seesOthers } from "../../crates/http/assets/model.js";
import { reconnectDelay, SseParser } from "../../crates/http/assets/sse.js";

describe("the SSE parser", () => {
  function parse(chunks) {
    const out = [];
    const parser = new SseParser((e) => out.push(e));
    for (const c of chunks) parser.feed(c);
    return out;
  }

  test("reads events split anywhere, with any line ending, skipping comments", () => {
    const text = 'id: 1\nevent: tool_start\ndata: {"a":1}\n\n: keep-alive\n\nid: 2\r\nevent: tool_result\r\ndata: x\r\ndata: y\r\n\r\nevent: lost\rdata: {"type":"lost"}\r\r';
    const whole = parse([text]);
    const expected = [
      { id: "1", event: "tool_start", data: '{"a":1}' },
      { id: "2", event: "tool_result", data: "x\ny" },
      { id: null, event: "lost", data: '{"type":"lost"}' },
    ];
    assert.deepEqual(whole, expected);
    // Byte by byte, a \r\n split between two chunks is still one line end.
    assert.deepEqual(parse([...text]), expected);
  });

  test("an event without data is not dispatched, and reconnect delays grow to 10 s with jitter", () => {
    assert.deepEqual(parse(["id: 7\nevent: x\n\n"]), []);
    for (let n = 0; n < 10; n += 1) {
      const d = reconnectDelay(n);
      const base = Math.min(10_000, 500 * 2 ** Math.min(n, 5));
      assert.ok(d >= base / 2 && d <= base, `${n}: ${d}`);
    }
  });
});

describe("formatting", () => {
  test("elapsed times, their colour bands and countdowns", () => {
    assert.deepEqual(
      [0, 3456, 9999, 10_000, 59_999, 61_000, 3_725_000].map(formatElapsed),
      ["0.0 s", "3.4 s", "9.9 s", "10 s", "59 s", "1 m 01 s", "1 h 02 m"],
    );
    assert.deepEqual(
      [0, 9_999, 10_000, 30_000, 30_001].map(elapsedBand),
      ["green", "green", "yellow", "yellow", "red"],
    );
    assert.deepEqual([0, 900, 59_000, 125_000].map(formatCountdown), ["due", "1 s left", "59 s left", "2 m 05 s left"]);
  });

  test("outcomes as the docs write them, progress, and ids", () => {
    assert.equal(outcomeText({ status: "cancelled", reason: "user" }), "cancelled{user}");
    assert.equal(outcomeText({ status: "timeout", kind: "idle", after_ms: 10 }), "timeout{idle}");
    assert.equal(outcomeText({ status: "denied", decider: "policy", reason: "user" }), "denied{user}");
    assert.equal(outcomeText({ status: "ok" }), "ok");
    assert.equal(progressText({ progress: 3, total: 10, message: "linking" }), "3 / 10 · linking");
    assert.equal(progressText({ progress: 2.5, total: null, message: null }), "2.5");
    assert.equal(shortId("t_01M80VPE16QYYGQ3JM77H6B260"), "t_…77H6B260");
    assert.equal(shortId("conv-42"), "conv-42");
  });

  test("a rule's decision: the rules that matched, the decision, the reason", () => {
    const ev = { type: "rule_decision", decision: "allow", rules: [0, 2], reason: "a read-only command" };
    assert.equal(ruleDecisionText(ev), "rules[0], rules[2]: allow — a read-only command");
    assert.deepEqual(ruleDecisionParts(ev), { rules: "rules[0], rules[2]", decision: "allow", reason: "a read-only command" });
    // No reason (or an empty one): the rules and the decision only.
    assert.equal(ruleDecisionText({ decision: "deny", rules: [1] }), "rules[1]: deny");
    assert.equal(ruleDecisionText({ decision: "confirm", rules: [3], reason: "" }), "rules[3]: confirm");
    assert.equal(ruleDecisionText({ decision: "ask" }), "rules: ask");
  });

  test("a denial's detail, unless the line already says it", () => {
    const denied = { status: "denied", decider: "rule", reason: "rule", detail: "no secrets (rules[0])" };
    assert.equal(denialDetail(denied), "no secrets (rules[0])");
    assert.equal(denialDetail(denied, "[DENIED] … Reason: no secrets (rules[0]). Do not retry it as it is"), "");
    assert.equal(denialDetail({ status: "denied", decider: "policy", reason: "policy" }), "");
    assert.equal(denialDetail({ status: "error", reason: "transport", detail: "connection refused" }), "");
  });
});

describe("the model", () => {
  const T = "t_1";
  let clock = Date.parse("2026-11-22T10:00:00.000Z");
  const at = (ms) => new Date(Date.parse("2026-11-22T10:00:00.000Z") + ms).toISOString();
  let seq = 0;
  const ev = (type, fields, ms = 0) => ({ seq: (seq += 1), ts: at(ms), type, session_id: "s1", turn_id: T, ...fields });

  function model() {
    seq = 0;
    clock = Date.parse("2026-11-22T10:00:00.000Z");
    return new Model({ now: () => clock });
  }

  test("a rule's decision is on the call's timeline before its denial", () => {
    const m = model();
    m.apply(ev("turn_start", { calls: [{ call_id: "c1", tool: "echo" }] }));
    m.apply(ev("rule_decision", { call_id: "c1", tool: "echo", decision: "deny", rules: [0], reason: "no secrets" }));
    m.apply(ev("tool_call_denied", { call_id: "c1", tool: "echo", decider: "rule", reason: "rule" }));
    m.apply(ev("tool_result", { call_id: "c1", tool: "echo", outcome: { status: "denied", decider: "rule", reason: "rule", detail: "no secrets (rules[0])" }, duration_ms: 0 }));
    const c1 = m.recentByKey.get(callKey(T, "c1")) ?? m.calls.get(callKey(T, "c1"));
    assert.deepEqual(
      c1.timeline.map((step) => [step.kind, step.text]),
      [["rule", "rules[0]: deny — no secrets"], ["denied", "denied by rule (rule)"], ["result", "result"]],
    );
  });

  test("a call runs, reports progress, is cancelled, is stopped, and its turn ends", () => {
    const m = model();
    m.apply(ev("turn_start", { calls: [{ call_id: "c1", tool: "build" }, { call_id: "c2", tool: "echo" }] }));
    const c1 = m.calls.get(callKey(T, "c1"));
    assert.equal(m.displayState(c1), "queued");
    m.apply(ev("tool_start", { call_id: "c1", tool: "build", input: {}, timeout_ms: 0 }));
    clock += 2500;
    assert.equal(m.elapsed(c1), 2500);
    m.apply(ev("tool_progress", { call_id: "c1", tool: "build", elapsed_ms: 2400, progress: 3, total: 10 }, 2400));
    assert.deepEqual(c1.progress, { progress: 3, total: 10, message: null });
    assert.deepEqual(m.counts(), { running: 2, waitingApproval: 0, stopping: 0, interactions: 0 });

    m.apply(ev("tool_result", { call_id: "c1", tool: "build", outcome: { status: "cancelled", reason: "user" }, duration_ms: 2600 }, 2600));
    assert.equal(m.displayState(c1), "stopping");
    assert.ok(m.stopping.has(c1.key));
    m.apply(ev("tool_result", { call_id: "c2", tool: "echo", outcome: { status: "ok" }, duration_ms: 1 }, 2600));
    m.apply(ev("turn_end", { outcome: "partial", results: [] }, 2601));
    assert.equal(m.turns.size, 0);
    assert.ok(m.calls.has(c1.key), "a call being stopped outlives its turn");
    assert.ok(!m.calls.has(callKey(T, "c2")));

    m.apply(ev("tool_stopped", { call_id: "c1", tool: "build", how: "cooperative", after_ms: 12 }, 2612));
    assert.equal(m.stopping.size, 0);
    assert.equal(c1.stopHow, "cooperative");
    assert.deepEqual(m.recent.map((c) => c.callId), ["c1", "c2"]);
    assert.ok(!m.calls.has(c1.key));
  });

  test("abandoned work stays until its late answer, and a stop that beats the outcome counts", () => {
    const m = model();
    m.apply(ev("turn_start", { calls: [{ call_id: "c1", tool: "hang" }, { call_id: "c2", tool: "hang" }] }));
    for (const id of ["c1", "c2"]) m.apply(ev("tool_start", { call_id: id, tool: "hang" }));
    m.apply(ev("tool_result", { call_id: "c1", outcome: { status: "timeout", kind: "total" }, duration_ms: 1000 }, 1000));
    m.apply(ev("tool_stopped", { call_id: "c1", how: "abandoned", after_ms: 2000 }, 3000));
    const c1 = m.recentByKey.get(callKey(T, "c1"));
    assert.equal(m.displayState(c1), "abandoned");
    m.apply(ev("tool_late_result", { call_id: "c1", is_error: false, after_ms: 5000 }, 6000));
    assert.equal(m.displayState(c1), "done");
    assert.equal(m.stopping.size, 0);

    // c2's stop is reported before its outcome.
    m.apply(ev("tool_stopped", { call_id: "c2", how: "cooperative", after_ms: 3 }, 6100));
    m.apply(ev("tool_result", { call_id: "c2", outcome: { status: "cancelled", reason: "user" } }, 6100));
    const c2 = m.recentByKey.get(callKey(T, "c2"));
    assert.equal(m.displayState(c2), "done");
    assert.equal(c2.stopHow, "cooperative");
  });

  test("a call that never started, or was cancelled between attempts, has nothing to stop", () => {
    const m = model();
    m.apply(ev("turn_start", { calls: [{ call_id: "c1", tool: "x" }, { call_id: "c2", tool: "y" }] }));
    m.apply(ev("tool_result", { call_id: "c1", outcome: { status: "cancelled", reason: "not_started" } }));
    m.apply(ev("tool_start", { call_id: "c2", tool: "y" }));
    m.apply(ev("tool_retry", { call_id: "c2", attempt: 2, delay_ms: 5000, cause: "attempt timeout" }, 100));
    assert.equal(m.displayState(m.calls.get(callKey(T, "c2"))), "retrying");
    clock += 200;
    m.apply(ev("tool_result", { call_id: "c2", outcome: { status: "cancelled", reason: "user" } }, 200));
    assert.equal(m.stopping.size, 0);
  });

  test("replayed events are applied once; a snapshot neither revives an ended turn nor keeps a vanished one", () => {
    const m = model();
    const start = ev("turn_start", { calls: [{ call_id: "c1", tool: "x" }] });
    m.apply(start);
    m.apply(start);
    assert.equal(m.calls.size, 1);
    m.apply(ev("turn_end", { outcome: "completed", results: [{ toolwarden: { status: "ok", call_id: "c1" } }] }));
    assert.equal(m.recent.length, 1, "the outcome comes from turn_end when its tool_result was missed");
    const seqAtRequest = m.lastSeq;
    m.applyActive(
      [
        { turn_id: T, session_id: "s1", started_at: at(0), calls: [{ call_id: "c1", tool: "x", state: "running", elapsed_ms: 5 }] },
        { turn_id: "t_2", session_id: "s1", started_at: at(0), calls: [{ call_id: "a", tool: "x", state: "running", elapsed_ms: 1500 }] },
      ],
      seqAtRequest,
    );
    assert.deepEqual([...m.turns.keys()], ["t_2"]);
    assert.equal(m.elapsed(m.calls.get(callKey("t_2", "a"))), 1500);
    // Later, t_2 is gone from the snapshot and nothing has been heard of it since: it ended unseen.
    m.applyActive([], m.lastSeq);
    assert.equal(m.turns.size, 0);
  });

  test("a page opened after calls ended shows them at the times they happened", () => {
    const m = model();
    clock += 10 * 60_000; // the page opens ten minutes after the call
    // Replayed: old events arrive now; the times shown are theirs, not the page's load time.
    m.apply(ev("turn_start", { calls: [{ call_id: "c1", tool: "x" }] }, 0));
    m.apply(ev("tool_start", { call_id: "c1", tool: "x" }, 1000));
    m.apply(ev("tool_result", { call_id: "c1", outcome: { status: "ok" }, duration_ms: 2000 }, 3000));
    const c1 = m.recentByKey.get(callKey(T, "c1"));
    assert.equal(c1.startedAt, Date.parse(at(1000)));
    assert.equal(c1.endedAt, Date.parse(at(3000)));
    assert.equal(c1.timeline[0].at, Date.parse(at(1000)));
    // Whatever the offset learned (a replay bounds it loosely), the times stay the events'; an
    // answer's Date header then bounds it tightly.
    m.observeClock(Date.parse(at(10 * 60_000)));
    assert.equal(m.offset, 0);
    assert.equal(c1.endedAt, Date.parse(at(3000)));
  });

  test("questions come and go with their events, and the clock offset follows the server's", () => {
    const m = model();
    clock += 5000; // this browser's clock is 5 s ahead of the server's
    const interaction = { id: "i_1", kind: "approval", message: "Allow?", turn_id: T, call_id: "c1", tool: "x", timeout_ms: 120_000, created_at: at(0), deadline: at(120_000) };
    m.apply(ev("interaction_requested", { interaction }));
    assert.equal(m.offset, 5000);
    assert.equal(m.interactions.get("i_1").deadlineAt - m.serverNow(), 120_000);
    assert.equal(m.calls.get(callKey(T, "c1")).state, "awaiting_approval");
    m.apply(ev("interaction_answered", { interaction_id: "i_1", kind: "approval", action: "approve", by: "http" }));
    assert.equal(m.interactions.size, 0);
    assert.equal(m.calls.get(callKey(T, "c1")).state, "approved");
    // A snapshot taken before the answer does not bring it back.
    m.applyInteractions([interaction], 0);
    assert.equal(m.interactions.size, 0);
  });
});

describe("principals", () => {
  const T0 = "2026-11-22T10:00:00.000Z";
  let seq = 0;
  const ev = (type, fields) => ({ seq: (seq += 1), ts: T0, type, ...fields });
  const alice = { principal: "alice", scopes: ["call", "read"] };
  const bob = { principal: "bob", scopes: ["call", "read", "abort"] };

  test("who may cancel what: one's own always, others' with abort (or admin); unknown means the server decides", () => {
    assert.equal(mayCancel(alice, "alice"), true);
    assert.equal(mayCancel(alice, "bob"), false);
    assert.equal(mayCancel(bob, "alice"), true);
    assert.equal(mayCancel({ principal: "root", scopes: ["admin"] }, "alice"), true, "admin holds every scope");
    assert.equal(mayCancel(null, "alice"), true, "before /v1/me answers, the button is offered");
    assert.equal(mayCancel(alice, null), true, "work of no known principal");
    assert.equal(hasScope({ principal: "x", scopes: [] }, "read"), false);
    assert.equal(hasScope({ principal: "x" }, "read"), false);
    assert.equal(seesOthers({ principal: "agent", scopes: ["call"] }), false);
    assert.equal(seesOthers(alice), true);
    assert.equal(seesOthers(null), true);
    assert.equal(passesFilter(null, "bob"), true);
    assert.equal(passesFilter("", "bob"), true);
    assert.equal(passesFilter("alice", "bob"), false);
    assert.equal(passesFilter("alice", "alice"), true);
  });

  test("turns and calls carry their principal, from events and snapshots; the filter and Cancel follow", () => {
    seq = 0;
    const m = new Model({ now: () => Date.parse(T0) });
    m.apply(ev("turn_start", { principal: "bob", session_id: "s1", turn_id: "t_b", calls: [{ call_id: "c1", tool: "sleep" }] }));
    // A turn learned from the middle of its events (a replay), and one from a snapshot only.
    m.apply(ev("tool_start", { principal: "alice", session_id: "s1", turn_id: "t_a", call_id: "c1", tool: "sleep" }));
    m.applyActive([{ turn_id: "t_c", principal: "carol", session_id: "s9", started_at: T0, calls: [{ call_id: "k", tool: "x", state: "running", elapsed_ms: 5 }] }], 0);
    assert.deepEqual(
      ["t_a", "t_b", "t_c"].map((t) => m.turns.get(t).principal),
      ["alice", "bob", "carol"],
    );
    assert.equal(m.calls.get(callKey("t_b", "c1")).principal, "bob");
    assert.equal(m.calls.get(callKey("t_a", "c1")).principal, "alice");
    assert.deepEqual(m.principals(), ["alice", "bob", "carol"]);

    // Who the page is: before it knows, every Cancel is offered; then only what the server allows.
    assert.equal(m.mayCancel("bob"), true);
    m.takeDirty();
    m.setMe(alice);
    const d = m.takeDirty();
    assert.equal(d.me, true);
    assert.ok(d.calls.has(callKey("t_b", "c1")) && d.turns.has("t_b"), "every row is drawn again");
    assert.equal(m.mayCancel("bob"), false);
    assert.equal(m.mayCancel("alice"), true);
    m.setMe({ ...alice });
    assert.equal(m.takeDirty().me, false, "the same answer again changes nothing");

    // The filter: one principal's work, or everyone's.
    m.setPrincipalFilter("bob");
    assert.equal(m.takeDirty().filter, true);
    assert.deepEqual([...m.turns.values()].filter((t) => m.shows(t.principal)).map((t) => t.turnId), ["t_b"]);
    m.setPrincipalFilter("");
    assert.equal(m.principalFilter, null);
    assert.ok([...m.turns.values()].every((t) => m.shows(t.principal)));

    // A turn first seen without a principal (an older server) learns it later, calls included.
    m.apply(ev("tool_start", { session_id: "s2", turn_id: "t_x", call_id: "c1", tool: "y" }));
    assert.equal(m.turns.get("t_x").principal, null);
    m.apply(ev("tool_progress", { principal: "dave", session_id: "s2", turn_id: "t_x", call_id: "c1", tool: "y", progress: 1 }));
    assert.equal(m.turns.get("t_x").principal, "dave");
    assert.equal(m.calls.get(callKey("t_x", "c1")).principal, "dave");
    // An interaction names its call's principal.
    m.apply(ev("interaction_requested", { principal: "erin", session_id: "s3", turn_id: "t_e", call_id: "c1", tool: "wipe", interaction: { id: "i_1", kind: "confirm", message: "?", principal: "erin", turn_id: "t_e", call_id: "c1", tool: "wipe", timeout_ms: 1000, created_at: T0, deadline: T0 } }));
    assert.equal(m.calls.get(callKey("t_e", "c1")).principal, "erin");
    assert.ok(m.principals().includes("erin"));
  });

  test("who is signed in, as the header says it", () => {
    assert.deepEqual(whoText(alice), { text: "Signed in as alice", title: "Principal alice. Scopes: call, read" });
    assert.equal(whoText({ principal: "local", scopes: ["call", "read", "abort", "approve", "admin"] }).text, "Local access (no token)");
    assert.equal(whoText({ principal: "ci", scopes: [] }).title, "Principal ci. Scopes: none");
    assert.equal(whoText(null), null);
  });

  test("the audit history's principal filter travels in the URL and becomes the API's query", () => {
    const search = { filters: { principal: "bob", tool: "test__sleep" }, cursor: null };
    assert.equal(hashOf(search), "#audit?principal=bob&tool=test__sleep");
    assert.deepEqual(searchFromHash("#audit?tool=test__sleep&principal=bob"), search);
    assert.equal(callsPath(search), "/v1/audit/calls?principal=bob&tool=test__sleep&limit=100");
    assert.equal(describeFilters(search.filters), "principal bob, tool test__sleep");
  });
});

describe("the audit history", () => {
  test("a search travels in the URL's fragment and back, and becomes the API's query", () => {
    const search = { filters: { session: "coder agent", tool: "test__sleep", status: "timeout" }, cursor: "c812" };
    const hash = hashOf(search);
    assert.equal(hash, "#audit?session=coder+agent&tool=test__sleep&status=timeout&cursor=c812");
    assert.deepEqual(searchFromHash(hash), search);
    assert.equal(callsPath(search), "/v1/audit/calls?session=coder+agent&tool=test__sleep&status=timeout&cursor=c812&limit=100");
    assert.equal(hashOf({ filters: {}, cursor: null }), "#audit");
    assert.deepEqual(searchFromHash("#audit"), { filters: {}, cursor: null });
    // Not the history's (a skip link's), and what the server would refuse, left out.
    assert.equal(searchFromHash("#audit-heading"), null);
    assert.equal(searchFromHash(""), null);
    assert.deepEqual(searchFromHash("#audit?status=fine&token=x&turn=%20t_1%20"), { filters: { turn: "t_1" }, cursor: null });
  });

  const T0 = Date.parse("2026-11-22T10:00:00.000Z");
  const ev = (type, ms, fields = {}) => ({ seq: ms, ts: new Date(T0 + ms).toISOString(), type, ...fields });

  test("a call's timeline: its marks along its life, in words too", () => {
    const call = {
      started_at: new Date(T0).toISOString(),
      status: "timeout",
      events: [
        ev("tool_start", 0, { timeout_ms: 1000 }),
        ...[100, 101, 102, 300].map((ms) => ev("tool_progress", ms, { progress: ms, elapsed_ms: ms })),
        ev("tool_retry", 400, { attempt: 2, delay_ms: 50, cause: "attempt timeout" }),
        ev("tool_timeout", 1000, { kind: "total", after_ms: 1000 }),
        ev("tool_result", 1000, { outcome: { status: "timeout", kind: "total" }, duration_ms: 1000 }),
        ev("tool_stopped", 2000, { how: "cooperative", after_ms: 1000 }),
      ],
    };
    const tl = callTimeline(call);
    assert.equal(tl.span, 2000);
    // Progress ticks: one per half percent (100, 101 and 102 ms share one); the outcome moved off the
    // timeout it coincides with, so both show.
    assert.deepEqual(
      tl.marks.map((m) => [m.kind, m.x]),
      [["start", 0], ["progress", 5], ["progress", 15], ["retry", 20], ["timeout", 50], ["result", 52.5], ["stop", 100]],
    );
    assert.deepEqual([tl.resultX, tl.afterX, tl.progress], [52.5, 100, 4]);
    assert.equal(
      tl.text,
      `start ${preciseTime(T0)} → progress ×4 → retry #2 in 50 ms (attempt timeout) → timeout total (1.0 s) → timeout{total} after 1.0 s → stopped cooperative after 1.0 s`,
    );
  });

  test("a stop found quiet at the grace's end says so, and when", () => {
    const quiet = ev("tool_stopped", 2000, { how: "cooperative", after_ms: 2000, found_quiet: true });
    assert.equal(eventLabel(quiet), "stopped cooperative (found quiet when the 2.0 s grace ran out)");
    assert.equal(eventLabel(ev("tool_stopped", 15, { how: "killed", after_ms: 15 })), "stopped killed after 15 ms");
  });

  test("marks of an instant call stay apart, and a running call's timeline runs to now", () => {
    const denied = callTimeline({ status: "denied", started_at: new Date(T0).toISOString(), events: [ev("tool_call_denied", 0, { decider: "policy", reason: "rule" }), ev("tool_result", 0, { outcome: { status: "denied", reason: "rule" }, duration_ms: 0 })] });
    assert.deepEqual(denied.marks.map((m) => [m.kind, m.x]), [["denied", 0], ["result", 2.5]]);
    assert.equal(denied.text, "denied by policy (rule) → denied{rule} after 0 ms");

    // A rule's decision comes first, marked with its decision.
    const byRule = callTimeline({
      status: "denied",
      started_at: new Date(T0).toISOString(),
      events: [
        ev("rule_decision", 0, { decision: "deny", rules: [0, 1], reason: "no secrets" }),
        ev("tool_call_denied", 0, { decider: "rule", reason: "rule" }),
        ev("tool_result", 0, { outcome: { status: "denied", decider: "rule", reason: "rule", detail: "no secrets (rules[0])" }, duration_ms: 0 }),
      ],
    });
    assert.deepEqual(byRule.marks.map((m) => [m.kind, m.x, m.decision]), [["rule", 0, "deny"], ["denied", 2.5, undefined], ["result", 5, undefined]]);
    assert.equal(byRule.text, "rules[0], rules[1]: deny — no secrets → denied by rule (rule) → denied{rule} after 0 ms");

    const running = callTimeline({ status: null, started_at: new Date(T0).toISOString(), events: [ev("tool_start", 0)] }, T0 + 4000);
    assert.deepEqual([running.running, running.span, running.resultX], [true, 4000, 100]);
    assert.equal(running.text, `start ${preciseTime(T0)} → running`);
    // Crowded at the end: pushed back from 100 %.
    const late = callTimeline({ status: "cancelled", started_at: new Date(T0).toISOString(), events: [ev("tool_start", 0), ev("tool_result", 1000, { outcome: { status: "cancelled", reason: "user" } }), ev("tool_stopped", 1000, { how: "killed" })] });
    assert.deepEqual(late.marks.map((m) => m.x), [0, 97.5, 100]);
  });

  test("events in words, payloads as the trail keeps them", () => {
    assert.equal(eventLabel(ev("interaction_answered", 0, { action: "deny", by: "http" })), "denied by http");
    assert.equal(eventLabel(ev("cache_hit", 0, { origin_call_id: "c3" })), "cache hit (result of call c3)");
    assert.equal(eventLabel(ev("tool_late_result", 0, { is_error: false, after_ms: 2500 })), "late answer after 2.5 s (discarded)");
    assert.deepEqual(payloadText({ truncated: true, bytes: 70000, head: '{"a":' }), {
      text: '{"a":…',
      note: "truncated by the audit trail: 70000 bytes, the first 5 shown",
    });
    assert.equal(payloadText({ api_key: "[MASKED]" }).text, '{\n  "api_key": "[MASKED]"\n}');
    assert.equal(outcomeTag("interrupted"), "[INTERRUPTED]");
    const noon = new Date(2026, 10, 22, 12, 0, 5).getTime();
    assert.equal(dateTime(noon, noon + 3_600_000), "12:00:05");
    assert.equal(dateTime(noon, noon + 86_400_000), "2026-11-22 12:00:05");
  });
});

describe("the token", () => {
  function storage() {
    const map = new Map();
    return { getItem: (k) => map.get(k) ?? null, setItem: (k, v) => map.set(k, v), removeItem: (k) => map.delete(k) };
  }

  test("is asked once for requests that wait together, sent as a header, and asked again when refused", async () => {
    const seen = [];
    const prompts = [];
    const answers = ["wrong", "right"];
    const realFetch = globalThis.fetch;
    globalThis.fetch = async (path, init) => {
      seen.push([path, init.headers.Authorization ?? null]);
      const ok = init.headers.Authorization === "Bearer right";
      return new Response(JSON.stringify(ok ? { ok: true } : { error: { code: "unauthorized", message: "no" } }), { status: ok ? 200 : 401 });
    };
    try {
      const api = new Api({ storage: storage(), promptToken: async (refused) => (prompts.push(refused), answers.shift()) });
      const results = await Promise.all([api.get("/v1/tools"), api.get("/v1/turns/active")]);
      assert.deepEqual(results, [{ ok: true }, { ok: true }]);
      assert.deepEqual(prompts, [false, true], "asked, then told the first token was refused");
      assert.ok(seen.every(([path]) => !path.includes("right") && !path.includes("wrong")), "never in a URL");
      assert.equal(api.currentToken(), "right");
    } finally {
      globalThis.fetch = realFetch;
    }
  });
});
