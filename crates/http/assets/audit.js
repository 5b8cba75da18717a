// The audit history: every call the audit trail recorded, newest first, searched by principal,
// session, turn, call, tool and status; each call on one line with its timeline, its events a press away.
//
// It reads `GET /v1/audit/calls` a page at a time (docs/HTTP-API.md) and, unlike the rest of the
// page, is not live: it is a search. What the event stream says about it is only this: a call
// the history shows as running has ended since, so the page says so and Refresh reads it again.
//
// The search is kept in the URL's fragment (`#audit?tool=build&status=timeout&cursor=c812`), so
// a view can be reloaded, bookmarked or shared, and Back returns to the previous one. A fragment
// is never sent to a server; the bearer token is never in it (it travels only in the
// Authorization header, see api.js).
//
// The section shows only when the server keeps an audit trail (`GET /v1/audit` answers).
//
// The top half is pure (the URL, the timeline, how events read) and runs in Node's tests; the
// class below it draws.

import {
  DECISIONS,
  dateTime,
  denialDetail,
  formatDuration,
  hookDecisionParts,
  hookDecisionTail,
  hookDecisionText,
  outcomeTag,
  outcomeText,
  preciseTime,
  progressText,
  quotaExceededParts,
  quotaExceededText,
  retryText,
  ruleDecisionParts,
  ruleDecisionText,
  shortDigest,
  shortId,
  stopText,
  toolAcceptedText,
  toolChangedText,
} from "./format.js";
import { h } from "./view.js";

/** What `status` accepts: the outcome statuses, and `running` for calls without one yet. */
export const STATUSES = ["ok", "error", "timeout", "cancelled", "denied", "circuit_open", "invalid", "interrupted", "running"];
/** The filters, in the order of the form and of the URL. */
export const FILTERS = ["principal", "session", "turn", "call", "tool", "status"];
/** Calls per page. */
export const PAGE_SIZE = 100;

// --- the search and the URL -----------------------------------------------------------------

/**
 * The search a URL fragment holds (`#audit?session=s1&cursor=c9` → {filters: {session: "s1"},
 * cursor: "c9"}), or null when the fragment is not the history's (a skip link's, say).
 * Parameters it does not know, and a status the server would refuse, are left out.
 */
export function searchFromHash(hash) {
  const m = /^#audit(?:\?(.*))?$/.exec(hash ?? "");
  if (!m) return null;
  const params = new URLSearchParams(m[1] ?? "");
  const filters = {};
  for (const name of FILTERS) {
    const value = params.get(name)?.trim();
    if (value && (name !== "status" || STATUSES.includes(value))) filters[name] = value;
  }
  return { filters, cursor: params.get("cursor") || null };
}

function searchParams({ filters, cursor }) {
  const params = new URLSearchParams();
  for (const name of FILTERS) if (filters[name]) params.set(name, filters[name]);
  if (cursor) params.set("cursor", cursor);
  return params;
}

/** The URL fragment of a search: what searchFromHash reads back. */
export function hashOf(search) {
  const q = searchParams(search).toString();
  return q ? `#audit?${q}` : "#audit";
}

/** The API request of a search. */
export function callsPath(search, limit = PAGE_SIZE) {
  const params = searchParams(search);
  params.set("limit", String(limit));
  return `/v1/audit/calls?${params}`;
}

export function sameFilters(a, b) {
  return FILTERS.every((name) => (a[name] ?? "") === (b[name] ?? ""));
}

/** A search in words: "principal alice, tool test__sleep, status timeout". */
export function describeFilters(filters) {
  return FILTERS.filter((name) => filters[name]).map((name) => `${name} ${filters[name]}`).join(", ");
}

// --- how events read ------------------------------------------------------------------------

/** The mark an event leaves on a call's timeline. */
const MARKS = {
  rule_decision: "rule",
  hook_decision: "hook",
  quota_exceeded: "quota",
  tool_start: "start",
  tool_progress: "progress",
  tool_retry: "retry",
  tool_timeout: "timeout",
  tool_result: "result",
  tool_stopped: "stop",
  tool_late_result: "late",
  tool_call_denied: "denied",
  interaction_requested: "ask",
  interaction_answered: "answer",
  interaction_timed_out: "answer",
  cache_hit: "cache",
};

/** Marks (other than progress ticks) closer than this, in % of the track, are moved apart. */
const MIN_GAP = 2.5;

