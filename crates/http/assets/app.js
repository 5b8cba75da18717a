// The dashboard's entry point: wires the event stream, the API's snapshots and the person's
// buttons to the model, and renders at most once per animation frame.
//
// Where the data comes from:
// - `GET /v1/events` (sse.js), from the first event the server still keeps, then live; after a
//   dropped connection it resumes with Last-Event-ID, so what happened meanwhile is replayed;
// - snapshots of what is true now (`/v1/turns/active`, `/v1/interactions`, `/v1/tools`,
//   `/healthz`) when the page opens and whenever the stream says events were lost; the tools
//   again when a server (re)starts or a tool's pinned definition changes or is accepted;
// - who the page is (`/v1/me`: its principal and scopes) each time a stream opens, so after a
//   token is entered: the header names it, and Cancel buttons the server would refuse (other
//   principals' work, without `abort`) are not offered, nor Accept without `admin`;
// - the replicas sharing the audit trail (`/v1/replicas`) after `/v1/me`, then every 2 s while
//   the trail is shared and the principal holds `read` (the panel hides otherwise);
// - the audit history (audit.js) reads `/v1/audit/calls` when asked, and learns from the stream
//   only which of the calls it shows as running have ended since.

import { Api, ApiError } from "./api.js";
import { AuditHistory } from "./audit.js";
import { callKey, Model, seesOthers } from "./model.js";
import { EventStream } from "./sse.js";
import { outcomeText } from "./format.js";
import { setBusy, View } from "./view.js";

const model = new Model();

// --- announcements for screen readers -------------------------------------------------------

const announcer = document.getElementById("announcer");
let pending = [];
let announceTimer = null;
/** Says `text` through the polite live region; messages within 300 ms are read together. */
function announce(text) {
  pending.push(text);
  if (announceTimer) return;
  announceTimer = setTimeout(() => {
    const all = pending.length > 4 ? [...pending.slice(0, 3), `and ${pending.length - 3} more`] : pending;
    announcer.textContent = all.join(". ");
    pending = [];
    announceTimer = null;
  }, 300);
}

// --- the token ------------------------------------------------------------------------------

const dialog = document.getElementById("token-dialog");
const tokenForm = document.getElementById("token-form");
const tokenInput = document.getElementById("token-input");
let tokenResolve = null;

function promptToken(refused) {
  document.getElementById("token-refused").hidden = !refused;
  tokenInput.value = "";
  if (!dialog.open) dialog.showModal();
  tokenInput.focus();
  return new Promise((resolve) => {
    tokenResolve = resolve;
  });
}

tokenForm.addEventListener("submit", (event) => {
  event.preventDefault();
  const token = tokenInput.value.trim();
  if (!token) return;
  dialog.close();
  tokenInput.value = "";
  tokenResolve?.(token);
  tokenResolve = null;
});
// Without a token nothing on the page can work: Escape does not dismiss the question.
dialog.addEventListener("cancel", (event) => event.preventDefault());

// Every answer's `Date` bounds the clock offset, so that elapsed times tick right from the first
// snapshot on, even while the stream replays old events (model.js, "clocks").
const api = new Api({ promptToken, onServerDate: (at) => model.observeClock(at) });

// --- rendering, batched per frame -----------------------------------------------------------

const view = new View({ model, announce });
let frameRequested = false;
function requestFrame() {
  if (frameRequested) return;
  frameRequested = true;
  requestAnimationFrame(frame);
}
function frame() {
  frameRequested = false;
  view.render();
  if (view.ticking()) requestFrame();
}
view.requestFrame = requestFrame;

// --- snapshots ------------------------------------------------------------------------------

let resyncRunning = null;
let resyncAgain = false;
/** The `GET /v1/tools` requests asked and the newest applied: an older answer that arrives late is dropped. */
let toolsAsked = 0;
let toolsApplied = 0;

function applyTools(ask, answer) {
  if (ask < toolsApplied) return;
  toolsApplied = ask;
  model.applyTools(answer?.tools ?? []);
}

