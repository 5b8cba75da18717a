// What the page knows, built from the event stream and the API's snapshots. No DOM: the view
// reads this model and the `dirty` sets it leaves, once per animation frame, so a burst of events
// costs one render, not one per event. The tests run it in Node.

import {
  hookDecisionText,
  outcomeStopsWork,
  quotaExceededText,
  ruleDecisionText,
  stopText,
  toolAcceptedText,
  toolChangedText,
} from "./format.js";

/** The key of a call (call ids are unique within their turn only); turn ids hold no "/". */
export function callKey(turnId, callId) {
  return `${turnId}/${callId}`;
}

/** Whether `me` (what `GET /v1/me` answered: {principal, scopes}) holds `scope`; `admin` holds every one. */
export function hasScope(me, scope) {
  const scopes = Array.isArray(me?.scopes) ? me.scopes : [];
  return scopes.includes(scope) || scopes.includes("admin");
}

/**
 * Whether `me` may cancel the work of principal `owner`: its own always, anyone's with `abort`.
 * While the page does not know who it is (`me` null: /v1/me not answered yet, or a server
 * without it), or whose the work is, it offers the button and the server decides.
 */
export function mayCancel(me, owner) {
  if (!me || !owner) return true;
  return owner === me.principal || hasScope(me, "abort");
}

/** Whether `me` may see other principals' work (`read`): only then is there anything to filter by principal. */
export function seesOthers(me) {
  return !me || hasScope(me, "read");
}

/** Whether a principal filter (null or "": everyone) lets `owner`'s work through. */
export function passesFilter(filter, owner) {
  return !filter || owner === filter;
}

/** How many tool_changed / tool_accepted events the page keeps for its list of definition changes. */
const PIN_LOG_LIMIT = 50;

/** How long a call may stay "stopping" without its `tool_stopped` before the page gives up on it. */
const STOP_UNCONFIRMED_MS = 120_000;
/** How many ended turn ids are remembered, so that an older snapshot cannot bring one back. */
const ENDED_MEMORY = 5000;

export class Model {
  constructor({ now = () => Date.now(), recentLimit = 100 } = {}) {
    this.now = now;
    this.recentLimit = recentLimit;
    /** turn_id → turn; a turn is here from its turn_start until its turn_end. */
    this.turns = new Map();
    /** callKey → call, for calls of running turns and calls still being stopped. */
    this.calls = new Map();
    /** callKey → call whose work is being stopped (or was abandoned) behind its outcome. */
    this.stopping = new Map();
    /** Ended calls, newest last (at most recentLimit). */
    this.recent = [];
    this.recentByKey = new Map();
    /** interaction id → interaction, pending ones. */
    this.interactions = new Map();
    /** server name → {state, detail}. */
    this.servers = new Map();
    /**
     * tool name → {backend, breaker, state, changed} from /v1/tools and breaker_state events;
     * `changed` is the change its server made to its pinned definition, waiting to be accepted
     * ({server, old_digest, new_digest, diff, blocked}), else null.
     */
    this.tools = new Map();
    /**
     * What happened to tools' pinned definitions, oldest first (at most PIN_LOG_LIMIT): every
     * tool_changed, and every tool_accepted that a person gave or that followed a change (a tool
     * pinned when first listed is not worth a line).
     */
    this.pinLog = [];
    /** Tools whose Accept is on its way to the server. */
    this.toolsAccepting = new Set();
    /** What went wrong with the last Accept ({tool, message}), until the next one; null: nothing. */
    this.acceptError = null;
    this.ended = new Set();
    this.endedOrder = [];
    this.answered = new Set();
    this.answeredOrder = [];
    /** The highest event seq applied. */
    this.lastSeq = 0;
    /**
     * Local clock minus the server's (+Infinity until estimated). Every time the model keeps is
     * the server's own (an event's `ts`): what happened is shown at the time it happened, whatever
     * this browser's clock says. The offset only turns this browser's "now" into the server's, for
     * what ticks: elapsed times and countdowns.
     */
    this.offset = Number.POSITIVE_INFINITY;
    /** Who this page is, as `GET /v1/me` answered ({principal, scopes}); null until it did. */
    this.me = null;
    /** The principal whose work the live view shows (null: everyone's). */
    this.principalFilter = null;
    /**
     * The replicas sharing the server's audit trail, as `GET /v1/replicas` answered: `shown`
     * only while it answers `"shared": true` to a principal with `read` (a single process, or a
     * principal without `read`, sees no panel); `list` its records; `error` what went wrong
     * with the last read (null: nothing).
     */
    this.replicas = { shown: false, list: [], error: null };
    /** Every principal whose work the page has seen (and its own). */
    this.principalsSeen = new Set();
    this.dirty = newDirty();
  }