const ms = (n) => formatDuration(Number(n) || 0);

/** An event in a few words: "retry #2 in 300 ms (attempt timeout)", "stopped cooperative after 15 ms". */
export function eventLabel(ev) {
  switch (ev.type) {
    case "tool_start":
      return `start ${preciseTime(Date.parse(ev.ts))}`;
    case "tool_progress":
      return progressText(ev) || "still running";
    case "tool_retry":
      return `retry #${ev.attempt ?? "?"} in ${ms(ev.delay_ms)}${ev.cause ? ` (${ev.cause})` : ""}`;
    case "tool_timeout":
      return `timeout ${ev.kind ?? ""} (${ms(ev.after_ms)})`.replace(/\s+/g, " ");
    case "tool_result":
      return `${outcomeText(ev.outcome ?? { status: "unknown" })}${ev.duration_ms != null ? ` after ${ms(ev.duration_ms)}` : ""}`;
    case "tool_stopped":
      return stopText(ev);
    case "tool_late_result":
      return `late ${ev.is_error ? "error" : "answer"} after ${ms(ev.after_ms)} (discarded)`;
    case "rule_decision":
      return ruleDecisionText(ev);
    case "hook_decision":
      return hookDecisionText(ev);
    case "quota_exceeded":
      return quotaExceededText(ev);
    case "tool_call_denied":
      return `denied by ${ev.decider ?? "?"} (${ev.reason ?? "?"})`;
    case "interaction_requested":
      return `${ev.interaction?.kind ?? "question"} asked`;
    case "interaction_answered":
      return `${ev.action === "approve" ? "approved" : "denied"}${ev.by ? ` by ${ev.by}` : ""}`;
    case "interaction_timed_out":
      return `no answer within ${ms(ev.after_ms)}`;
    case "cache_hit":
      return `cache hit${ev.origin_call_id ? ` (result of call ${ev.origin_call_id})` : ""}`;
    case "tool_changed":
      return toolChangedText(ev);
    case "tool_accepted":
      return toolAcceptedText(ev);
    default:
      return String(ev.type ?? "event");
  }
}

/** The key fields of an event, for the list of a call's events. */
export function eventDetail(ev) {
  switch (ev.type) {
    case "tool_start": {
      const parts = [`timeout ${ev.timeout_ms ? ms(ev.timeout_ms) : "none"}`];
      if (ev.idle_timeout_ms) parts.push(`idle timeout ${ms(ev.idle_timeout_ms)}`);
      return parts.join(", ");
    }
    case "tool_progress": {
      const what = progressText(ev);
      return `${what || "still running (no progress reported)"} · ${ms(ev.elapsed_ms)} in`;
    }
    case "tool_result": {
      const o = ev.outcome ?? {};
      const parts = [eventLabel(ev)];
      if (o.attempts != null) parts.push(`${o.attempts} attempt${o.attempts === 1 ? "" : "s"}`);
      if (o.provenance?.cache_hit) parts.push("from the cache");
      if (o.repeat_count) parts.push(`repeated ${o.repeat_count}×`);
      if (o.detail) parts.push(o.detail);
      // A quota's denial says when the same call may be allowed, counted from the denial.
      if (o.status === "denied" && o.retry_after_ms != null) parts.push(`retry after ${retryText(o.retry_after_ms)}`);
      return parts.join(" · ");
    }
    case "interaction_requested": {
      const i = ev.interaction ?? {};
      return [`${i.kind ?? "question"}: ${i.message ?? ""}`, i.timeout_ms ? `deadline ${ms(i.timeout_ms)}` : ""].filter(Boolean).join(" · ");
    }
    case "interaction_answered":
      return `${eventLabel(ev)}${ev.kind ? ` (${ev.kind})` : ""}`;
    case "tool_changed":
      return `${eventLabel(ev)}: ${shortDigest(ev.old_digest)} → ${shortDigest(ev.new_digest)}`;
    case "tool_accepted":
      return `${eventLabel(ev)}: ${shortDigest(ev.digest)}`;
    default:
      return eventLabel(ev);
  }
}