/** Reads what is true now and merges it into the model (one at a time; one more if asked meanwhile). */
function resync() {
  if (resyncRunning) {
    resyncAgain = true;
    return resyncRunning;
  }
  resyncRunning = (async () => {
    do {
      resyncAgain = false;
      const seq = model.lastSeq;
      const toolsAsk = (toolsAsked += 1);
      const results = await Promise.allSettled([
        api.get("/v1/turns/active"),
        api.get("/v1/interactions"),
        api.get("/v1/tools"),
        api.get("/healthz"),
      ]);
      const [active, interactions, tools, health] = results.map((r) => (r.status === "fulfilled" ? r.value : null));
      if (active) model.applyActive(active.turns ?? [], seq);
      if (interactions) model.applyInteractions(interactions.interactions ?? [], seq);
      if (tools) applyTools(toolsAsk, tools);
      if (health) model.applyServers(health.servers);
      requestFrame();
      if (results.some((r) => r.status === "rejected")) {
        // Most likely the connection is down too; the stream's reconnect will ask again.
        resyncAgain = false;
        break;
      }
    } while (resyncAgain);
  })().finally(() => {
    resyncRunning = null;
  });
  return resyncRunning;
}

// --- who the page is -----------------------------------------------------------------------

let meLoading = null;

/** Reads `GET /v1/me` (once at a time): the principal the token names, and its scopes. */
function loadMe() {
  if (meLoading) return meLoading;
  meLoading = api
    .get("/v1/me")
    .then(
      (me) => {
        model.setMe(me);
        audit.setSeesOthers(seesOthers(model.me));
      },
      (e) => {
        // A server from before principals has no /v1/me: every button stays, the server decides.
        if (e instanceof ApiError && e.status === 404) model.setMe(null);
      },
    )
    .finally(() => {
      meLoading = null;
      requestFrame();
    });
  return meLoading;
}

// --- the replicas --------------------------------------------------------------------------

/** How often the replicas are read again while their panel shows: heartbeats move. */
const REPLICAS_EVERY_MS = 2000;
let replicasTimer = null;
let replicasLoading = null;
/** A read came due while the tab was in the background: it is made when the tab shows again. */
let replicasDue = false;

/**
 * Reads `GET /v1/replicas` (once at a time), and again every REPLICAS_EVERY_MS while the panel
 * shows. A trail of one process (`"shared": false`), a principal without `read` (known from
 * `/v1/me`, or a 403) and a server without the endpoint (404) hide the panel and stop the
 * reading until the next stream opens.
 */
function loadReplicas() {
  if (replicasLoading) return replicasLoading;
  clearTimeout(replicasTimer);
  replicasTimer = null;
  replicasDue = false;
  if (!model.mayReadReplicas()) {
    model.hideReplicas();
    requestFrame();
    return Promise.resolve();
  }
  replicasLoading = api
    .get("/v1/replicas")
    .then(
      (answer) => {
        model.applyReplicas(answer);
        return model.replicas.shown;
      },
      (e) => {
        if (e instanceof ApiError && (e.status === 403 || e.status === 404)) {
          model.hideReplicas();
          return false;
        }
        // 503: the shared trail's database did not answer. Anything else (the connection is
        // down): the panel keeps what it showed, says why, and reads again.
        const shared = e instanceof ApiError && e.status === 503;
        if (!shared && !model.replicas.shown) return false;
        model.setReplicasError(`The replicas could not be read: ${e.message}`, { show: shared });
        return true;
      },
    )
    .then((again) => {
      if (again) replicasTimer = setTimeout(replicasTick, REPLICAS_EVERY_MS);
    })
    .finally(() => {
      replicasLoading = null;
      requestFrame();
    });
  return replicasLoading;
}

function replicasTick() {
  replicasTimer = null;
  if (document.hidden) replicasDue = true;
  else loadReplicas();
}

document.addEventListener("visibilitychange", () => {
  if (!document.hidden && replicasDue) loadReplicas();
});

// --- the live view's principal filter -------------------------------------------------------

const principalFilter = document.getElementById("principal-filter");
principalFilter.addEventListener("change", () => {
  model.setPrincipalFilter(principalFilter.value);
  requestFrame();
  announce(principalFilter.value ? `Showing the calls of ${principalFilter.value}` : "Showing everyone's calls");
});