  // --- principals ---------------------------------------------------------------------------

  /** Learns who the page is (`GET /v1/me`): which Cancel buttons it offers depends on it. */
  setMe(me) {
    const next = me && typeof me.principal === "string" ? { principal: me.principal, scopes: Array.isArray(me.scopes) ? [...me.scopes] : [] } : null;
    const same = (this.me === null && next === null) || (this.me && next && this.me.principal === next.principal && this.me.scopes.join() === next.scopes.join());
    if (same) return;
    this.me = next;
    if (next) this.notePrincipal(next.principal);
    this.dirty.me = true;
    this.touchAll();
  }

  /** Whether the page may cancel this turn's or call's work (see mayCancel). */
  mayCancel(owner) {
    return mayCancel(this.me, owner);
  }

  /** Shows only `principal`'s work in the live view (null or "": everyone's). */
  setPrincipalFilter(principal) {
    const next = principal || null;
    if (next === this.principalFilter) return;
    this.principalFilter = next;
    this.dirty.filter = true;
    this.dirty.stopping = true;
    this.dirty.summary = true;
  }

  /** Whether the live view's filter shows `owner`'s work. */
  shows(owner) {
    return passesFilter(this.principalFilter, owner);
  }

  /** The principals seen so far, sorted (for the filter's choices). */
  principals() {
    return [...this.principalsSeen].sort((a, b) => a.localeCompare(b));
  }

  notePrincipal(name) {
    if (typeof name !== "string" || name === "" || this.principalsSeen.has(name)) return;
    this.principalsSeen.add(name);
    this.dirty.principals = true;
  }

  /** Every running call and turn is drawn again (who may cancel what changed). */
  touchAll() {
    for (const call of this.calls.values()) this.touch(call);
    for (const turnId of this.turns.keys()) this.dirty.turns.add(turnId);
  }

  // --- clocks -------------------------------------------------------------------------------

  /**
   * Learns the clock offset from a server time `at` (epoch ms) that was already past when it
   * arrived now: an event's `ts`, or an HTTP `Date` header (whole seconds, so never ahead of the
   * server's clock). Each gives an upper bound of the offset (plus the delivery time); the
   * smallest is the estimate. A replayed (old) event gives a loose bound, which a live event or
   * any answer of the server soon tightens; it never moves a time already shown.
   */
  observeClock(at) {
    const ms = typeof at === "number" ? at : Date.parse(at);
    if (!Number.isFinite(ms)) return;
    const sample = this.now() - ms;
    if (sample < this.offset) this.offset = sample;
  }

  /** A server timestamp as epoch milliseconds (null when it is not one). */
  serverTime(ts) {
    const at = typeof ts === "number" ? ts : Date.parse(ts);
    return Number.isFinite(at) ? at : null;
  }

  /** The server's clock now, as far as this browser can tell. */
  serverNow() {
    return this.now() - (Number.isFinite(this.offset) ? this.offset : 0);
  }

  // --- events -------------------------------------------------------------------------------

  /** Applies one event as /v1/events sends it. */
  apply(ev) {
    if (typeof ev.seq === "number") {
      if (ev.seq <= this.lastSeq) return; // a replayed event already applied
      this.lastSeq = ev.seq;
    }
    if (ev.ts) this.observeClock(ev.ts);
    const handler = HANDLERS[ev.type];
    if (handler) handler(this, ev);
  }

  turnOf(ev) {
    if (!ev.turn_id) return null;
    let turn = this.turns.get(ev.turn_id);
    if (!turn && !this.ended.has(ev.turn_id)) {
      // The stream began after this turn's turn_start (a replay from the middle): learn it here.
      turn = this.addTurn({
        turn_id: ev.turn_id,
        principal: ev.principal,
        session_id: ev.session_id,
        started_at: ev.ts,
      });
    }
    if (turn && typeof ev.seq === "number") turn.lastSeq = ev.seq;
    if (turn && ev.principal && !turn.principal) this.setTurnPrincipal(turn, ev.principal);
    return turn ?? null;
  }