/** The payloads of an event, as the trail returns them (masked, maybe truncated): [[name, value]]. */
export function eventPayloads(ev) {
  const out = [];
  const add = (name, value) => {
    if (value !== undefined && value !== null) out.push([name, value]);
  };
  if (ev.type === "tool_start") add("input", ev.input);
  if (ev.type === "tool_result") {
    add("content", ev.content);
    add("structured content", ev.structured_content);
  }
  if (ev.type === "hook_decision" && ev.rewritten === true) {
    add("arguments before the hook", ev.original_args);
    add("arguments the hook gave", ev.args);
  }
  if (ev.type === "interaction_requested") {
    add("input", ev.interaction?.input);
    add("details", ev.interaction?.details);
  }
  return out;
}

/**
 * A payload as text, and a note when the trail truncated it (it then keeps
 * `{"truncated": true, "bytes": N, "head": "<the first bytes of its JSON>"}`).
 */
export function payloadText(value) {
  if (value && typeof value === "object" && value.truncated === true && typeof value.head === "string") {
    return { text: `${value.head}…`, note: `truncated by the audit trail: ${value.bytes ?? "?"} bytes, the first ${value.head.length} shown` };
  }
  return { text: JSON.stringify(value, null, 2) ?? String(value), note: null };
}

// --- a call's timeline ----------------------------------------------------------------------

/**
 * Where a call's events fall along its life, from its first event (or its start) to its last
 * (or `now`, while it runs): marks at 0–100 % of the track, the outcome's position, and the same
 * in words. Progress ticks are kept one per half percent, so a call with thousands of progress
 * events costs no more than the track can show; other marks closer than MIN_GAP are moved apart
 * so each stays visible.
 */
export function callTimeline(call, now = null) {
  const events = call.events ?? [];
  const times = events.map((ev) => Date.parse(ev.ts));
  const started = Date.parse(call.started_at);
  let t0 = Number.isFinite(started) ? started : Number.POSITIVE_INFINITY;
  let t1 = Number.NEGATIVE_INFINITY;
  for (const t of times) {
    if (!Number.isFinite(t)) continue;
    t0 = Math.min(t0, t);
    t1 = Math.max(t1, t);
  }
  if (!Number.isFinite(t0)) t0 = now ?? 0;
  if (!Number.isFinite(t1)) t1 = t0;
  const running = !call.status && !events.some((ev) => ev.type === "tool_result");
  if (running && now !== null) t1 = Math.max(t1, now);
  const span = t1 - t0;
  const pos = (t) => (span > 0 && Number.isFinite(t) ? Math.min(100, Math.max(0, ((t - t0) / span) * 100)) : 0);

  const marks = [];
  const words = [];
  let progress = 0;
  let run = 0; // progress events since the last other event, for the words
  let lastTick = null;
  events.forEach((ev, i) => {
    const kind = MARKS[ev.type];
    if (!kind) return;
    const x = pos(times[i]);
    if (kind === "progress") {
      progress += 1;
      run += 1;
      const tick = Math.round(x * 2) / 2;
      if (tick !== lastTick) {
        marks.push({ kind, x: tick, label: `${eventLabel(ev)} at +${ms(times[i] - t0)}`, seq: ev.seq });
        lastTick = tick;
      }
      return;
    }
    if (run > 0) words.push(`progress ×${run}`);
    run = 0;
    const mark = { kind, x, label: `${eventLabel(ev)}${kind === "start" ? "" : ` at +${ms(times[i] - t0)}`}`, seq: ev.seq };
    if (kind === "rule" || kind === "hook") mark.decision = decisionOf(ev);
    if (kind === "hook" && ev.failed === true) mark.failed = true;
    marks.push(mark);
    words.push(eventLabel(ev));
  });
  if (run > 0) words.push(`progress ×${run}`);
  if (running) words.push("running");
  spread(marks.filter((m) => m.kind !== "progress"));

  const result = marks.find((m) => m.kind === "result");
  const resultX = result ? result.x : running ? 100 : null;
  // After the outcome: the work still being stopped, or answering late.
  let afterX = null;
  for (const m of marks) if ((m.kind === "stop" || m.kind === "late") && resultX !== null && m.x > resultX) afterX = m.x;
  return { t0, t1, span, marks, resultX, afterX, running, progress, text: words.join(" → ") };
}

/** A rule_decision's or hook_decision's decision, for a class name: one of DECISIONS, else "unknown". */
export function decisionOf(ev) {
  return DECISIONS.includes(ev?.decision) ? ev.decision : "unknown";
}

