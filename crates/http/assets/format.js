// Pure formatting: how times, outcomes and states read on the page. No DOM, so the tests run it
// in Node as well as in the browser.

/** The colour band of a running call's elapsed time: green under 10 s, yellow to 30 s, red beyond. */
export function elapsedBand(ms) {
  if (ms < 10_000) return "green";
  if (ms <= 30_000) return "yellow";
  return "red";
}

/**
 * An elapsed time for a clock that ticks: tenths under 10 s ("3.4 s"), whole seconds under a
 * minute ("12 s"), then minutes and seconds ("2 m 05 s") and hours ("1 h 02 m").
 */
export function formatElapsed(ms) {
  if (!Number.isFinite(ms) || ms < 0) ms = 0;
  if (ms < 10_000) return `${(Math.floor(ms / 100) / 10).toFixed(1)} s`;
  const s = Math.floor(ms / 1000);
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} m ${String(s % 60).padStart(2, "0")} s`;
  return `${Math.floor(m / 60)} h ${String(m % 60).padStart(2, "0")} m`;
}

/** How often (ms) the text of formatElapsed(ms) changes at this elapsed time. */
export function elapsedResolution(ms) {
  return ms < 10_000 ? 100 : 1000;
}

/** A countdown to a deadline: "1 m 20 s left", "9 s left", "due". */
export function formatCountdown(ms) {
  if (ms <= 0) return "due";
  const s = Math.ceil(ms / 1000);
  if (s < 60) return `${s} s left`;
  return `${Math.floor(s / 60)} m ${String(s % 60).padStart(2, "0")} s left`;
}

/** A duration already over: "12 ms", "1.4 s", "2 m 05 s". */
export function formatDuration(ms) {
  if (!Number.isFinite(ms)) return "";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(1)} s`;
  return formatElapsed(ms);
}

/** The tag a model reads at the start of a result's text, by status. */
const TAGS = {
  ok: "OK",
  error: "[ERROR]",
  timeout: "[TIMEOUT]",
  cancelled: "[CANCELLED]",
  denied: "[DENIED]",
  circuit_open: "[CIRCUIT OPEN]",
  invalid: "[INVALID]",
  interrupted: "[INTERRUPTED]",
};

export function outcomeTag(status) {
  return TAGS[status] ?? `[${String(status).toUpperCase()}]`;
}

/**
 * An outcome as one short word with its detail, the way the docs write them:
 * `cancelled{user}`, `timeout{idle}`, `denied{user}`, `error{transport}`, `ok`.
 */
export function outcomeText(outcome) {
  if (!outcome) return "";
  const s = outcome.status;
  const detail = {
    error: outcome.reason,
    timeout: outcome.kind,
    cancelled: outcome.reason,
    denied: outcome.reason,
    invalid: outcome.reason,
    circuit_open: outcome.retry_after_ms != null ? `retry in ${formatDuration(outcome.retry_after_ms)}` : null,
  }[s];
  return detail ? `${s}{${detail}}` : String(s);
}

/** The decisions a rule (or a hook) can give (docs/RULES.md), each styled as `decision-<name>`. */
export const DECISIONS = ["allow", "ask", "confirm", "deny"];

/**
 * A `rule_decision` event in parts: the rules that matched, named by their place in the file
 * ("rules[0], rules[2]"), the decision the call got, and the deciding rule's reason (or "").
 */
export function ruleDecisionParts(ev) {
  const indexes = Array.isArray(ev?.rules) ? ev.rules : [];
  return {
    rules: indexes.length > 0 ? indexes.map((i) => `rules[${i}]`).join(", ") : "rules",
    decision: String(ev?.decision ?? "?"),
    reason: typeof ev?.reason === "string" ? ev.reason : "",
  };
}

/** A `rule_decision` event in words: "rules[0], rules[2]: allow — a read-only command". */
export function ruleDecisionText(ev) {
  const { rules, decision, reason } = ruleDecisionParts(ev);
  return `${rules}: ${decision}${reason ? ` — ${reason}` : ""}`;
}

