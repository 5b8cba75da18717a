// The DOM side: turns the model into the page, once per animation frame.
//
// Rows are made once per call and then patched: each row remembers what it shows, so a frame
// writes only what changed. A turn far from the screen is skipped by the browser's rendering
// (`content-visibility: auto`): its rows are brought up to date a few dozen per frame, where
// nothing needs to be laid out or painted, while the turns on screen are kept exact every frame
// (their clocks tick at the resolution they display). So a thousand running calls cost about as
// much as the hundred or so near the screen.

import {
  agoText,
  clockTime,
  dateTime,
  denialDetail,
  diffLines,
  elapsedBand,
  elapsedResolution,
  firstLine,
  formatCountdown,
  formatDuration,
  formatElapsed,
  leaseText,
  outcomeTag,
  outcomeText,
  progressText,
  preciseTime,
  replicaStateTitle,
  shortDigest,
  shortId,
  stateText,
  takeoverText,
  whoText,
} from "./format.js";
import { hasScope, seesOthers } from "./model.js";

/** How many off-screen rows are refreshed per frame. */
const OFFSCREEN_BUDGET = 40;

/** `h("td", {class: "x"}, child...)`: an element, with text children as text nodes. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else if (k.startsWith("data-")) el.setAttribute(k, v);
    else if (k in el && typeof v !== "string") el[k] = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

function setText(el, text) {
  if (el.textContent !== text) el.textContent = text;
}

export class View {
  constructor({ doc = document, model, announce }) {
    this.doc = doc;
    this.model = model;
    this.announce = announce;
    this.$ = (id) => doc.getElementById(id);
    this.turnEls = new Map(); // turn_id → {article, rowsEl, countEl, cancelBtn, visible}
    this.rows = new Map(); // callKey → row record
    this.asks = new Map(); // interaction id → item record
    this.stopRows = new Map(); // callKey → row record
    this.recentRows = new Map(); // callKey → row record
    this.offscreen = new Set(); // row records needing a refresh while their turn is skipped
    this.lastSecond = 0;
    this.turnsEmptyStale = false;
    this.rowTemplate = doc.getElementById("call-row");
    this.toolCards = new Map(); // tool name → card record (tools whose definition changed)
    this.openDiffs = new Set(); // `${tool}\n${new_digest}` of the diffs shown
    this.toolsShown = ""; // what the table of all tools shows, to skip redrawing it unchanged
    this.toolsDrawn = false; // whether the tools were drawn once (later changes are announced)
    this.replicaRows = new Map(); // replica id → row record
    this.replicasDrawn = false; // whether the replicas were drawn once (later deaths are announced)
    this.ids = 0;
  }

  /** The browser starts or stops rendering a turn: on screen again, its rows catch up at once. */
  onTurnVisibility(turnRec, skipped) {
    turnRec.visible = !skipped;
    if (skipped) return;
    const now = this.model.serverNow();
    for (const tr of turnRec.rowsEl.children) {
      const rec = tr.__rec;
      if (rec?.stale) {
        this.offscreen.delete(rec);
        this.updateRow(rec, now);
      }
    }
  }

  /** Whether something on the page changes with time alone (a clock, a countdown). */
  ticking() {
    return this.rows.size > 0 || this.model.interactions.size > 0 || this.model.stopping.size > 0;
  }

  render() {
    const m = this.model;
    const now = m.serverNow();
    if (Math.floor(now / 1000) !== this.lastSecond) {
      this.lastSecond = Math.floor(now / 1000);
      m.expire();
    }
    const d = m.takeDirty();
    for (const turnId of d.turnsRemoved) this.removeTurn(turnId);
    for (const turnId of d.turnsAdded) this.addTurn(turnId);
    for (const key of d.calls) {
      let rec = this.rows.get(key);
      if (!rec) {
        // A call its turn did not list when it was drawn (learned from a later event).
        const call = m.calls.get(key);
        const turnRec = call && this.turnEls.get(call.turnId);
        if (!turnRec) continue;
        rec = this.makeRow(call, turnRec);
        turnRec.rowsEl.append(rec.tr);
      }
      if (rec.turnRec.visible) this.updateRow(rec, now);
      else this.markStale(rec);
    }
    if (d.filter) for (const turnId of this.turnEls.keys()) this.updateTurnHead(turnId);
    else for (const turnId of d.turns) this.updateTurnHead(turnId);
    if (this.turnsEmptyStale) this.updateTurnsEmpty();
    this.tickRows(now);
    this.refreshOffscreen(now);
    if (d.interactions || d.me) this.renderAsks(d.interactionsAdded ?? []);
    this.tickAsks(now);
    if (d.stopping || d.calls.size > 0) this.renderStopping(d.calls, d.filter);
    this.tickStopping(now);
    if (d.recent || d.calls.size > 0 || d.filter) this.renderRecent(d.recentAdded, d.calls, d.filter);
    if (d.servers) this.renderServers();
    if (d.tools || d.me) this.renderTools();
    if (d.pinLog) this.renderPinLog();
    if (d.replicas) this.renderReplicas(now);
    if (d.summary) this.renderSummary();
    if (d.me) this.renderMe();
    if (d.principals || d.me || d.filter) this.renderPrincipalFilter();
  }

  // --- running turns ------------------------------------------------------------------------

  addTurn(turnId) {
    const turn = this.model.turns.get(turnId);
    if (!turn || this.turnEls.has(turnId)) return;
    const label = `turn ${turnId}`;
    const cancelBtn = h("button", {
      type: "button",
      class: "danger cancel-turn",
      "data-action": "cancel-turn",
      "data-turn": turnId,
      "aria-label": `Cancel ${label} and all its calls`,
      text: "Cancel turn",
    });
    const countEl = h("span", { class: "turn-count" });
    const startedEl = h("span", { class: "turn-started" });
    const principalEl = h("strong", { class: "turn-principal" });
    const metaParts = [
      "by ",
      principalEl,
      " · session ",
      h("code", { text: shortId(turn.sessionId ?? "?", 10), title: turn.sessionId ?? "" }),
      " · started ",
      startedEl,
      " · ",
      countEl,
    ];
    if (turn.parentTurnId) {
      metaParts.push(" · sub-turn of ", h("code", { text: shortId(turn.parentTurnId), title: turn.parentTurnId }));
    }
    // A grid of rows with table roles rather than a <table>: each row then lays out and paints
    // on its own, and rows far from the screen are skipped (see app.css).
    const rowsEl = h("div", { role: "rowgroup", class: "rows" });
    const article = h(
      "article",
      { class: "turn", "data-turn": turnId, "aria-label": label },
      h(
        "header",
        { class: "turn-head" },
        h("h3", {}, "Turn ", h("code", { text: shortId(turnId, 10), title: turnId })),
        h("p", { class: "meta" }, ...metaParts),
        cancelBtn,
      ),
      h(
        "div",
        { role: "table", class: "calls", "aria-label": `Calls of ${label}` },
        h(
          "div",
          { role: "rowgroup" },
          h(
            "div",
            { role: "row", class: "row head" },
            h("span", { role: "columnheader", class: "c-call", text: "Call" }),
            h("span", { role: "columnheader", class: "c-principal", text: "Principal" }),
            h("span", { role: "columnheader", class: "c-tool", text: "Tool" }),
            h("span", { role: "columnheader", class: "c-state", text: "State" }),
            h("span", { role: "columnheader", class: "c-elapsed", text: "Elapsed" }),
            h("span", { role: "columnheader", class: "c-progress", text: "Progress" }),
            h("span", { role: "columnheader", class: "c-action" }, h("span", { class: "visually-hidden", text: "Actions" })),
          ),
        ),
        rowsEl,
      ),
    );
    // Until the browser says otherwise, a turn counts as on screen.
    const rec = { article, rowsEl, countEl, startedEl, principalEl, cancelBtn, visible: true, shown: {} };
    article.addEventListener("contentvisibilityautostatechange", (e) => this.onTurnVisibility(rec, e.skipped));
    this.turnEls.set(turnId, rec);
    const fragment = this.doc.createDocumentFragment();
    for (const key of turn.callKeys) {
      const call = this.model.calls.get(key);
      if (call) fragment.append(this.makeRow(call, rec).tr);
    }
    rowsEl.append(fragment);
    // What a skipped turn is assumed to measure (a row is about 2 rem), until it was rendered once.
    article.style.containIntrinsicSize = `auto ${4 + turn.callKeys.length * 2.1}rem`;
    this.$("turns").append(article);
    this.updateTurnHead(turnId);
    this.turnsEmptyStale = true;
  }

  /** "No turn is running", when no turn shows (none runs, or the filter hides every one). */
  updateTurnsEmpty() {
    this.turnsEmptyStale = false;
    let shown = 0;
    for (const rec of this.turnEls.values()) if (!rec.article.hidden) shown += 1;
    const empty = this.$("turns-empty");
    const filter = this.model.principalFilter;
    const others = this.turnEls.size;
    setText(
      empty,
      !filter ? "No turn is running." : others > 0 ? `No turn of ${filter} is running (the filter hides ${others} other${others === 1 ? "" : "s"}).` : `No turn of ${filter} is running.`,
    );
    empty.hidden = shown > 0;
  }

  makeRow(call, turnRec) {
    const tr = this.rowTemplate.content.firstElementChild.cloneNode(true);
    const cells = tr.children;
    const rec = {
      tr,
      key: call.key,
      callEl: cells[0].firstElementChild,
      principalEl: cells[1],
      toolEl: cells[2],
      stateEl: cells[3].firstElementChild,
      elapsedEl: cells[4].firstElementChild,
      barEl: cells[5].querySelector("progress"),
      msgEl: cells[5].querySelector(".msg"),
      button: cells[6].firstElementChild,
      turnRec,
      stale: true,
      shown: {},
      nextTick: 0,
    };
    tr.__rec = rec;
    tr.dataset.key = call.key;
    rec.callEl.textContent = call.callId;
    rec.button.dataset.turn = call.turnId;
    rec.button.dataset.call = call.callId;
    this.rows.set(call.key, rec);
    this.updateRow(rec, this.model.serverNow());
    return rec;
  }

  removeTurn(turnId) {
    const rec = this.turnEls.get(turnId);
    if (!rec) return;
    this.turnEls.delete(turnId);
    for (const tr of rec.rowsEl.children) {
      const row = tr.__rec;
      if (!row) continue;
      this.offscreen.delete(row);
      this.rows.delete(row.key);
    }
    this.keepFocus(rec.article);
    rec.article.remove();
    this.turnsEmptyStale = true;
  }

  /** Before `el` leaves the page with the focus inside it, hand the focus on to a sensible place. */
  keepFocus(el) {
    const active = this.doc.activeElement;
    if (!active || !el.contains(active)) return;
    let next = el.nextElementSibling ?? el.previousElementSibling;
    while (next && next.closest(".turn") === el) next = next.nextElementSibling;
    const target = next?.querySelector("button") ?? this.$("running-heading");
    target?.focus();
  }

  /** The focused Cancel of a call that just ended goes away: focus the next thing to stop. */
  focusAfterRow(rec) {
    let next = rec.tr.nextElementSibling;
    while (next && next.querySelector("button")?.hidden !== false) next = next.nextElementSibling;
    const target = next?.querySelector("button") ?? rec.turnRec.cancelBtn;
    target.focus();
  }

  markStale(rec) {
    rec.stale = true;
    this.offscreen.add(rec);
  }

  updateTurnHead(turnId) {
    const rec = this.turnEls.get(turnId);
    const turn = this.model.turns.get(turnId);
    if (!rec || !turn) return;
    let running = 0;
    let waiting = 0;
    let total = 0;
    for (const key of turn.callKeys) {
      const call = this.model.calls.get(key);
      if (!call) continue;
      total += 1;
      if (!call.outcome) {
        if (call.state === "awaiting_approval") waiting += 1;
        else running += 1;
      }
    }
    const parts = [`${total} call${total === 1 ? "" : "s"}`];
    if (running) parts.push(`${running} running`);
    if (waiting) parts.push(`${waiting} waiting for approval`);
    if (turn.aborting) parts.push(`aborting (${turn.aborting})`);
    setText(rec.countEl, parts.join(", "));
    setText(rec.startedEl, clockTime(turn.startedAt));
    setText(rec.principalEl, turn.principal ?? "?");
    setBusy(rec.cancelBtn, Boolean(turn.aborting) || turn.cancelRequested === true);
    // Another principal's turn, without `abort`: no button the server would refuse.
    const cancellable = this.model.mayCancel(turn.principal);
    if (rec.shown.cancellable !== cancellable) {
      if (!cancellable) this.keepFocusOff(rec.cancelBtn, rec.article);
      rec.cancelBtn.hidden = !cancellable;
      rec.shown.cancellable = cancellable;
    }
    const shows = this.model.shows(turn.principal);
    if (rec.shown.shows !== shows) {
      if (!shows) this.keepFocus(rec.article);
      rec.article.hidden = !shows;
      rec.shown.shows = shows;
      this.turnsEmptyStale = true;
    }
  }

  /** A button about to hide with the focus on it: the focus goes to the next button of its turn, or the section's heading. */
  keepFocusOff(button, article) {
    if (this.doc.activeElement !== button) return;
    const next = [...article.querySelectorAll("button")].find((b) => b !== button && !b.hidden);
    (next ?? this.$("running-heading"))?.focus();
  }

  updateRow(rec, now) {
    const m = this.model;
    const call = m.calls.get(rec.key);
    if (!call) return;
    rec.stale = false;
    const shown = rec.shown;
    const principal = call.principal ?? "";
    if (shown.principal !== principal) {
      rec.principalEl.textContent = principal;
      rec.principalEl.title = principal;
      shown.principal = principal;
    }
    if (shown.tool !== call.tool) {
      rec.toolEl.textContent = call.tool;
      rec.button.setAttribute("aria-label", `Cancel call ${call.callId}${call.tool ? ` (${call.tool})` : ""}`);
      shown.tool = call.tool;
    }
    const state = m.displayState(call);
    const stateLabel =
      state === "done"
        ? outcomeText(call.outcome)
        : state === "stopping" || state === "abandoned"
          ? `${outcomeText(call.outcome)} · ${stateText(state)}`
          : stateText(state, call.attempt);
    const stateClass = `chip state-${state === "done" ? `out-${call.outcome?.status}` : state}`;
    if (shown.stateLabel !== stateLabel) {
      rec.stateEl.textContent = stateLabel;
      shown.stateLabel = stateLabel;
    }
    if (shown.stateClass !== stateClass) {
      rec.stateEl.className = stateClass;
      shown.stateClass = stateClass;
    }
    this.updateClock(rec, call, now);
    const p = call.progress;
    const hasBar = Boolean(p && p.total != null && p.total > 0 && p.progress != null);
    if (shown.hasBar !== hasBar) {
      rec.barEl.hidden = !hasBar;
      shown.hasBar = hasBar;
    }
    if (hasBar && (shown.progress !== p.progress || shown.total !== p.total)) {
      rec.barEl.max = p.total;
      rec.barEl.value = Math.min(p.progress, p.total);
      rec.barEl.setAttribute("aria-label", `${call.callId}: ${p.progress} of ${p.total}`);
      shown.progress = p.progress;
      shown.total = p.total;
    }
    const msg = progressText(p);
    if (shown.msg !== msg) {
      rec.msgEl.textContent = msg;
      shown.msg = msg;
    }
    // Ended, or another principal's call without `abort`: no Cancel.
    const cancellable = !call.outcome && m.mayCancel(call.principal);
    if (shown.cancellable !== cancellable) {
      if (!cancellable && this.doc.activeElement === rec.button) this.focusAfterRow(rec);
      rec.button.hidden = !cancellable;
      shown.cancellable = cancellable;
    }
    const busy = cancellable && call.cancelRequested;
    if (shown.busy !== busy) {
      setBusy(rec.button, busy);
      rec.button.textContent = busy ? "Cancelling…" : "Cancel";
      shown.busy = busy;
    }
  }

  updateClock(rec, call, now) {
    const elapsed = this.model.elapsed(call);
    const text = elapsed === null ? "—" : formatElapsed(elapsed);
    if (rec.shown.elapsed !== text) {
      rec.elapsedEl.textContent = text;
      rec.shown.elapsed = text;
    }
    const band = elapsed === null ? "none" : call.outcome ? "done" : elapsedBand(elapsed);
    if (rec.shown.band !== band) {
      rec.elapsedEl.className = `elapsed band-${band}`;
      rec.shown.band = band;
    }
    // When the text will next change: nothing to do for this row until then.
    rec.nextTick = elapsed === null || call.outcome ? Number.POSITIVE_INFINITY : now + (elapsedResolution(elapsed) - (elapsed % elapsedResolution(elapsed)));
  }

  /** Clocks of rows on screen, each when its text changes. */
  tickRows(now) {
    for (const rec of this.rows.values()) {
      if (!rec.turnRec.visible || now < rec.nextTick) continue;
      const call = this.model.calls.get(rec.key);
      if (!call) continue;
      if (call.state === "retrying") this.updateRow(rec, now);
      else this.updateClock(rec, call, now);
    }
  }

  /**
   * A few rows of skipped turns per frame: their data and clocks catch up in the background, so
   * what a screen reader or a search of the page finds there is at most a moment old.
   */
  refreshOffscreen(now) {
    let budget = OFFSCREEN_BUDGET;
    for (const rec of this.offscreen) {
      if (budget-- <= 0) break;
      this.offscreen.delete(rec);
      if (this.rows.get(rec.key) === rec) this.updateRow(rec, now);
    }
    if (this.offscreen.size === 0) {
      // Clocks of skipped turns lag by at most a second: refresh them round-robin.
      for (const rec of this.rows.values()) {
        if (!rec.turnRec.visible && now >= rec.nextTick + 1000) this.offscreen.add(rec);
        if (this.offscreen.size >= OFFSCREEN_BUDGET) break;
      }
    }
  }

  // --- approvals ----------------------------------------------------------------------------

  renderAsks(added) {
    const m = this.model;
    const list = this.$("asks");
    for (const [id, rec] of this.asks) {
      if (!m.interactions.has(id)) {
        this.keepFocusInList(rec.li, list);
        rec.li.remove();
        this.asks.delete(id);
      }
    }
    for (const i of m.interactions.values()) {
      if (!this.asks.has(i.id)) list.append(this.makeAsk(i));
    }
    // Answering needs `approve`, even for one's own call: without it the buttons give way to
    // a note (until the page knows who it is, they are shown and the server decides).
    const answers = !m.me || hasScope(m.me, "approve");
    for (const rec of this.asks.values()) {
      rec.buttons.hidden = !answers;
      rec.refusal.hidden = answers;
    }
    this.$("asks-empty").hidden = this.asks.size > 0;
    for (const i of added) {
      if (this.asks.has(i.id)) this.announce?.(`${kindWord(i.kind)} needed: ${i.tool ?? i.message}`);
    }
  }

  keepFocusInList(li, list) {
    const active = this.doc.activeElement;
    if (!active || !li.contains(active)) return;
    const next = li.nextElementSibling ?? li.previousElementSibling;
    (next?.querySelector("button") ?? this.$("asks-heading"))?.focus();
  }

  makeAsk(i) {
    const what = i.tool ?? i.kind;
    const countdown = h("span", { class: "countdown", role: "timer", "aria-live": "off" });
    const bar = h("progress", { class: "deadline", max: Math.max(1, i.timeout_ms ?? 1), "aria-hidden": "true" });
    const approve = h("button", {
      type: "button",
      class: "approve",
      "data-action": "approve",
      "data-id": i.id,
      "aria-label": `Approve ${what}${i.call_id ? ` (call ${i.call_id})` : ""}`,
      text: i.kind === "confirm" ? "Confirm" : "Approve",
    });
    const deny = h("button", {
      type: "button",
      class: "danger deny",
      "data-action": "deny",
      "data-id": i.id,
      "aria-label": `Deny ${what}${i.call_id ? ` (call ${i.call_id})` : ""}`,
      text: "Deny",
    });
    const body = [h("p", { class: "message", text: i.message })];
    if (i.input !== undefined && i.input !== null) {
      const json = JSON.stringify(i.input, null, 2);
      body.push(h("pre", { class: "input", tabindex: "0", "aria-label": `Input of ${what}`, text: json.length > 4000 ? `${json.slice(0, 4000)}\n…` : json }));
    }
    if (i.kind === "password") {
      const field = h("input", { type: "password", autocomplete: "off", class: "secret", "data-secret-for": i.id, id: `secret-${i.id}` });
      body.push(h("label", { class: "secret-label", for: `secret-${i.id}` }, "Secret ", field));
    }
    if (i.kind === "device_code" && i.details) {
      body.push(
        h("p", { class: "device" }, "Open ", h("code", { text: String(i.details.verification_uri ?? "") }), " and enter ", h("code", { text: String(i.details.user_code ?? "") })),
      );
    }
    const meta = [];
    if (i.principal) meta.push(`by ${i.principal}`);
    if (i.call_id) meta.push(`call ${i.call_id}`);
    if (i.turn_id) meta.push(`turn ${shortId(i.turn_id, 10)}`);
    if (i.session_id) meta.push(`session ${shortId(i.session_id, 10)}`);
    const buttons = h("div", { class: "buttons" }, approve, deny);
    const refusal = h("p", { class: "refusal", text: "Answering needs the approve scope, which you do not hold.", hidden: true });
    const li = h(
      "li",
      { class: `ask kind-${i.kind}`, "data-id": i.id },
      h("div", { class: "ask-head" }, h("span", { class: "chip kind", text: kindWord(i.kind) }), " ", h("strong", { class: "tool", text: what }), countdown),
      ...body,
      h("p", { class: "meta", text: meta.join(" · ") }),
      bar,
      buttons,
      refusal,
    );
    this.asks.set(i.id, { li, countdown, bar, buttons, refusal, shown: "" });
    return li;
  }

  tickAsks(now) {
    for (const [id, rec] of this.asks) {
      const i = this.model.interactions.get(id);
      if (!i) continue;
      const left = (i.deadlineAt ?? now) - now;
      const text = formatCountdown(left);
      if (rec.shown !== text) {
        rec.countdown.textContent = text;
        rec.countdown.classList.toggle("urgent", left < 10_000);
        rec.bar.value = Math.max(0, left);
        rec.shown = text;
      }
    }
  }

  // --- calls being stopped ------------------------------------------------------------------

  renderStopping(touched, refilter = false) {
    const m = this.model;
    const body = this.$("stopping-body");
    for (const [key, rec] of this.stopRows) {
      if (!m.stopping.has(key)) {
        rec.tr.remove();
        this.stopRows.delete(key);
      }
    }
    for (const call of m.stopping.values()) {
      let rec = this.stopRows.get(call.key);
      if (!rec) {
        const stateEl = h("span", { class: "chip" });
        const sinceEl = h("span", { class: "elapsed" });
        const tr = h(
          "tr",
          { "data-key": call.key, "data-principal": call.principal ?? "" },
          h("td", {}, h("code", { text: call.callId })),
          h("td", { class: "principal", text: call.principal ?? "" }),
          h("td", { text: call.tool }),
          h("td", {}, h("code", { text: shortId(call.turnId, 10), title: call.turnId })),
          h("td", { text: outcomeText(call.outcome) }),
          h("td", {}, stateEl),
          h("td", {}, sinceEl),
        );
        rec = { tr, stateEl, sinceEl, shown: {} };
        this.stopRows.set(call.key, rec);
        body.prepend(tr);
      } else if (!touched.has(call.key) && !refilter) {
        continue;
      }
      const shows = m.shows(call.principal);
      if (rec.shown.shows !== shows) {
        rec.tr.hidden = !shows;
        rec.shown.shows = shows;
      }
      const state = call.abandoned ? "abandoned" : "stopping";
      const label = call.abandoned ? "abandoned: the server still works on it" : "stopping";
      if (rec.shown.state !== label) {
        rec.stateEl.textContent = label;
        rec.stateEl.className = `chip state-${state}`;
        rec.shown.state = label;
      }
    }
    this.$("stopping-empty").hidden = [...this.stopRows.values()].some((r) => !r.tr.hidden);
  }

  tickStopping(now) {
    for (const [key, rec] of this.stopRows) {
      const call = this.model.stopping.get(key);
      if (!call || call.endedAt === null) continue;
      const text = `${formatElapsed(Math.max(0, now - call.endedAt))} since its outcome`;
      if (rec.shown.since !== text) {
        rec.sinceEl.textContent = text;
        rec.shown.since = text;
      }
    }
  }

  // --- recent outcomes ----------------------------------------------------------------------

  renderRecent(added, touched, refilter = false) {
    const m = this.model;
    const body = this.$("recent-body");
    if (refilter) {
      for (const [key, rec] of this.recentRows) rec.tr.hidden = !m.shows(m.recentByKey.get(key)?.principal);
    }
    if (added > 0) {
      const fresh = m.recent.slice(-Math.min(added, m.recentLimit));
      const fragment = this.doc.createDocumentFragment();
      // Newest first.
      for (let i = fresh.length - 1; i >= 0; i -= 1) {
        const call = fresh[i];
        if (this.recentRows.has(call.key)) continue;
        const rec = this.makeRecent(call);
        this.recentRows.set(call.key, rec);
        fragment.append(rec.tr);
      }
      body.prepend(fragment);
      for (const [key, rec] of this.recentRows) {
        if (!m.recentByKey.has(key)) {
          rec.tr.remove();
          this.recentRows.delete(key);
        }
      }
    }
    if (added > 0 || refilter) {
      let any = false;
      for (const rec of this.recentRows.values()) if (!rec.tr.hidden) any = true;
      const empty = this.$("recent-empty");
      setText(empty, m.principalFilter ? `No call of ${m.principalFilter} has ended lately.` : "No call has ended yet.");
      empty.hidden = any;
    }
    for (const key of touched) {
      const rec = this.recentRows.get(key);
      const call = m.recentByKey.get(key);
      if (rec && call) this.updateRecent(rec, call);
    }
  }

  makeRecent(call) {
    const outcomeEl = h("span", { class: `chip out-${call.outcome?.status}` });
    const tagEl = h("span", { class: "tag" });
    const stopEl = h("span", { class: "stop" });
    const textEl = h("span", { class: "text" });
    const timelineEl = h("span", { class: "timeline" });
    const tr = h(
      "tr",
      { "data-key": call.key, "data-status": call.outcome?.status ?? "", "data-principal": call.principal ?? "", hidden: !this.model.shows(call.principal) },
      h("td", { class: "when", text: clockTime(call.endedAt) }),
      h("td", { class: "principal", text: call.principal ?? "" }),
      h("td", {}, h("span", { class: "tool", text: call.tool }), h("br"), h("code", { class: "ids", text: `${call.callId} · ${shortId(call.turnId, 10)}`, title: `call ${call.callId} of turn ${call.turnId}, session ${call.sessionId ?? "?"}` })),
      h("td", {}, tagEl, " ", outcomeEl),
      h("td", { class: "num duration" }),
      h("td", { class: "detail" }, textEl, h("br"), timelineEl, stopEl),
    );
    const rec = { tr, outcomeEl, tagEl, stopEl, textEl, timelineEl, durationEl: tr.children[4] };
    this.updateRecent(rec, call);
    return rec;
  }

  updateRecent(rec, call) {
    const o = call.outcome ?? {};
    setText(rec.tagEl, o.status === "ok" ? "" : outcomeTag(o.status));
    setText(rec.outcomeEl, outcomeText(o));
    setText(rec.durationEl, call.durationMs === null ? "" : formatDuration(call.durationMs));
    const extras = [];
    if (o.attempts > 1) extras.push(`${o.attempts} attempts`);
    if (o.provenance?.cache_hit) extras.push("from the cache");
    if (o.repeat_count) extras.push(`repeated ${o.repeat_count}×`);
    const line = firstLine(call.text);
    // A denial's detail (a rule's reason, a person's), unless the text's first line says it.
    const why = denialDetail(o, line);
    setText(rec.textEl, [line, why, ...extras].filter(Boolean).join(" · "));
    setText(rec.timelineEl, timelineText(call));
    let stop = "";
    if (call.stopping) stop = " · stopping…";
    else if (call.abandoned) stop = " · abandoned: the server still works on it";
    else if (call.stopHow === "unconfirmed") stop = " · stop not confirmed";
    setText(rec.stopEl, stop);
  }

  // --- servers and breakers -----------------------------------------------------------------

  renderServers() {
    const m = this.model;
    const body = this.$("servers-body");
    const backends = new Map();
    for (const [name, s] of m.servers) backends.set(name, { state: s.state, detail: s.detail, tools: 0, breakers: [] });
    for (const [tool, t] of m.tools) {
      const name = t.backend ?? "?";
      if (!backends.has(name)) backends.set(name, { state: t.state ?? "up", detail: null, tools: 0, breakers: [] });
      const b = backends.get(name);
      b.tools += 1;
      if (t.breaker && t.breaker !== "closed") b.breakers.push(`${tool}: ${t.breaker.replace("_", "-")}`);
    }
    const rows = [...backends.entries()].sort(([a], [b]) => a.localeCompare(b));
    body.replaceChildren(
      ...rows.map(([name, b]) =>
        h(
          "tr",
          { "data-server": name },
          h("th", { scope: "row", text: name }),
          h("td", {}, h("span", { class: `chip server-${b.state}`, text: b.state }), b.detail ? h("span", { class: "detail", text: ` ${b.detail}` }) : null),
          h("td", { class: "num", text: String(b.tools) }),
          h("td", { class: b.breakers.length ? "breakers open" : "breakers", text: b.breakers.length ? b.breakers.join(", ") : "all closed" }),
        ),
      ),
    );
    this.$("servers-empty").hidden = rows.length > 0;
  }

  // --- tools and their pinned definitions ---------------------------------------------------

  /**
   * The tools whose definition changed since it was pinned, each a card with its badge, what it
   * means, its diff (a press away) and Accept; and the table of every tool, changed ones marked.
   */
  renderTools() {
    const m = this.model;
    const list = this.$("tool-changes");
    if (!list) return;
    const changed = m.changedTools();
    const mayAccept = m.mayAccept();
    const names = new Set(changed.map((t) => t.name));
    for (const [name, rec] of this.toolCards) {
      const t = m.tools.get(name);
      if (names.has(name) && rec.key === changeKey(t.changed)) continue;
      // Accepted, or changed again (another diff): the card goes (and is made anew).
      this.keepFocusOffCard(rec.li);
      rec.li.remove();
      this.toolCards.delete(name);
    }
    changed.forEach((t, i) => {
      let rec = this.toolCards.get(t.name);
      if (!rec) {
        rec = this.makeToolCard(t);
        this.toolCards.set(t.name, rec);
        // A change that arrives while the page is open is said; the ones there when it opened are not.
        if (this.toolsDrawn) {
          this.announce?.(`Tool ${t.name} changed its definition${t.changed.blocked ? ": its calls are held until someone accepts it" : ""}`);
        }
      }
      if (list.children[i] !== rec.li) list.insertBefore(rec.li, list.children[i] ?? null);
      const busy = m.toolsAccepting.has(t.name);
      if (rec.shown.busy !== busy) {
        setBusy(rec.accept, busy);
        rec.accept.textContent = busy ? "Accepting…" : "Accept";
        rec.shown.busy = busy;
      }
      if (rec.shown.mayAccept !== mayAccept) {
        if (!mayAccept && this.doc.activeElement === rec.accept) rec.toggle.focus();
        rec.accept.hidden = !mayAccept;
        rec.refusal.hidden = mayAccept;
        rec.shown.mayAccept = mayAccept;
      }
    });
    this.$("tool-changes-empty").hidden = changed.length > 0;
    if (m.tools.size > 0) this.toolsDrawn = true;
    setText(this.$("tools-count"), changed.length > 0 ? `(${changed.length} changed)` : "");

    const error = this.$("tools-error");
    const message = m.acceptError ? m.acceptError.message : "";
    setText(error, message);
    error.hidden = !message;

    // The table of every tool: drawn again only when what it shows changed.
    const all = [...m.tools.entries()].sort(([a], [b]) => a.localeCompare(b));
    const signature = all.map(([name, t]) => `${name}\t${t.backend}\t${changeKey(t.changed)}`).join("\n");
    if (signature !== this.toolsShown) {
      this.toolsShown = signature;
      this.$("tools-body").replaceChildren(
        ...all.map(([name, t]) =>
          h(
            "tr",
            { "data-tool": name },
            h("th", { scope: "row" }, h("code", { text: name })),
            h("td", { class: "backend", text: t.backend ?? "" }),
            h("td", {}, t.changed ? pinBadge(name, t.changed) : h("span", { class: "muted", text: "—" })),
          ),
        ),
      );
      setText(this.$("tools-all-summary"), `All tools (${all.length})`);
    }
  }

  makeToolCard(t) {
    const c = t.changed;
    const id = `tool-diff-${(this.ids += 1)}`;
    const key = changeKey(c);
    const open = this.openDiffs.has(`${t.name}\n${c.new_digest}`);
    const diff = h(
      "pre",
      { class: "diff", id, tabindex: "0", "aria-label": `Diff of the definition of ${t.name}, from the pinned one to the one listed now`, hidden: !open },
      ...diffLines(c.diff).map((line) => h("span", { class: `dl dl-${line.kind}`, text: line.text })),
    );
    const toggle = h(
      "button",
      {
        type: "button",
        class: "show-diff",
        "data-action": "toggle-diff",
        "data-tool": t.name,
        "aria-expanded": open ? "true" : "false",
        "aria-controls": id,
        "aria-label": `Diff of ${t.name}`,
      },
      h("span", { "aria-hidden": "true", class: "arrow", text: "▸" }),
      " Diff",
    );
    const accept = h("button", {
      type: "button",
      class: "approve",
      "data-action": "accept-tool",
      "data-tool": t.name,
      "data-digest": c.new_digest,
      "aria-label": `Accept the new definition of ${t.name}`,
      text: "Accept",
    });
    const refusal = h("p", { class: "refusal", text: "Accepting needs the admin scope, which you do not hold.", hidden: true });
    const what = c.blocked
      ? "Its calls are denied until someone accepts the new definition."
      : "Its calls still run (on_tool_change = \"warn\"); Accept pins the new definition.";
    const li = h(
      "li",
      { class: `tool-change ${c.blocked ? "blocked" : "warn"}`, "data-tool": t.name },
      h("div", { class: "tc-head" }, h("code", { class: "tool", text: t.name }), " ", pinBadge(t.name, c)),
      h(
        "p",
        { class: "meta" },
        `Server ${c.server} lists a definition other than the pinned one: `,
        h("code", { title: c.old_digest, text: shortDigest(c.old_digest) }),
        " → ",
        h("code", { title: c.new_digest, text: shortDigest(c.new_digest) }),
        `. ${what}`,
      ),
      h("div", { class: "buttons" }, toggle, accept),
      refusal,
      diff,
    );
    return { li, key, toggle, accept, refusal, diff, shown: {} };
  }

  /** Shows or hides the diff of a changed tool's definition. */
  toggleDiff(tool) {
    const rec = this.toolCards.get(tool);
    const change = this.model.tools.get(tool)?.changed;
    if (!rec || !change) return;
    const open = rec.diff.hidden;
    rec.diff.hidden = !open;
    rec.toggle.setAttribute("aria-expanded", open ? "true" : "false");
    const key = `${tool}\n${change.new_digest}`;
    if (open) this.openDiffs.add(key);
    else this.openDiffs.delete(key);
  }

  /** A card about to go with the focus inside it: the focus goes to the next card's first button, or the panel's heading. */
  keepFocusOffCard(li) {
    const active = this.doc.activeElement;
    if (!active || !li.contains(active)) return;
    const next = li.nextElementSibling ?? li.previousElementSibling;
    (next?.querySelector("button:not([hidden])") ?? this.$("tools-heading"))?.focus();
  }

  /** What happened to tools' pinned definitions, newest first. */
  renderPinLog() {
    const log = this.model.pinLog;
    const list = this.$("pin-log");
    if (!list) return;
    const now = this.model.serverNow();
    list.replaceChildren(
      ...log
        .slice()
        .reverse()
        .map((e) => {
          const kind = e.type === "tool_changed" ? `changed-${e.action ?? "warn"}` : "accepted";
          return h(
            "li",
            { class: `pin-ev pin-ev-${kind}`, "data-type": e.type, "data-tool": e.tool },
            h("time", { datetime: e.ts ?? "", title: preciseTime(e.at), text: dateTime(e.at, now) }),
            " ",
            h("span", { class: "text", text: e.text }),
          );
        }),
    );
    list.hidden = log.length === 0;
    this.$("pin-log-empty").hidden = log.length > 0;
  }

  // --- replicas -----------------------------------------------------------------------------

  /**
   * The replicas sharing the audit trail, one row each in the server's order (by id): the
   * replica (the one answering marked), its state as a badge, how long ago it last renewed its
   * lease, the lease, and for a dead one which survivor took it over and how many of its calls
   * it recorded as interrupted. The whole panel hides unless the trail is shared.
   */
  renderReplicas(now) {
    const section = this.$("replicas-section");
    if (!section) return;
    const { shown, list, error } = this.model.replicas;
    // Nothing in it takes the focus: it can come and go without moving anyone's.
    if (section.hidden === shown) section.hidden = !shown;
    const errorEl = this.$("replicas-error");
    const message = shown && error ? error : "";
    setText(errorEl, message);
    errorEl.hidden = !message;
    if (!shown) {
      this.$("replicas-body").replaceChildren();
      this.replicaRows.clear();
      this.replicasDrawn = false;
      return;
    }
    const body = this.$("replicas-body");
    const seen = new Set();
    list.forEach((r, i) => {
      seen.add(r.replica);
      let rec = this.replicaRows.get(r.replica);
      if (!rec) {
        rec = this.makeReplicaRow(r);
        this.replicaRows.set(r.replica, rec);
      }
      if (body.children[i] !== rec.tr) body.insertBefore(rec.tr, body.children[i] ?? null);
      const before = rec.shown.state;
      this.updateReplicaRow(rec, r, now);
      // A replica that dies while the page is open is said; the dead ones there when it opened are not.
      if (this.replicasDrawn && r.state === "dead" && before !== undefined && before !== "dead") {
        this.announce?.(`Replica ${r.replica} is dead: ${takeoverText(r)}`);
      }
    });
    for (const [id, rec] of this.replicaRows) {
      if (seen.has(id)) continue;
      rec.tr.remove();
      this.replicaRows.delete(id);
    }
    this.replicasDrawn = true;
    const dead = list.filter((r) => r.state === "dead").length;
    const late = list.filter((r) => r.state === "late").length;
    const counts = [dead ? `${dead} dead` : "", late ? `${late} late` : ""].filter(Boolean).join(", ");
    setText(this.$("replicas-count"), counts ? `(${counts})` : "");
  }

  makeReplicaRow(r) {
    const idEl = h("code", { class: "replica-id" });
    const thisEl = h("span", { class: "chip replica-this", title: "The replica this page talks to", text: "this replica", hidden: true });
    const nameEl = h("span", { class: "replica-name" });
    const stateEl = h("span", { class: "chip replica-state" });
    const takeoverEl = h("span", { class: "replica-takeover" });
    const stoppedEl = h("span", { class: "replica-stopped-at" });
    const heartbeatEl = h("time", { class: "replica-heartbeat" });
    const leaseEl = h("td", { class: "num replica-lease" });
    const head = h("th", { scope: "row" }, idEl, " ", thisEl, nameEl);
    const tr = h(
      "tr",
      { "data-replica": r.replica },
      head,
      h("td", { class: "replica-state-cell" }, stateEl, takeoverEl, stoppedEl),
      h("td", {}, heartbeatEl),
      leaseEl,
    );
    return { tr, head, idEl, thisEl, nameEl, stateEl, takeoverEl, stoppedEl, heartbeatEl, leaseEl, shown: {} };
  }

  updateReplicaRow(rec, r, now) {
    const shown = rec.shown;
    const state = String(r.state ?? "?");
    setText(rec.idEl, r.replica);
    const isThis = r.this === true;
    if (shown.this !== isThis) {
      rec.thisEl.hidden = !isThis;
      rec.tr.classList.toggle("replica-this-row", isThis);
      shown.this = isThis;
    }
    // Its name among replicas on Redis, when it has one other than its id.
    const name = typeof r.name === "string" && r.name !== r.replica ? r.name : "";
    setText(rec.nameEl, name);
    rec.nameEl.hidden = !name;
    const started = Date.parse(r.started_at ?? "");
    const headTitle = [
      Number.isFinite(started) ? `started ${dateTime(started, now)}` : "",
      r.generation != null ? `generation ${r.generation}` : "",
    ]
      .filter(Boolean)
      .join(", ");
    if (rec.head.title !== headTitle) rec.head.title = headTitle;
    if (shown.state !== state) {
      setText(rec.stateEl, state);
      rec.stateEl.className = `chip replica-state replica-${state}`;
      rec.stateEl.title = replicaStateTitle(state);
      rec.tr.dataset.state = state;
      shown.state = state;
    }
    const takeover = takeoverText(r);
    setText(rec.takeoverEl, takeover);
    rec.takeoverEl.hidden = !takeover;
    const deadAt = Date.parse(r.dead_at ?? "");
    const takeoverTitle = Number.isFinite(deadAt) ? `declared dead at ${preciseTime(deadAt)}` : "";
    if (rec.takeoverEl.title !== takeoverTitle) rec.takeoverEl.title = takeoverTitle;
    const stoppedAt = state === "stopped" ? Date.parse(r.stopped_at ?? "") : Number.NaN;
    const stopped = Number.isFinite(stoppedAt) ? `at ${dateTime(stoppedAt, now)}` : "";
    setText(rec.stoppedEl, stopped);
    rec.stoppedEl.hidden = !stopped;
    const heartbeat = Date.parse(r.heartbeat_at ?? "");
    if (rec.heartbeatEl.getAttribute("datetime") !== (r.heartbeat_at ?? "")) {
      rec.heartbeatEl.setAttribute("datetime", r.heartbeat_at ?? "");
      rec.heartbeatEl.title = Number.isFinite(heartbeat) ? dateTime(heartbeat, now) + preciseTime(heartbeat).slice(8) : "";
    }
    setText(rec.heartbeatEl, Number.isFinite(heartbeat) ? agoText(Math.max(0, now - heartbeat)) : "—");
    setText(rec.leaseEl, leaseText(r.lease_ms));
  }

  // --- header -------------------------------------------------------------------------------

  renderSummary() {
    const c = this.model.counts();
    setText(this.$("count-running"), String(c.running));
    setText(this.$("count-asks"), String(c.interactions));
    setText(this.$("count-stopping"), String(c.stopping));
    setText(this.$("running-count"), c.running || c.waitingApproval ? `(${c.running + c.waitingApproval})` : "");
    setText(this.$("asks-count"), c.interactions ? `(${c.interactions})` : "");
    this.doc.title = c.interactions > 0 ? `(${c.interactions}) toolwarden` : "toolwarden";
  }

  /** Who the page is, discreetly in the header. */
  renderMe() {
    const el = this.$("who");
    const who = whoText(this.model.me);
    el.hidden = !who;
    if (!who) return;
    setText(el, who.text);
    el.title = who.title;
  }

  /**
   * The live view's principal filter: everyone, or one of the principals seen. Shown only to a
   * principal that sees others' work (`read`); without it, everything shown is its own.
   */
  renderPrincipalFilter() {
    const m = this.model;
    const label = this.$("principal-filter-label");
    const select = this.$("principal-filter");
    if (!label || !select) return;
    const show = seesOthers(m.me);
    label.hidden = !show;
    const names = m.principals();
    if (m.principalFilter && !names.includes(m.principalFilter)) names.push(m.principalFilter);
    const want = ["", ...names];
    const have = [...select.options].map((o) => o.value);
    if (want.join("\n") !== have.join("\n") || select.dataset.me !== (m.me?.principal ?? "")) {
      select.replaceChildren(
        h("option", { value: "", text: "everyone" }),
        ...names.map((name) => h("option", { value: name, text: name === m.me?.principal ? `${name} (you)` : name })),
      );
      select.dataset.me = m.me?.principal ?? "";
    }
    if (select.value !== (m.principalFilter ?? "")) select.value = m.principalFilter ?? "";
  }

  setConnection(status) {
    const el = this.$("conn");
    const words = {
      connecting: "connecting…",
      live: "live",
      reconnecting: `reconnecting in ${Math.ceil((status.inMs ?? 0) / 1000)} s`,
      unauthorized: "token needed",
      error: status.message ?? "error",
    }[status.state] ?? status.state;
    setText(el, words);
    el.dataset.state = status.state;
    if (status.message && status.state === "reconnecting") el.title = status.message;
  }
}

