// The live event stream, read with fetch() instead of EventSource: EventSource cannot send an
// Authorization header, and a token in the URL would end up in logs and history. So this module
// parses the text/event-stream framing itself, keeps the last event id, and reconnects with
// Last-Event-ID so that nothing is missed while the connection was down.

/**
 * Parses text/event-stream incrementally (the WHATWG framing: `field: value` lines, a blank line
 * ends an event, `:` starts a comment; lines end with \n, \r\n or \r). Feed it text as it
 * arrives; it calls `onEvent({id, event, data})` for each complete event, `id` being null when
 * the event had no `id:` line.
 */
export class SseParser {
  constructor(onEvent) {
    this.onEvent = onEvent;
    this.buffer = "";
    this.afterCR = false;
    this.reset();
  }

  reset() {
    this.data = [];
    this.event = "";
    this.id = null;
  }

  feed(text) {
    // A \r ends a line at once; a \n right after it (maybe in the next chunk) belongs to it.
    if (this.afterCR && text.startsWith("\n")) text = text.slice(1);
    this.afterCR = false;
    this.buffer += text;
    let start = 0;
    for (;;) {
      const cr = this.buffer.indexOf("\r", start);
      const lf = this.buffer.indexOf("\n", start);
      if (cr === -1 && lf === -1) break;
      let end;
      let next;
      if (cr !== -1 && (lf === -1 || cr < lf)) {
        end = cr;
        if (cr + 1 < this.buffer.length) next = this.buffer[cr + 1] === "\n" ? cr + 2 : cr + 1;
        else {
          next = cr + 1;
          this.afterCR = true;
        }
      } else {
        end = lf;
        next = lf + 1;
      }
      this.line(this.buffer.slice(start, end));
      start = next;
    }
    this.buffer = this.buffer.slice(start);
  }

  line(line) {
    if (line === "") {
      if (this.data.length > 0) {
        this.onEvent({ id: this.id, event: this.event || "message", data: this.data.join("\n") });
      }
      this.reset();
      return;
    }
    if (line.startsWith(":")) return;
    const colon = line.indexOf(":");
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") this.data.push(value);
    else if (field === "event") this.event = value;
    else if (field === "id" && !value.includes("\0")) this.id = value;
  }
}

/** Reconnect delays: 0.5 s doubling to 10 s, with jitter so many tabs do not come back at once. */
export function reconnectDelay(failures) {
  const base = Math.min(10_000, 500 * 2 ** Math.min(failures, 5));
  return Math.round(base / 2 + Math.random() * (base / 2));
}

/**
 * `GET /v1/events`, kept open. Calls:
 * - `onEvent(parsed, raw)` for every event (`lost` notices included), in order;
 * - `onStatus({state, ...})` when the connection changes: `connecting`, `live`,
 *   `reconnecting` (with `inMs` and `failures`), `unauthorized`, `error` (with `message`);
 * - `onOpen({resumed})` each time a stream opens (`resumed`: it was asked to resume).
 *
 * `lastEventId` starts at `startAfter` (0 replays every event the server still keeps, so the
 * page shows recent outcomes and calls still being stopped at once) and follows the `id:` of
 * each event; a `lost` notice has none, so it never moves it.
 */
export class EventStream {
  constructor({ api, path = "/v1/events", startAfter = "0", onEvent, onStatus, onOpen, idleLimitMs = 40_000 }) {
    this.api = api;
    this.path = path;
    this.lastEventId = startAfter;
    this.onEvent = onEvent;
    this.onStatus = onStatus ?? (() => {});
    this.onOpen = onOpen ?? (() => {});
    this.idleLimitMs = idleLimitMs;
    this.failures = 0;
    this.stopped = false;
    this.controller = null;
  }

  start() {
    this.stopped = false;
    this.loop();
  }

  stop() {
    this.stopped = true;
    this.controller?.abort();
  }

  async loop() {
    while (!this.stopped) {
      const openedAt = Date.now();
      let outcome;
      try {
        outcome = await this.once();
      } catch (e) {
        outcome = { kind: "error", message: e?.message ?? String(e) };
      }
      if (this.stopped) return;
      // A stream that stayed up a while was healthy: start the backoff over.
      if (Date.now() - openedAt > 10_000) this.failures = 0;
      if (outcome.kind === "unauthorized") {
        this.onStatus({ state: "unauthorized" });
        await this.api.askForToken(true, outcome.token);
        continue;
      }
      const inMs = reconnectDelay(this.failures);
      this.failures += 1;
      this.onStatus({ state: "reconnecting", inMs, failures: this.failures, message: outcome.message });
      await new Promise((resolve) => setTimeout(resolve, inMs));
    }
  }

  /** One connection, until it ends; how it ended. */
  async once() {
    this.onStatus({ state: "connecting" });
    const controller = new AbortController();
    this.controller = controller;
    const token = this.api.currentToken();
    const headers = { Accept: "text/event-stream", ...this.api.authHeaders() };
    const resuming = this.lastEventId !== null && this.lastEventId !== "";
    if (resuming) headers["Last-Event-ID"] = this.lastEventId;
    let watchdog = null;
    const armWatchdog = () => {
      clearTimeout(watchdog);
      // The server sends a keep-alive comment after 15 s of silence; nothing for much longer
      // than that means the connection is dead without having said so.
      watchdog = setTimeout(() => controller.abort(), this.idleLimitMs);
    };
    try {
      armWatchdog();
      const response = await fetch(this.path, { headers, signal: controller.signal, cache: "no-store" });
      if (response.status === 401) return { kind: "unauthorized", token };
      if (!response.ok || !response.body) {
        let message = `HTTP ${response.status}`;
        try {
          message = (await response.json())?.error?.message ?? message;
        } catch {
          // not JSON: keep the status
        }
        this.onStatus({ state: "error", message });
        return { kind: "error", message };
      }
      this.onStatus({ state: "live" });
      this.onOpen({ resumed: resuming });
      const parser = new SseParser((ev) => {
        if (ev.id !== null) this.lastEventId = ev.id;
        let data;
        try {
          data = JSON.parse(ev.data);
        } catch {
          return;
        }
        this.onEvent(data, ev);
      });
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return { kind: "ended", message: "the server ended the stream" };
        armWatchdog();
        parser.feed(value);
      }
    } catch (e) {
      if (this.stopped) return { kind: "stopped" };
      return { kind: "error", message: e?.name === "AbortError" ? "the stream went silent" : "the connection failed" };
    } finally {
      clearTimeout(watchdog);
      if (this.controller === controller) this.controller = null;
    }
  }
}