/** How long until a call may be tried again: "800 ms", "12 s", "1 m 00 s", "2 h 05 m" (rounded up). */
export function retryText(ms) {
  const n = Number(ms);
  if (!Number.isFinite(n) || n < 0) return "?";
  if (n < 1000) return `${Math.ceil(n)} ms`;
  const s = Math.ceil(n / 1000);
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} m ${String(s % 60).padStart(2, "0")} s`;
  return `${Math.floor(m / 60)} h ${String(m % 60).padStart(2, "0")} m`;
}

/**
 * Arguments as one short line of compact JSON: `{"text":"rewrite me"}`, cut to `max` characters
 * with "…". Arguments the audit trail truncated (`{"truncated": true, "head": …}`) show their head.
 */
export function compactJson(value, max = 120) {
  let text;
  if (value && typeof value === "object" && value.truncated === true && typeof value.head === "string") text = `${value.head}…`;
  else {
    try {
      text = JSON.stringify(value) ?? String(value);
    } catch {
      text = String(value);
    }
  }
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

/**
 * A `hook_decision` event in parts: the hook's name, its decision, how long it took, its reason
 * (or, when it failed, what went wrong), whether it failed, and — when it rewrote the call's
 * arguments — the arguments before and after as compact JSON (else null).
 */
export function hookDecisionParts(ev) {
  const rewritten = ev?.rewritten === true;
  return {
    hook: `hook ${ev?.hook ?? "?"}`,
    decision: String(ev?.decision ?? "?"),
    took: ev?.duration_ms != null ? formatDuration(Number(ev.duration_ms)) : "",
    reason: typeof ev?.reason === "string" ? ev.reason : "",
    failed: ev?.failed === true,
    rewrite: rewritten ? { from: compactJson(ev.original_args), to: compactJson(ev.args) } : null,
  };
}

/** What follows a hook's decision: "not on a Friday", "failed: timed out", "arguments rewritten: {…} → {…}". */
export function hookDecisionTail(parts) {
  const tail = [];
  if (parts.failed) tail.push(`failed: ${parts.reason || "?"}`);
  else if (parts.reason) tail.push(parts.reason);
  if (parts.rewrite) tail.push(`arguments rewritten: ${parts.rewrite.from} → ${parts.rewrite.to}`);
  return tail.join("; ");
}

/** A `hook_decision` event in words: "hook review: deny (12 ms) — not on a Friday". */
export function hookDecisionText(ev) {
  const parts = hookDecisionParts(ev);
  const tail = hookDecisionTail(parts);
  return `${parts.hook}: ${parts.decision}${parts.took ? ` (${parts.took})` : ""}${tail ? ` — ${tail}` : ""}`;
}

/**
 * A `quota_exceeded` event in parts: the quota by its place in the file ("quota 0"), what ran
 * out (`rate_limit`, `concurrency`), whose bucket, and when to try again.
 */
export function quotaExceededParts(ev) {
  return {
    quota: `quota ${ev?.quota ?? "?"}`,
    reason: String(ev?.reason ?? "?"),
    bucket: ev?.bucket != null ? String(ev.bucket) : "",
    retry: ev?.retry_after_ms != null ? retryText(ev.retry_after_ms) : "",
  };
}

/** A `quota_exceeded` event in words: "quota 0: rate_limit for alice — retry in 12 s". */
export function quotaExceededText(ev) {
  const { quota, reason, bucket, retry } = quotaExceededParts(ev);
  return `${quota}: ${reason}${bucket ? ` for ${bucket}` : ""}${retry ? ` — retry in ${retry}` : ""}`;
}

/**
 * What a denied outcome's `detail` adds to a line that already says `text`: the detail (a
 * rule's reason and index, a person's reason), or "" when there is none or the line has it.
 */
export function denialDetail(outcome, text = "") {
  if (outcome?.status !== "denied" || !outcome.detail) return "";
  return String(text).includes(outcome.detail) ? "" : String(outcome.detail);
}

/** Whether a call that ended this way had work that must still be stopped behind its outcome. */
export function outcomeStopsWork(outcome) {
  if (!outcome) return false;
  if (outcome.status === "timeout") return true;
  return outcome.status === "cancelled" && outcome.reason !== "not_started";
}

/** The words a person reads for a call's state. */
const STATES = {
  queued: "queued",
  awaiting_approval: "waiting for approval",
  approved: "approved",
  waiting: "waiting",
  running: "running",
  backoff: "retrying",
  retrying: "retrying",
  stopping: "stopping",
  abandoned: "abandoned",
  done: "done",
};

/**
 * How a call's work stopped, from its `tool_stopped` event: "stopped cooperative after 15 ms",
 * or — when nothing showed the work stop (an MCP server that honours a cancel goes quiet) —
 * "stopped cooperative (found quiet when the 2 s grace ran out)": `after_ms` is then the grace.
 */
export function stopText(ev) {
  const after = formatDuration(Number(ev.after_ms) || 0);
  return ev.found_quiet
    ? `stopped ${ev.how ?? "?"} (found quiet when the ${after} grace ran out)`
    : `stopped ${ev.how ?? "?"} after ${after}`;
}

export function stateText(state, attempt) {
  const words = STATES[state] ?? String(state);
  if ((state === "retrying" || state === "backoff") && attempt > 1) return `${words} (attempt ${attempt})`;
  if (state === "running" && attempt > 1) return `running (attempt ${attempt})`;
  return words;
}

/** The first line of a result's text, cut to `max` characters. */
export function firstLine(content, max = 160) {
  let text = "";
  if (typeof content === "string") text = content;
  else if (Array.isArray(content)) {
    const block = content.find((b) => b && b.type === "text" && typeof b.text === "string");
    text = block ? block.text : "";
  }
  const line = text.split("\n", 1)[0];
  return line.length > max ? `${line.slice(0, max - 1)}…` : line;
}

/** Progress as a person reads it: "3 / 10", "42 %", or the bare number. */
export function progressText(p) {
  if (!p) return "";
  const parts = [];
  if (p.progress != null && p.total != null && p.total > 0) {
    parts.push(`${trimNumber(p.progress)} / ${trimNumber(p.total)}`);
  } else if (p.progress != null) {
    parts.push(trimNumber(p.progress));
  }
  if (p.message) parts.push(p.message);
  return parts.join(" · ");
}

function trimNumber(n) {
  return Number.isInteger(n) ? String(n) : n.toFixed(1);
}

/** A wall-clock time of day, HH:MM:SS, in the browser's zone. */
export function clockTime(epochMs) {
  if (!Number.isFinite(epochMs)) return "";
  const d = new Date(epochMs);
  return [d.getHours(), d.getMinutes(), d.getSeconds()].map((n) => String(n).padStart(2, "0")).join(":");
}

/** A wall-clock time to the millisecond, HH:MM:SS.mmm, in the browser's zone. */
export function preciseTime(epochMs) {
  if (!Number.isFinite(epochMs)) return "";
  return `${clockTime(epochMs)}.${String(new Date(epochMs).getMilliseconds()).padStart(3, "0")}`;
}

/**
 * When something happened, for a list that reaches back days: the time of day for today
 * ("14:03:07"), with the date before it otherwise ("2026-11-22 14:03:07").
 */
export function dateTime(epochMs, nowMs = Date.now()) {
  if (!Number.isFinite(epochMs)) return "";
  const d = new Date(epochMs);
  const day = (x) => `${x.getFullYear()}-${String(x.getMonth() + 1).padStart(2, "0")}-${String(x.getDate()).padStart(2, "0")}`;
  const time = clockTime(epochMs);
  return day(d) === day(new Date(nowMs)) ? time : `${day(d)} ${time}`;
}

/** A long id shortened for a column, keeping its end (ULIDs differ at the end within a run). */
export function shortId(id, keep = 8) {
  const s = String(id ?? "");
  // Only generated ids (a prefix and a ULID) are long enough to need it; names people chose stay whole.
  if (s.length <= Math.max(keep + 3, 20)) return s;
  const prefix = s.match(/^[a-z]+_/)?.[0] ?? "";
  return `${prefix}…${s.slice(-keep)}`;
}

/**
 * Who the page is, for the header, from `GET /v1/me` ({principal, scopes}): "Signed in as alice"
 * with the scopes in its tooltip; `local` — every request over loopback when the server asks for
 * no token — reads "Local access (no token)". Null when the page does not know (yet).
 */
export function whoText(me) {
  if (!me || typeof me.principal !== "string") return null;
  const scopes = Array.isArray(me.scopes) && me.scopes.length > 0 ? me.scopes.join(", ") : "none";
  if (me.principal === "local") {
    return { text: "Local access (no token)", title: `Principal local (loopback, no token configured). Scopes: ${scopes}` };
  }
  return { text: `Signed in as ${me.principal}`, title: `Principal ${me.principal}. Scopes: ${scopes}` };
}

// --- tool pins ------------------------------------------------------------------------------

/** A digest shortened for a line: `sha256:` and its first 12 hex digits. */
export function shortDigest(digest) {
  const s = String(digest ?? "");
  const m = /^([a-z0-9]+:)([0-9a-f]+)$/i.exec(s);
  return m && m[2].length > 12 ? `${m[1]}${m[2].slice(0, 12)}…` : s;
}

/** A `tool_changed` event in words: "tool test__echo changed on server test (block)". */
export function toolChangedText(ev) {
  return `tool ${ev?.tool ?? "?"} changed on server ${ev?.server ?? "?"} (${ev?.action ?? "?"})`;
}

/**
 * A `tool_accepted` event in words: "tool test__echo accepted by alice" when a person accepted
 * it; "tool test__echo pinned on server test" when nobody did (the tool was first listed, or
 * `on_tool_change = "accept"` took the change).
 */
export function toolAcceptedText(ev) {
  const tool = ev?.tool ?? "?";
  return typeof ev?.by === "string" && ev.by !== "" ? `tool ${tool} accepted by ${ev.by}` : `tool ${tool} pinned on server ${ev?.server ?? "?"}`;
}

/**
 * A unified diff's lines, each with what it is, for colouring: `head` (the `--- pinned` and
 * `+++ listed` lines before the first hunk), `meta` (other lines before it, such as the
 * `server: "a" → "b"` line of a tool that moved), `hunk` (`@@ … @@`), `del` (`-`), `add` (`+`)
 * and `context` (the rest). Only the text is kept; the page puts it on as text.
 */
export function diffLines(diff) {
  const text = String(diff ?? "").replace(/\n$/, "");
  if (text === "") return [];
  let inHunks = false;
  return text.split("\n").map((line) => {
    if (line.startsWith("@@")) {
      inHunks = true;
      return { kind: "hunk", text: line };
    }
    if (!inHunks) return { kind: line.startsWith("--- ") || line.startsWith("+++ ") ? "head" : "meta", text: line };
    const first = line[0];
    return { kind: first === "-" ? "del" : first === "+" ? "add" : "context", text: line };
  });
}

// --- replicas -------------------------------------------------------------------------------

/**
 * How long ago something happened, for a line read again every few seconds: "just now" under a
 * second, then "4 s ago", "2 m 05 s ago", "1 h 02 m ago", "3 d ago".
 */
export function agoText(ms) {
  if (!Number.isFinite(ms)) return "";
  if (ms < 1000) return "just now";
  const s = Math.floor(ms / 1000);
  if (s < 60) return `${s} s ago`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} m ${String(s % 60).padStart(2, "0")} s ago`;
  const hours = Math.floor(m / 60);
  if (hours < 48) return `${hours} h ${String(m % 60).padStart(2, "0")} m ago`;
  return `${Math.floor(hours / 24)} d ago`;
}