  addTurn({ turn_id, principal, session_id, parent_turn_id, started_at }) {
    const turn = {
      turnId: turn_id,
      principal: principal ?? null,
      sessionId: session_id ?? null,
      parentTurnId: parent_turn_id ?? null,
      startedAt: started_at ? this.serverTime(started_at) : this.serverNow(),
      callKeys: [],
      aborting: null,
      cancelRequested: false,
      lastSeq: this.lastSeq,
    };
    this.turns.set(turn_id, turn);
    this.notePrincipal(turn.principal);
    this.dirty.turnsAdded.add(turn_id);
    this.dirty.summary = true;
    return turn;
  }

  /** A turn first learned without its principal (an older server's event) learns it later. */
  setTurnPrincipal(turn, principal) {
    turn.principal = principal;
    this.notePrincipal(principal);
    this.dirty.turns.add(turn.turnId);
    for (const key of turn.callKeys) {
      const call = this.calls.get(key);
      if (call && !call.principal) {
        call.principal = principal;
        this.touch(call);
      }
    }
  }

  /** The call an event is about, made when it is new (null for events of ended turns). */
  callOf(ev) {
    if (!ev.call_id || !ev.turn_id) return null;
    const key = callKey(ev.turn_id, ev.call_id);
    const known = this.calls.get(key) ?? this.recentByKey.get(key);
    if (known) {
      if (ev.principal && !known.principal) {
        const turn = this.turns.get(known.turnId);
        if (turn) this.setTurnPrincipal(turn, ev.principal);
        else known.principal = ev.principal;
      }
      return known;
    }
    const turn = this.turnOf(ev);
    if (!turn) return null;
    return this.addCall(turn, ev.call_id, ev.tool);
  }

  addCall(turn, callId, tool) {
    const key = callKey(turn.turnId, callId);
    const call = {
      key,
      turnId: turn.turnId,
      callId,
      principal: turn.principal,
      sessionId: turn.sessionId,
      tool: tool ?? "",
      state: "queued",
      attempt: 0,
      startedAt: null,
      retryUntil: null,
      progress: null,
      outcome: null,
      durationMs: null,
      endedAt: null,
      stopping: false,
      abandoned: false,
      stopHow: null,
      stopAfterMs: null,
      pendingStop: null,
      stopDeadline: null,
      interactionId: null,
      cancelRequested: false,
      text: "",
      timeline: [],
      progressCount: 0,
      turnEnded: false,
    };
    turn.callKeys.push(key);
    this.calls.set(key, call);
    this.dirty.calls.add(key);
    this.dirty.turns.add(turn.turnId);
    this.dirty.summary = true;
    return call;
  }

  touch(call) {
    this.dirty.calls.add(call.key);
    if (this.turns.has(call.turnId)) this.dirty.turns.add(call.turnId);
    this.dirty.summary = true;
    if (this.stopping.has(call.key)) this.dirty.stopping = true;
    if (this.recentByKey.has(call.key)) this.dirty.recent = true;
  }

  mark(call, ev, kind, text) {
    call.timeline.push({ at: ev.ts ? this.serverTime(ev.ts) : this.serverNow(), kind, text });
    if (call.timeline.length > 40) call.timeline.splice(1, call.timeline.length - 40);
  }