/** Moves marks (ordered by time) apart to at least MIN_GAP, within 0–100. */
function spread(marks) {
  for (let i = 1; i < marks.length; i += 1) marks[i].x = Math.max(marks[i].x, marks[i - 1].x + MIN_GAP);
  const last = marks.length - 1;
  if (last >= 0 && marks[last].x > 100) {
    marks[last].x = 100;
    for (let i = last - 1; i >= 0; i -= 1) marks[i].x = Math.min(marks[i].x, marks[i + 1].x - MIN_GAP);
    for (const m of marks) m.x = Math.max(0, m.x);
  }
}

/** The outcome of a call as the trail has it: its tool_result's, else its bare status. */
export function callOutcome(call) {
  for (let i = (call.events?.length ?? 0) - 1; i >= 0; i -= 1) {
    if (call.events[i].type === "tool_result" && call.events[i].outcome) return call.events[i].outcome;
  }
  return call.status ? { status: call.status } : null;
}

// --- the section ----------------------------------------------------------------------------

/** A hook_decision as the list of a call's events shows it: its text, the decision (and a failure) styled. */
function hookDecisionEl(ev) {
  const parts = hookDecisionParts(ev);
  // After a failure's own words, the rest (a rewrite) as hookDecisionText says it.
  const tail = hookDecisionTail(parts.failed ? { ...parts, failed: false, reason: "" } : parts);
  return h(
    "span",
    { class: "hook-decision" },
    `${parts.hook}: `,
    h("span", { class: `chip decision decision-${decisionOf(ev)}`, text: parts.decision }),
    parts.took ? ` (${parts.took})` : "",
    parts.failed ? " — " : "",
    parts.failed ? h("span", { class: "chip out-error", text: "failed" }) : null,
    parts.failed ? `: ${parts.reason || "?"}` : "",
    tail ? `${parts.failed ? "; " : " — "}${tail}` : "",
  );
}

/** A quota_exceeded as the list of a call's events shows it: what ran out styled as a denial. */
function quotaExceededEl(ev) {
  const { quota, reason, bucket, retry } = quotaExceededParts(ev);
  return h(
    "span",
    { class: "quota-exceeded" },
    `${quota}: `,
    h("span", { class: "chip decision decision-deny", text: reason }),
    bucket ? ` for ${bucket}` : "",
    retry ? ` — retry in ${retry}` : "",
  );
}

/** How the list of a call's events shows an event's key fields. */
function eventWhatEl(ev) {
  switch (ev.type) {
    case "rule_decision":
      return ruleDecisionEl(ev);
    case "hook_decision":
      return hookDecisionEl(ev);
    case "quota_exceeded":
      return quotaExceededEl(ev);
    default:
      return h("span", { text: eventDetail(ev) });
  }
}

/** A rule_decision as the list of a call's events shows it: its text, the decision styled as one. */
function ruleDecisionEl(ev) {
  const { rules, decision, reason } = ruleDecisionParts(ev);
  return h(
    "span",
    { class: "rule-decision" },
    `${rules}: `,
    h("span", { class: `chip decision decision-${decisionOf(ev)}`, text: decision }),
    reason ? ` — ${reason}` : "",
  );
}

const callKey = (turnId, callId) => `${turnId}/${callId}`;

export class AuditHistory {
  /**
   * `serverNow()`: the server's clock now (for how long a running call has run); `toolNames()`:
   * the tools the page knows, offered in the tool field; `principalNames()`: the principals the
   * page has seen, offered in the principal field; `hasEnded(turnId, callId)`: whether the event
   * stream saw that call end.
   */
  constructor({ api, section, doc = document, win = window, serverNow = () => Date.now(), toolNames = () => [], principalNames = () => [], hasEnded = () => false }) {
    this.api = api;
    this.section = section;
    this.doc = doc;
    this.win = win;
    this.serverNow = serverNow;
    this.toolNames = toolNames;
    this.principalNames = principalNames;
    this.hasEnded = hasEnded;
    const $ = (id) => doc.getElementById(id);
    this.el = {
      heading: $("audit-heading"),
      form: $("audit-form"),
      clear: $("audit-clear"),
      tools: $("audit-tools"),
      principals: $("audit-principals"),
      principalLabel: $("audit-principal-label"),
      status: $("audit-status"),
      ended: $("audit-ended"),
      error: $("audit-error"),
      refresh: $("audit-refresh"),
      table: $("audit-table"),
      body: $("audit-body"),
      empty: $("audit-empty"),
      newer: $("audit-newer"),
      older: $("audit-older"),
    };
    this.search = { filters: {}, cursor: null };
    /** Cursors of the pages before this one (null: the newest), for Newer. */
    this.previous = [];
    /** The page's number, when known (a shared link may start anywhere). */
    this.page = 1;
    this.next = null;
    /** The page's calls as the API gave them. */
    this.calls = [];
    this.loads = 0;
    this.rows = new Map(); // callKey → {tr, call, button, detail}
    this.expanded = new Set();
    this.endedSince = new Set();
    this.ids = 0;
    this.toolsShown = "";
    this.principalsShown = "";
    /** Whether the page's principal may read others' calls (`read`); until /v1/me says, yes. */
    this.seesOthers = true;
    /** How long the last page took to draw, in ms (the browser tests report it). */
    this.lastRenderMs = null;
  }