/**
 * Marks a button as working on its action. Not `disabled`: a disabled button drops the focus of
 * the keyboard user who just pressed it; this one keeps it and ignores further presses.
 */
export function setBusy(button, busy) {
  if (busy) button.setAttribute("aria-disabled", "true");
  else button.removeAttribute("aria-disabled");
}

/** Tells a change apart from another of the same tool (a change is redrawn when it changed). */
function changeKey(c) {
  return c ? `${c.server}\n${c.old_digest}\n${c.new_digest}\n${c.blocked}` : "";
}

/** The badge of a tool whose definition changed: red when its calls are held, yellow when they still run. */
export function pinBadge(tool, c) {
  const title = c.blocked
    ? `Server ${c.server} changed the definition of ${tool} since it was pinned. Its calls are held (denied by pin, tool_changed) until someone with the admin scope accepts the new definition (on_tool_change = "block").`
    : `Server ${c.server} changed the definition of ${tool} since it was pinned. Its calls still run (on_tool_change = "warn"); accepting the new definition pins it.`;
  return h("span", { class: `chip pin-badge pin-${c.blocked ? "blocked" : "warn"}`, title, text: c.blocked ? "changed · blocked" : "changed" });
}

function kindWord(kind) {
  return { approval: "Approval", confirm: "Confirmation", password: "Secret", device_code: "Device login" }[kind] ?? kind;
}

/** A call's life on one line: start, progress, retries, timeout, result, stop. */
export function timelineText(call) {
  const parts = [];
  for (const step of call.timeline) {
    if (step.kind === "result") {
      if (call.progressCount > 0) parts.push(`progress ×${call.progressCount}`);
      parts.push(`${outcomeText(call.outcome)}${call.durationMs !== null ? ` after ${formatDuration(call.durationMs)}` : ""}`);
    } else {
      parts.push(step.kind === "start" ? `start ${clockTime(step.at)}` : step.text);
    }
  }
  return parts.join(" → ");
}