  /** Records a call's outcome (once). */
  finish(call, outcome, ev, extra = {}) {
    if (call.outcome) return;
    call.outcome = outcome;
    call.durationMs = extra.durationMs ?? outcome.duration_ms ?? null;
    call.endedAt = ev?.ts ? this.serverTime(ev.ts) : this.serverNow();
    call.text = extra.text ?? call.text;
    // Between attempts (a retry's backoff) nothing runs, so nothing is left to stop.
    const inBackoff = call.state === "retrying" && call.retryUntil !== null && this.serverNow() < call.retryUntil;
    const ranAttempt = call.startedAt !== null && !inBackoff;
    call.state = "done";
    call.interactionId = null;
    // A question whose call ended unanswered (cancelled while it waited) is gone without an
    // event of its own.
    for (const [id, i] of this.interactions) {
      if (i.call_id === call.callId && i.turn_id === call.turnId) this.forgetInteraction(id);
    }
    if (call.pendingStop) {
      // Its tool_stopped came first (the stop can win the race with the outcome's event).
      call.stopHow = call.pendingStop.how;
      call.stopAfterMs = call.pendingStop.afterMs;
      if (call.stopHow === "abandoned") {
        call.abandoned = true;
        this.stopping.set(call.key, call);
        this.dirty.stopping = true;
      }
    } else if (outcomeStopsWork(outcome) && ranAttempt) {
      call.stopping = true;
      call.stopDeadline = this.now() + STOP_UNCONFIRMED_MS;
      this.stopping.set(call.key, call);
      this.dirty.stopping = true;
    }
    this.addRecent(call);
    this.touch(call);
  }

  addRecent(call) {
    if (this.recentByKey.has(call.key)) return;
    this.recent.push(call);
    this.recentByKey.set(call.key, call);
    while (this.recent.length > this.recentLimit) {
      const old = this.recent.shift();
      this.recentByKey.delete(old.key);
    }
    this.dirty.recent = true;
    this.dirty.recentAdded += 1;
  }

  endStop(call) {
    call.stopping = false;
    call.stopDeadline = null;
    if (!call.abandoned) {
      this.stopping.delete(call.key);
      if (call.turnEnded) this.calls.delete(call.key);
    }
    this.dirty.stopping = true;
    this.touch(call);
  }

  endTurn(turnId) {
    const turn = this.turns.get(turnId);
    this.ended.add(turnId);
    this.endedOrder.push(turnId);
    if (this.endedOrder.length > ENDED_MEMORY) this.ended.delete(this.endedOrder.shift());
    if (!turn) return;
    this.turns.delete(turnId);
    for (const key of turn.callKeys) {
      const call = this.calls.get(key);
      if (!call) continue;
      call.turnEnded = true;
      if (!this.stopping.has(key)) this.calls.delete(key);
    }
    this.dirty.turnsRemoved.add(turnId);
    this.dirty.turnsAdded.delete(turnId);
    this.dirty.turns.delete(turnId);
    this.dirty.summary = true;
    this.dirty.stopping = true;
  }

  // --- snapshots ----------------------------------------------------------------------------

  /**
   * Merges `GET /v1/turns/active`, requested when `seqAtRequest` was the last event applied and
   * answered now. Events win over the snapshot where both know something; turns the snapshot no
   * longer lists and no event since the request touched have ended unseen.
   */
  applyActive(turns, seqAtRequest) {
    const listed = new Set();
    const receivedAt = this.serverNow();
    for (const t of turns) {
      listed.add(t.turn_id);
      if (this.ended.has(t.turn_id)) continue;
      let turn = this.turns.get(t.turn_id);
      if (!turn) turn = this.addTurn(t);
      if (t.parent_turn_id) turn.parentTurnId = t.parent_turn_id;
      if (t.principal && !turn.principal) this.setTurnPrincipal(turn, t.principal);
      if (t.started_at) turn.startedAt = this.serverTime(t.started_at);
      this.dirty.turns.add(t.turn_id);
      for (const c of t.calls ?? []) {
        const key = callKey(t.turn_id, c.call_id);
        const call = this.calls.get(key) ?? this.recentByKey.get(key) ?? this.addCall(turn, c.call_id, c.tool);
        if (call.outcome) continue;
        if (c.tool) call.tool = c.tool;
        call.attempt = Math.max(call.attempt, c.attempt ?? 0);
        if (c.progress) call.progress = c.progress;
        if (c.state === "done") {
          this.finish(call, { status: c.status ?? "done" }, null);
          continue;
        }
        call.state = c.state === "backoff" ? "retrying" : c.state;
        if (c.elapsed_ms > 0 || c.state === "running" || c.state === "backoff") {
          call.startedAt = receivedAt - (c.elapsed_ms ?? 0);
        }
        this.touch(call);
      }
    }
    for (const turn of [...this.turns.values()]) {
      if (!listed.has(turn.turnId) && turn.lastSeq <= seqAtRequest) this.endTurn(turn.turnId);
    }
  }