  /** Probes the trail; shows the section and reads the first page only if the server has one. */
  async mount() {
    if (!this.section) return false;
    try {
      await this.api.get("/v1/audit?limit=1");
    } catch {
      // 503: this server keeps no audit trail. Anything else: try again on the next load.
      this.section.hidden = true;
      return false;
    }
    this.section.hidden = false;
    const skip = this.doc.getElementById("skip-audit");
    if (skip) skip.hidden = false;
    this.bind();
    const fromUrl = searchFromHash(this.win.location.hash);
    await this.show(fromUrl ?? { filters: {}, cursor: null });
    // Opened from a link to a search: that is what the person came to see.
    if (fromUrl) this.el.heading.scrollIntoView({ block: "start" });
    return true;
  }

  bind() {
    const { form, clear, refresh, older, newer, body } = this.el;
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.navigate({ filters: this.readForm(), cursor: null });
    });
    clear.addEventListener("click", () => {
      form.reset();
      this.navigate({ filters: {}, cursor: null });
    });
    refresh.addEventListener("click", () => this.load());
    older.addEventListener("click", () => {
      if (this.next) this.navigate({ filters: this.search.filters, cursor: this.next }, { focusTable: true });
    });
    newer.addEventListener("click", () => {
      this.navigate({ filters: this.search.filters, cursor: this.previous.at(-1) ?? null }, { focusTable: true });
    });
    this.win.addEventListener("hashchange", () => {
      const hash = this.win.location.hash;
      // Back to the page's own address is back to the newest calls; other fragments (the skip
      // links') are not the history's business.
      const search = hash === "" || hash === "#" ? { filters: {}, cursor: null } : searchFromHash(hash);
      if (search) this.show(search, this.pendingOptions ?? {});
      this.pendingOptions = null;
    });
    body.addEventListener("click", (event) => {
      const button = event.target instanceof Element ? event.target.closest("button.disclose") : null;
      if (button) this.toggle(button.closest("tr").dataset.key);
    });
    form.elements.tool.addEventListener("focus", () => this.offerTools());
    form.elements.principal.addEventListener("focus", () => this.offerPrincipals());
  }

  /**
   * Who the page is (`GET /v1/me`): a principal without `read` finds only its own calls, so the
   * principal field is hidden for it (unless a search already names one: the server's answer
   * then says why it refuses).
   */
  setSeesOthers(sees) {
    this.seesOthers = sees;
    this.showPrincipalField();
  }

  showPrincipalField() {
    const label = this.el.principalLabel;
    if (label) label.hidden = !this.seesOthers && !this.search.filters.principal;
  }

  readForm() {
    const filters = {};
    for (const name of FILTERS) {
      const value = this.el.form.elements[name].value.trim();
      if (value) filters[name] = value;
    }
    return filters;
  }

  fillForm(filters) {
    for (const name of FILTERS) this.el.form.elements[name].value = filters[name] ?? "";
    this.showPrincipalField();
  }

  offerTools() {
    const names = [...new Set(this.toolNames())].sort();
    const joined = names.join("\n");
    if (joined === this.toolsShown) return;
    this.toolsShown = joined;
    this.el.tools.replaceChildren(...names.map((name) => h("option", { value: name })));
  }

  offerPrincipals() {
    const names = [...new Set(this.principalNames())].sort();
    const joined = names.join("\n");
    if (joined === this.principalsShown || !this.el.principals) return;
    this.principalsShown = joined;
    this.el.principals.replaceChildren(...names.map((name) => h("option", { value: name })));
  }

  /** Goes to a search through the URL (so Back returns here); the hashchange shows it. */
  navigate(search, options = {}) {
    const hash = hashOf(search);
    if (this.win.location.hash === hash) {
      this.show(search, options);
    } else {
      this.pendingOptions = options;
      this.win.location.hash = hash;
    }
  }

  /** Shows a search: keeps track of the pages before it, fills the form, reads the page. */
  show(search, options = {}) {
    const before = this.search;
    if (search.cursor === null || !sameFilters(search.filters, before.filters)) {
      this.previous = [];
      this.page = search.cursor === null ? 1 : null;
      if (search.cursor !== null) this.previous = [null];
    } else if (search.cursor !== before.cursor) {
      const i = this.previous.indexOf(search.cursor);
      if (i >= 0) {
        this.previous = this.previous.slice(0, i);
        this.page = this.page === null ? null : i + 1;
      } else if (search.cursor === this.next) {
        this.previous.push(before.cursor);
        this.page = this.page === null ? null : this.page + 1;
      } else {
        // A cursor from elsewhere (a link): Newer goes back to the newest page.
        this.previous = [null];
        this.page = null;
      }
    }
    this.search = { filters: { ...search.filters }, cursor: search.cursor };
    this.fillForm(this.search.filters);
    return this.load(options);
  }

  /** Reads the current search's page (again: Refresh). */
  async load(options = {}) {
    const seq = ++this.loads;
    const { status, error, table } = this.el;
    status.textContent = "Searching…";
    table.setAttribute("aria-busy", "true");
    let data;
    try {
      data = await this.api.get(callsPath(this.search));
    } catch (e) {
      if (seq !== this.loads) return;
      table.removeAttribute("aria-busy");
      status.textContent = "";
      error.textContent = `The audit trail could not be read: ${e.message}`;
      error.hidden = false;
      return;
    }
    if (seq !== this.loads) return; // a newer search went out meanwhile
    error.hidden = true;
    table.removeAttribute("aria-busy");
    this.next = data?.next ?? null;
    this.calls = data?.calls ?? [];
    this.render(this.calls, options);
  }

  render(calls, { focusTable = false } = {}) {
    const started = performance.now();
    const { body, table, status, empty, older, newer } = this.el;
    const active = this.doc.activeElement;
    const focusedKey = active && body.contains(active) ? (active.closest("tr[data-key]")?.dataset.key ?? null) : null;
    const now = this.serverNow();
    this.rows.clear();
    this.endedSince.clear();
    const fragment = this.doc.createDocumentFragment();
    for (const call of calls) {
      const rec = this.makeRow(call, now);
      if (this.rows.has(rec.key)) continue;
      this.rows.set(rec.key, rec);
      fragment.append(rec.tr);
      if (this.expanded.has(rec.key)) {
        rec.detail = this.makeDetail(rec);
        fragment.append(rec.detail);
        rec.button.setAttribute("aria-expanded", "true");
        rec.button.setAttribute("aria-controls", rec.detail.id);
      }
      if (!call.status && this.hasEnded(call.turn_id, call.call_id)) this.markEnded(rec);
    }
    body.replaceChildren(fragment);
    for (const key of [...this.expanded]) if (!this.rows.has(key)) this.expanded.delete(key);
    this.updateEnded();

    empty.hidden = calls.length > 0;
    older.hidden = !this.next;
    newer.hidden = this.search.cursor === null;
    const n = calls.length;
    const what = describeFilters(this.search.filters);
    const where = this.search.cursor === null ? "" : this.page ? `, page ${this.page}` : ", an older page";
    status.textContent =
      n === 0
        ? `No call${what ? ` with ${what}` : ""}${this.search.cursor ? " on this page" : " in the audit trail"}.`
        : `${n} call${n === 1 ? "" : "s"}${what ? ` with ${what}` : ""}, newest first${where}.`;

    // The focus stays where it was when that is still on the page, else goes to the table.
    const again = focusedKey ? this.rows.get(focusedKey)?.button : null;
    const lost = active && active !== this.doc.body && !this.doc.contains(active);
    const hiddenButton = (active === older && older.hidden) || (active === newer && newer.hidden);
    if (again) {
      again.focus();
    } else if (focusTable || lost || hiddenButton) {
      table.focus({ preventScroll: true });
      // A new page is read from its top.
      if (focusTable) this.el.heading.scrollIntoView({ block: "start" });
      else table.scrollIntoView({ block: "nearest" });
    }
    this.lastRenderMs = performance.now() - started;
  }

  makeRow(call, now) {
    const key = callKey(call.turn_id, call.call_id);
    const outcome = callOutcome(call);
    const status = outcome?.status ?? "running";
    const tl = callTimeline(call, status === "running" ? now : null);
    const tool = call.tool ?? "";
    const button = h(
      "button",
      { type: "button", class: "disclose", "aria-expanded": "false", "aria-label": `Events of call ${call.call_id}${tool ? ` (${tool})` : ""}` },
      h("span", { "aria-hidden": "true", text: "▸" }),
    );
    const outcomeCell =
      status === "running"
        ? h("td", { class: "outcome" }, h("span", { class: "chip state-running", text: "running" }), h("span", { class: "since" }))
        : h(
            "td",
            { class: "outcome", title: [status === "ok" ? "" : outcomeTag(status), outcomeText(outcome), outcome.detail].filter(Boolean).join(" ") },
            status === "ok" ? null : h("span", { class: "tag", text: outcomeTag(status) }),
            status === "ok" ? null : " ",
            h("span", { class: `chip out-${status}`, text: outcomeText(outcome) }),
            // A denial says why (a rule's reason, a person's): the rest of it is in the title.
            denialDetail(outcome) ? h("span", { class: "why", text: ` ${denialDetail(outcome)}` }) : null,
          );
    const took =
      call.duration_ms != null ? formatDuration(call.duration_ms) : status === "running" ? `${formatDuration(tl.t1 - tl.t0)} so far` : "";
    const startedAt = Date.parse(call.started_at);
    const tr = h(
      "tr",
      { "data-key": key, "data-status": status },
      h("td", { class: "c-disclose" }, button),
      h("td", { class: "when" }, h("time", { datetime: call.started_at, title: preciseTime(startedAt), text: dateTime(startedAt) })),
      h("td", { class: "principal", title: call.principal ?? "", text: call.principal ?? "—" }),
      h("td", { class: "session" }, h("span", { title: call.session_id ?? "", text: call.session_id ? shortId(call.session_id, 10) : "—" })),
      h(
        "td",
        { class: "call", title: `call ${call.call_id} of turn ${call.turn_id}` },
        h("span", { class: "tool", text: tool }),
        " ",
        h("code", { class: "ids", text: call.call_id }),
      ),
      outcomeCell,
      h("td", { class: "num duration", text: took }),
      h("td", { class: "tl" }, this.makeTrack(tl, status)),
    );
    return { key, tr, call, button, detail: null, status, outcomeCell, t0: tl.t0 };
  }

  makeTrack(tl, status) {
    const track = h("div", { class: "track", role: "img", "aria-label": `Timeline: ${tl.text}`, title: tl.text });
    if (tl.resultX !== null) {
      const bar = h("span", { class: `bar bar-${status}` });
      bar.style.width = `${tl.resultX}%`;
      track.append(bar);
    }
    if (tl.afterX !== null) {
      const after = h("span", { class: "after" });
      after.style.left = `${tl.resultX}%`;
      after.style.width = `${tl.afterX - tl.resultX}%`;
      track.append(after);
    }
    for (const m of tl.marks) {
      const modifier =
        m.kind === "result"
          ? ` mk-${status}`
          : m.kind === "rule"
            ? ` mk-rule-${m.decision}`
            : m.kind === "hook"
              ? ` mk-hook-${m.decision}${m.failed ? " mk-hook-failed" : ""}`
              : "";
      const mark = h("span", { class: `mk mk-${m.kind}${modifier}`, title: m.label });
      mark.style.left = `${m.x}%`;
      track.append(mark);
    }
    return track;
  }

  toggle(key) {
    const rec = this.rows.get(key);
    if (!rec) return;
    if (rec.detail) {
      rec.detail.remove();
      rec.detail = null;
      this.expanded.delete(key);
      rec.button.setAttribute("aria-expanded", "false");
      rec.button.removeAttribute("aria-controls");
    } else {
      rec.detail = this.makeDetail(rec);
      rec.tr.after(rec.detail);
      this.expanded.add(key);
      rec.button.setAttribute("aria-expanded", "true");
      rec.button.setAttribute("aria-controls", rec.detail.id);
    }
  }

  /** The row under a call that lists its events; made when it is first opened. */
  makeDetail(rec) {
    const { call } = rec;
    const id = `audit-events-${(this.ids += 1)}`;
    const link = (text, filters) => h("a", { href: hashOf({ filters, cursor: null }), text });
    const outcome = callOutcome(call);
    const meta = h(
      "p",
      { class: "meta" },
      "Call ",
      h("code", { text: call.call_id }),
      " of turn ",
      h("code", { text: call.turn_id }),
      call.principal ? " by " : "",
      call.principal ? h("code", { text: call.principal }) : "",
      call.session_id ? ", session " : "",
      call.session_id ? h("code", { text: call.session_id }) : "",
      call.attempts != null ? ` · ${call.attempts} attempt${call.attempts === 1 ? "" : "s"}` : "",
      outcome?.detail ? ` · ${outcome.detail}` : "",
      " · ",
      link("only this call", { turn: call.turn_id, call: call.call_id }),
      " · ",
      link("this turn's calls", { turn: call.turn_id }),
      call.session_id ? " · " : "",
      // A session id is its principal's own: the link names both.
      call.session_id ? link("this session's calls", call.principal ? { principal: call.principal, session: call.session_id } : { session: call.session_id }) : "",
      call.principal ? " · " : "",
      call.principal ? link(`${call.principal}'s calls`, { principal: call.principal }) : "",
    );
    const rows = (call.events ?? []).map((ev) => {
      const t = Date.parse(ev.ts);
      const what = h("td", { class: "what" }, eventWhatEl(ev));
      for (const [name, value] of eventPayloads(ev)) {
        const { text, note } = payloadText(value);
        what.append(
          h(
            "div",
            { class: "payload" },
            h("span", { class: "payload-name", text: `${name}${note ? ` (${note})` : ""}` }),
            h("pre", { tabindex: "0", "aria-label": `${name} of call ${call.call_id}, event ${ev.seq}`, text }),
          ),
        );
      }
      return h(
        "tr",
        { "data-seq": ev.seq, "data-type": ev.type },
        h("td", { class: "num", text: String(ev.seq ?? "") }),
        h("td", { class: "when", text: preciseTime(t) }),
        h("td", { class: "num", text: Number.isFinite(t) ? `+${formatDuration(t - rec.t0)}` : "" }),
        h("td", {}, h("code", { text: ev.type })),
        what,
      );
    });
    return h(
      "tr",
      { class: "events-row", id, "data-key": rec.key },
      h(
        "td",
        { colspan: "8" },
        meta,
        h(
          "table",
          { class: "events" },
          h("caption", { class: "visually-hidden", text: `Events of call ${call.call_id}${call.tool ? ` (${call.tool})` : ""}` }),
          h(
            "thead",
            {},
            h(
              "tr",
              {},
              h("th", { scope: "col", class: "num", text: "Seq" }),
              h("th", { scope: "col", text: "Time" }),
              h("th", { scope: "col", class: "num", text: "Since start" }),
              h("th", { scope: "col", text: "Event" }),
              h("th", { scope: "col", text: "What" }),
            ),
          ),
          h("tbody", {}, ...rows),
        ),
      ),
    );
  }

  /** The event stream saw a call end: if the history shows it running, say so. */
  noteEnded(turnId, callId) {
    const rec = this.rows.get(callKey(turnId, callId));
    if (!rec || rec.status !== "running" || this.endedSince.has(rec.key)) return;
    this.markEnded(rec);
    this.updateEnded();
  }

  markEnded(rec) {
    this.endedSince.add(rec.key);
    rec.tr.classList.add("ended-since");
    const since = rec.outcomeCell.querySelector(".since");
    if (since) since.textContent = " ended since";
  }

  updateEnded() {
    const n = this.endedSince.size;
    const { ended } = this.el;
    const text = n === 0 ? "" : `${n === 1 ? "A call" : `${n} calls`} shown as running ${n === 1 ? "has" : "have"} ended since: Refresh to see how.`;
    if (ended.textContent !== text) ended.textContent = text;
    ended.hidden = n === 0;
  }
}