// --- the event stream -----------------------------------------------------------------------

let wasLive = false;
let opened = false;
let toolsRefresh = null;

const stream = new EventStream({
  api,
  startAfter: "0",
  onEvent(ev) {
    if (ev.type === "lost") {
      onLost(ev);
      return;
    }
    model.apply(ev);
    afterEvent(ev);
    requestFrame();
  },
  onStatus(status) {
    view.setConnection(status);
    if (status.state === "live" && !wasLive && opened) announce("Events: live again");
    if (status.state === "reconnecting" && wasLive) announce("Events: connection lost, reconnecting");
    if (status.state === "live") wasLive = true;
    else if (status.state === "reconnecting" || status.state === "error") wasLive = false;
  },
  onOpen() {
    // The first stream asks for every event the server still keeps, later ones resume where the
    // last one stopped: the replay brings what happened meanwhile, outcomes included. A snapshot
    // of what runs now goes with each, because the replay cannot tell everything: a server that
    // restarted in between may number its events past the id the page resumes from.
    // The replicas after /v1/me: a principal without `read` is not even asked for them.
    loadMe().then(loadReplicas);
    resync();
    opened = true;
  },
});

function onLost(ev) {
  if (ev.reason === "unknown_seq") {
    // The server restarted: its sequence began again, and what the page knew of running work
    // belongs to the previous process.
    model.resetLive();
    announce("The server restarted");
  }
  resync();
}

/** What an event means to the person beyond the model: their own actions' results. */
function afterEvent(ev) {
  if (ev.type === "tool_result" && ev.turn_id && ev.call_id) {
    const call = model.recentByKey.get(callKey(ev.turn_id, ev.call_id));
    if (call?.cancelRequested) announce(`Call ${call.callId} (${call.tool}) ended ${outcomeText(call.outcome)}`);
    audit.noteEnded(ev.turn_id, ev.call_id);
  } else if (ev.type === "server_state") {
    // A server that (re)started may list other tools.
    refreshTools(500);
  } else if (ev.type === "tool_changed" || ev.type === "tool_accepted") {
    // A definition changed, or a change was accepted (here, elsewhere, or on another replica):
    // the badges, diffs and Accept buttons follow what the server lists now.
    refreshTools(150);
  }
}

/** Reads `GET /v1/tools` again after `delay` ms (a burst of events asks once); resolves when it did. */
let toolsWaiting = [];
function refreshTools(delay = 0) {
  clearTimeout(toolsRefresh);
  const done = new Promise((resolve) => toolsWaiting.push(resolve));
  toolsRefresh = setTimeout(() => {
    const waiting = toolsWaiting;
    toolsWaiting = [];
    const ask = (toolsAsked += 1);
    api.get("/v1/tools").then(
      (t) => {
        applyTools(ask, t);
        requestFrame();
      },
      () => {},
    ).finally(() => {
      for (const resolve of waiting) resolve();
    });
  }, delay);
  return done;
}

// --- buttons --------------------------------------------------------------------------------

document.addEventListener("click", (event) => {
  const button = event.target instanceof Element ? event.target.closest("button[data-action]") : null;
  if (!button || button.getAttribute("aria-disabled") === "true") return;
  const action = button.dataset.action;
  if (action === "cancel-call") cancelCall(button.dataset.turn, button.dataset.call);
  else if (action === "cancel-turn") cancelTurn(button.dataset.turn);
  else if (action === "approve" || action === "deny") answer(button.dataset.id, action, button);
  else if (action === "toggle-diff") view.toggleDiff(button.dataset.tool);
  else if (action === "accept-tool") acceptTool(button.dataset.tool, button.dataset.digest);
});

/**
 * Accepts a tool's changed definition (`POST /v1/tools/{name}/accept`, scope `admin`): the one
 * shown (`digest`), not another the server may have listed since.
 */