  /** Merges `GET /v1/interactions` (see applyActive). */
  applyInteractions(list, seqAtRequest) {
    const listed = new Set();
    for (const i of list) {
      listed.add(i.id);
      if (this.answered.has(i.id) || this.interactions.has(i.id)) continue;
      this.addInteraction(i, seqAtRequest);
    }
    for (const [id, i] of this.interactions) {
      if (!listed.has(id) && i.seq <= seqAtRequest) this.removeInteraction(id);
    }
  }

  /** Replaces what `GET /v1/tools` lists (backends, breakers, changed definitions). */
  applyTools(list) {
    this.tools = new Map(
      list.map((t) => [t.name, { backend: t.backend, breaker: t.breaker ?? "closed", state: t.backend_state, changed: validChange(t.changed) }]),
    );
    this.dirty.servers = true;
    this.dirty.tools = true;
  }

  /** The tools whose definition changed and waits to be accepted, blocked ones first, then by name. */
  changedTools() {
    const out = [];
    for (const [name, t] of this.tools) if (t.changed) out.push({ name, ...t });
    return out.sort((a, b) => Number(b.changed.blocked) - Number(a.changed.blocked) || a.name.localeCompare(b.name));
  }

  // --- replicas -----------------------------------------------------------------------------

  /** Whether the page may read `GET /v1/replicas` (`read`); until it knows who it is, yes: the server decides. */
  mayReadReplicas() {
    return !this.me || hasScope(this.me, "read");
  }

  /** What `GET /v1/replicas` answered: the panel shows only for a shared trail. */
  applyReplicas(answer) {
    const shown = answer?.shared === true;
    const list = shown && Array.isArray(answer.replicas) ? answer.replicas.filter((r) => r && typeof r.replica === "string") : [];
    this.replicas = { shown, list, error: null };
    this.dirty.replicas = true;
  }

  /** No panel: the server keeps no shared trail, or the page may not read it (403), or has no such endpoint (404). */
  hideReplicas() {
    this.replicas = { shown: false, list: [], error: null };
    this.dirty.replicas = true;
  }

  /**
   * The last read of the replicas failed: the list shown stays, under the error. `show`: the
   * failure itself says the trail is shared (its database did not answer), so the panel shows.
   */
  setReplicasError(message, { show = false } = {}) {
    this.replicas = { ...this.replicas, shown: this.replicas.shown || show, error: message };
    this.dirty.replicas = true;
  }

  /** Whether the page may accept a tool's changed definition (`admin`); until it knows who it is, yes: the server decides. */
  mayAccept() {
    return !this.me || hasScope(this.me, "admin");
  }

  /** An Accept of `tool` left (`busy`) or came back. */
  setAccepting(tool, busy) {
    if (busy) this.toolsAccepting.add(tool);
    else this.toolsAccepting.delete(tool);
    this.dirty.tools = true;
  }

  /** What went wrong with an Accept (null: clears it). */
  setAcceptError(error) {
    this.acceptError = error;
    this.dirty.tools = true;
  }

  notePin(ev, type) {
    if (!ev.tool) return;
    const entry = {
      seq: ev.seq ?? null,
      at: ev.ts ? this.serverTime(ev.ts) : this.serverNow(),
      ts: ev.ts ?? null,
      type,
      tool: ev.tool,
      server: ev.server ?? null,
      action: ev.action ?? null,
      by: ev.by ?? null,
      text: type === "tool_changed" ? toolChangedText(ev) : toolAcceptedText(ev),
    };
    this.pinLog.push(entry);
    if (this.pinLog.length > PIN_LOG_LIMIT) this.pinLog.splice(0, this.pinLog.length - PIN_LOG_LIMIT);
    this.dirty.pinLog = true;
  }

  /** Replaces the servers `GET /healthz` lists. */
  applyServers(servers) {
    this.servers = new Map(Object.entries(servers ?? {}).map(([name, s]) => [name, { state: s.state, detail: s.detail ?? null }]));
    this.dirty.servers = true;
  }