/** A replica's lease, as `[store] lease` would write it: "1 s", "5 s", "1.5 s", "500 ms", "2 m".
 * A duration's text, but for whole seconds and minutes without their decimals. */
export function leaseText(ms) {
  const n = Number(ms);
  if (!Number.isFinite(n) || n < 0) return "";
  if (n >= 1000 && n < 60_000) return `${Number((n / 1000).toFixed(1))} s`;
  if (n >= 60_000 && n % 60_000 === 0) return `${n / 60_000} m`;
  return formatDuration(n);
}

/** What each state of a replica means (its badge's tooltip). */
const REPLICA_STATES = {
  live: "It renews its lease.",
  late: "Its lease ran out: it is about to be declared dead, unless it renews in time.",
  dead: "Declared dead: its lease ran out, and a surviving replica records the calls it left open as interrupted.",
  stopped: "It stopped cleanly.",
};

/** The tooltip of a replica's state badge. */
export function replicaStateTitle(state) {
  return REPLICA_STATES[state] ?? `State ${state}.`;
}

/**
 * What became of a dead replica, from `GET /v1/replicas`: "taken over by a, 2 calls
 * interrupted" once its survivor recorded what it left open; "being taken over by a" while the
 * survivor is at it (`interrupted` comes with the end); "not taken over yet" before a survivor
 * claimed it. "" for a replica that is not dead.
 */
export function takeoverText(r) {
  if (r?.state !== "dead") return "";
  if (typeof r.taken_over_by !== "string" || r.taken_over_by === "") return "not taken over yet";
  if (r.interrupted == null) return `being taken over by ${r.taken_over_by}`;
  const n = Number(r.interrupted);
  return `taken over by ${r.taken_over_by}, ${n} call${n === 1 ? "" : "s"} interrupted`;
}