async function acceptTool(name, digest) {
  if (!name || model.toolsAccepting.has(name)) return;
  model.setAccepting(name, true);
  model.setAcceptError(null);
  requestFrame();
  try {
    const query = digest ? `?digest=${encodeURIComponent(digest)}` : "";
    const r = await api.post(`/v1/tools/${encodeURIComponent(name)}/accept${query}`);
    announce(`Accepted the new definition of ${name}${r?.server ? ` (server ${r.server})` : ""}`);
  } catch (e) {
    let message;
    if (e instanceof ApiError && e.status === 409 && /changed again/.test(e.message)) message = `${name} changed again since its diff was shown: review the new diff before accepting.`;
    else if (e instanceof ApiError && e.status === 409) message = `Nothing waits to be accepted for ${name} any more (it was accepted, or its server listed the pinned definition again).`;
    else if (e instanceof ApiError && e.status === 403) message = `Could not accept ${name}: accepting needs the admin scope (${e.message}).`;
    else if (e instanceof ApiError && e.status === 404) message = `Could not accept ${name}: the server knows no such tool (${e.message}).`;
    else message = `Could not accept ${name}: ${e.message}`;
    model.setAcceptError({ tool: name, message });
    announce(message);
  } finally {
    model.setAccepting(name, false);
    requestFrame();
  }
  // What the server lists now: the change gone (or, after a refusal, still there).
  await refreshTools(0);
}

async function cancelCall(turnId, callId) {
  const call = model.calls.get(callKey(turnId, callId));
  if (call) {
    call.cancelRequested = true;
    model.touch(call);
    requestFrame();
  }
  try {
    await api.post(`/v1/turns/${encodeURIComponent(turnId)}/calls/${encodeURIComponent(callId)}/abort`);
  } catch (e) {
    if (call) {
      call.cancelRequested = false;
      model.touch(call);
      requestFrame();
    }
    announce(e instanceof ApiError && e.status === 404 ? `Call ${callId} had already ended` : `Could not cancel call ${callId}: ${e.message}`);
  }
}

async function cancelTurn(turnId) {
  const turn = model.turns.get(turnId);
  if (turn) {
    turn.cancelRequested = true;
    model.dirty.turns.add(turnId);
    requestFrame();
  }
  try {
    await api.post(`/v1/turns/${encodeURIComponent(turnId)}/abort`);
    announce(`Turn ${turnId} cancelled`);
  } catch (e) {
    if (turn) {
      turn.cancelRequested = false;
      model.dirty.turns.add(turnId);
      requestFrame();
    }
    announce(e instanceof ApiError && e.status === 404 ? `Turn ${turnId} had already ended` : `Could not cancel turn ${turnId}: ${e.message}`);
  }
}

async function answer(id, action, button) {
  const item = button.closest(".ask");
  const buttons = item ? [...item.querySelectorAll("button")] : [button];
  const interaction = model.interactions.get(id);
  const body = { action };
  if (action === "approve" && interaction?.kind === "password") {
    const secret = item?.querySelector("input.secret")?.value ?? "";
    if (!secret) {
      item?.querySelector("input.secret")?.focus();
      announce("Enter the secret first");
      return;
    }
    body.value = secret;
  }
  for (const b of buttons) setBusy(b, true);
  try {
    await api.post(`/v1/interactions/${encodeURIComponent(id)}`, body);
    announce(`${action === "approve" ? "Approved" : "Denied"}: ${interaction?.tool ?? interaction?.kind ?? id}`);
  } catch (e) {
    for (const b of buttons) setBusy(b, false);
    announce(e instanceof ApiError && e.status === 404 ? "That question is no longer pending" : `Could not answer: ${e.message}`);
  }
}

// --- the audit history ----------------------------------------------------------------------

const audit = new AuditHistory({
  api,
  section: document.getElementById("audit-section"),
  // The server's clock, for how long a running call has run so far.
  serverNow: () => model.serverNow(),
  toolNames: () => model.tools.keys(),
  principalNames: () => model.principals(),
  hasEnded: (turnId, callId) => Boolean(model.recentByKey.get(callKey(turnId, callId))?.outcome),
});

// --- start ----------------------------------------------------------------------------------

// For a person debugging the page from the browser's console (and for the browser tests).
window.toolwardenDashboard = { model, view, stream, resync, audit, loadReplicas };

stream.start();
audit.mount();
requestFrame();