  /**
   * Forgets what may no longer be true: the server restarted (its sequence began again), so every
   * running turn, pending question and stop in progress is gone. Recent outcomes stay: they happened.
   */
  resetLive() {
    for (const id of [...this.turns.keys()]) this.endTurn(id);
    for (const call of [...this.stopping.values()]) {
      call.abandoned = false;
      this.endStop(call);
    }
    for (const id of [...this.interactions.keys()]) this.removeInteraction(id);
    this.lastSeq = 0;
  }

  addInteraction(i, seq) {
    const interaction = {
      ...i,
      seq,
      deadlineAt: this.serverTime(i.deadline),
      createdAt: this.serverTime(i.created_at),
    };
    this.interactions.set(i.id, interaction);
    this.notePrincipal(i.principal);
    this.dirty.interactions = true;
    this.dirty.summary = true;
    this.dirty.interactionsAdded.push(interaction);
    return interaction;
  }

  /** An interaction that was answered, timed out or dropped: gone, and never brought back. */
  forgetInteraction(id) {
    this.answered.add(id);
    this.answeredOrder.push(id);
    if (this.answeredOrder.length > ENDED_MEMORY) this.answered.delete(this.answeredOrder.shift());
    this.removeInteraction(id);
  }

  removeInteraction(id) {
    if (this.interactions.delete(id)) {
      this.dirty.interactions = true;
      this.dirty.summary = true;
    }
  }

  // --- time ---------------------------------------------------------------------------------

  /** Drops stops never confirmed within STOP_UNCONFIRMED_MS (their event was lost). */
  expire() {
    const now = this.now();
    for (const call of [...this.stopping.values()]) {
      if (call.stopping && call.stopDeadline !== null && now > call.stopDeadline) {
        call.stopHow = "unconfirmed";
        this.endStop(call);
      }
    }
  }

  /** The state a person should read for a call now. */
  displayState(call) {
    if (call.abandoned) return "abandoned";
    if (call.stopping) return "stopping";
    if (call.outcome) return "done";
    if (call.state === "retrying" && call.retryUntil !== null && this.serverNow() >= call.retryUntil) return "running";
    return call.state;
  }

  /** How long a call has run (since its first attempt), or null before it started. */
  elapsed(call) {
    if (call.startedAt === null) return null;
    if (call.outcome && call.durationMs !== null) return call.durationMs;
    return Math.max(0, this.serverNow() - call.startedAt);
  }

  counts() {
    let running = 0;
    let waiting = 0;
    for (const turn of this.turns.values()) {
      for (const key of turn.callKeys) {
        const call = this.calls.get(key);
        if (!call || call.outcome) continue;
        if (call.state === "awaiting_approval") waiting += 1;
        else running += 1;
      }
    }
    return { running, waitingApproval: waiting, stopping: this.stopping.size, interactions: this.interactions.size };
  }

  takeDirty() {
    const d = this.dirty;
    this.dirty = newDirty();
    return d;
  }
}

function newDirty() {
  return {
    turnsAdded: new Set(),
    turnsRemoved: new Set(),
    turns: new Set(),
    calls: new Set(),
    interactions: false,
    interactionsAdded: [],
    servers: false,
    recent: false,
    recentAdded: 0,
    stopping: false,
    summary: false,
    /** Who the page is changed (the header says it; Cancel and Accept buttons follow). */
    me: false,
    /** The live view's principal filter changed. */
    filter: false,
    /** A principal was seen for the first time (the filter's choices). */
    principals: false,
    /** The tools' list changed, or an Accept left or came back. */
    tools: false,
    /** A tool_changed or tool_accepted was added to pinLog. */
    pinLog: false,
    /** `GET /v1/replicas` answered (or failed), or the panel is to hide. */
    replicas: false,
  };
}

/** A `changed` of `GET /v1/tools` as the page keeps it, or null when there is none (or it is not one). */
function validChange(c) {
  if (!c || typeof c !== "object") return null;
  return {
    server: String(c.server ?? ""),
    old_digest: String(c.old_digest ?? ""),
    new_digest: String(c.new_digest ?? ""),
    diff: typeof c.diff === "string" ? c.diff : "",
    blocked: c.blocked === true,
  };
}

/** An outcome from a turn_end result, in either family or the engine's own form. */
function outcomeOfResult(result) {
  return result?.toolwarden ?? result?.outcome ?? null;
}

const HANDLERS = {
  turn_start(m, ev) {
    if (m.ended.has(ev.turn_id)) return;
    let turn = m.turns.get(ev.turn_id);
    if (!turn) turn = m.addTurn({ ...ev, started_at: ev.ts });
    else if (ev.principal && !turn.principal) m.setTurnPrincipal(turn, ev.principal);
    turn.lastSeq = ev.seq ?? turn.lastSeq;
    if (ev.parent_turn_id) turn.parentTurnId = ev.parent_turn_id;
    for (const c of ev.calls ?? []) {
      const key = callKey(ev.turn_id, c.call_id);
      if (!m.calls.has(key)) m.addCall(turn, c.call_id, c.tool);
    }
  },

  turn_abort(m, ev) {
    const turn = m.turnOf(ev);
    if (!turn) return;
    turn.aborting = ev.reason ?? "user";
    m.dirty.turns.add(turn.turnId);
  },

  turn_end(m, ev) {
    const turn = m.turns.get(ev.turn_id);
    if (turn && Array.isArray(ev.results)) {
      // Calls whose tool_result this page missed still get their outcome from the turn's list.
      for (const result of ev.results) {
        const outcome = outcomeOfResult(result);
        if (!outcome?.call_id) continue;
        const call = m.calls.get(callKey(ev.turn_id, outcome.call_id));
        if (call && !call.outcome) m.finish(call, outcome, ev, { text: result.content });
      }
    }
    m.endTurn(ev.turn_id);
  },

  tool_start(m, ev) {
    const call = m.callOf(ev);
    if (!call || call.outcome) return;
    call.state = "running";
    call.attempt = Math.max(call.attempt, 1);
    call.startedAt = m.serverTime(ev.ts);
    call.timeoutMs = ev.timeout_ms ?? null;
    call.pendingStop = null;
    m.mark(call, ev, "start", "start");
    m.touch(call);
  },

  tool_progress(m, ev) {
    const call = m.callOf(ev);
    if (!call || call.outcome) return;
    if (call.state === "queued" || call.state === "approved" || call.state === "waiting") call.state = "running";
    if (typeof ev.elapsed_ms === "number" && ev.ts) call.startedAt = m.serverTime(ev.ts) - ev.elapsed_ms;
    if (ev.progress != null || ev.total != null || ev.message != null) {
      call.progress = { progress: ev.progress ?? null, total: ev.total ?? null, message: ev.message ?? null };
      call.progressCount += 1;
    }
    m.touch(call);
  },

  tool_retry(m, ev) {
    const call = m.callOf(ev);
    if (!call || call.outcome) return;
    call.state = "retrying";
    call.attempt = ev.attempt ?? call.attempt + 1;
    call.retryUntil = (m.serverTime(ev.ts) ?? m.serverNow()) + (ev.delay_ms ?? 0);
    call.pendingStop = null;
    m.mark(call, ev, "retry", `retry #${call.attempt} in ${ev.delay_ms ?? 0} ms (${ev.cause ?? "failed"})`);
    m.touch(call);
  },

  tool_timeout(m, ev) {
    const call = m.callOf(ev);
    if (!call) return;
    m.mark(call, ev, "timeout", `timeout ${ev.kind ?? ""} ${ev.after_ms ?? ""} ms`.replace(/\s+/g, " ").trim());
    m.touch(call);
  },

  rule_decision(m, ev) {
    const call = m.callOf(ev);
    if (!call) return;
    m.mark(call, ev, "rule", ruleDecisionText(ev));
  },

  hook_decision(m, ev) {
    const call = m.callOf(ev);
    if (!call) return;
    m.mark(call, ev, "hook", hookDecisionText(ev));
  },

  quota_exceeded(m, ev) {
    const call = m.callOf(ev);
    if (!call) return;
    m.mark(call, ev, "quota", quotaExceededText(ev));
  },

  tool_call_denied(m, ev) {
    const call = m.callOf(ev);
    if (!call) return;
    m.mark(call, ev, "denied", `denied by ${ev.decider ?? "?"} (${ev.reason ?? "?"})`);
  },

  cache_hit(m, ev) {
    const call = m.callOf(ev);
    if (!call) return;
    m.mark(call, ev, "cache", "cache hit");
  },

  tool_result(m, ev) {
    const call = m.callOf(ev);
    if (!call) return;
    if (ev.tool && !call.tool) call.tool = ev.tool;
    const outcome = ev.outcome ?? { status: "unknown" };
    m.finish(call, outcome, ev, { durationMs: ev.duration_ms ?? outcome.duration_ms, text: ev.content });
    m.mark(call, ev, "result", "result");
  },

  tool_stopped(m, ev) {
    const key = callKey(ev.turn_id, ev.call_id);
    const call = m.calls.get(key) ?? m.recentByKey.get(key);
    if (!call) return;
    m.mark(call, ev, "stopped", stopText(ev));
    if (!call.outcome) {
      // Either an attempt that timed out and will be retried (a tool_retry follows and forgets
      // this), or the stop of the last attempt winning the race with the call's outcome.
      call.pendingStop = { how: ev.how, afterMs: ev.after_ms ?? null };
      m.touch(call);
      return;
    }
    call.stopHow = ev.how;
    call.stopAfterMs = ev.after_ms ?? null;
    if (ev.how === "abandoned") {
      call.abandoned = true;
      m.stopping.set(call.key, call);
    }
    m.endStop(call);
  },

  tool_late_result(m, ev) {
    const key = callKey(ev.turn_id, ev.call_id);
    const call = m.calls.get(key) ?? m.recentByKey.get(key);
    if (!call) return;
    m.mark(call, ev, "late", `late answer after ${ev.after_ms ?? 0} ms (discarded)`);
    if (call.abandoned) {
      call.abandoned = false;
      m.endStop(call);
    } else {
      m.touch(call);
    }
  },

  interaction_requested(m, ev) {
    const i = ev.interaction;
    if (!i || m.answered.has(i.id)) return;
    m.addInteraction(i, ev.seq ?? m.lastSeq);
    if (i.call_id && i.turn_id) {
      const call = m.callOf({ ...ev, turn_id: i.turn_id, call_id: i.call_id, tool: i.tool });
      if (call && !call.outcome) {
        call.state = "awaiting_approval";
        call.interactionId = i.id;
        m.mark(call, ev, "ask", `${i.kind} asked`);
        m.touch(call);
      }
    }
  },

  interaction_answered(m, ev) {
    const i = m.interactions.get(ev.interaction_id);
    m.forgetInteraction(ev.interaction_id);
    if (i?.call_id && i.turn_id) {
      const call = m.calls.get(callKey(i.turn_id, i.call_id));
      if (call && !call.outcome) {
        call.state = ev.action === "approve" ? "approved" : call.state;
        call.interactionId = null;
        m.mark(call, ev, "answer", `${ev.action === "approve" ? "approved" : "denied"}${ev.by ? ` by ${ev.by}` : ""}`);
        m.touch(call);
      }
    }
  },

  interaction_timed_out(m, ev) {
    m.forgetInteraction(ev.interaction_id);
  },

  tool_changed(m, ev) {
    m.notePin(ev, "tool_changed");
  },

  tool_accepted(m, ev) {
    // A person's acceptance, or one that follows a change (on_tool_change = "accept"); a tool
    // pinned when first listed (every tool of a new server) is left out.
    const last = m.pinLog.findLast((e) => e.tool === ev.tool);
    if (ev.by || (last?.type === "tool_changed" && last.action === "accept")) m.notePin(ev, "tool_accepted");
  },

  breaker_state(m, ev) {
    if (!ev.tool) return;
    const tool = m.tools.get(ev.tool) ?? { backend: ev.tool.split("__")[0], state: "up", changed: null };
    tool.breaker = ev.state;
    m.tools.set(ev.tool, tool);
    m.dirty.servers = true;
  },

  server_state(m, ev) {
    if (!ev.server) return;
    m.servers.set(ev.server, { state: ev.state, detail: ev.detail ?? null });
    m.dirty.servers = true;
    if (ev.state === "down" || ev.state === "failed" || ev.state === "restarted") {
      // The server's process is gone: so is the work it was abandoned with.
      for (const call of [...m.stopping.values()]) {
        if (call.abandoned && m.tools.get(call.tool)?.backend === ev.server) {
          call.abandoned = false;
          m.mark(call, ev, "server", `server ${ev.state}`);
          m.endStop(call);
        }
      }
    }
  },
};
