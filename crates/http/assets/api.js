// Requests to the API, with the bearer token when the server wants one.
//
// The token is asked for once, when the API first answers 401, and kept in sessionStorage: it
// lives as long as the tab, is not shared with other tabs or sites, and never appears in a URL
// (so not in the server's logs, the browser's history, or a Referer header).

const TOKEN_KEY = "toolwarden.token";

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export class Api {
  /**
   * `promptToken(refused)` shows the token form and resolves with what the person entered;
   * `refused` says a token was tried and the server refused it. `onServerDate(epochMs)` hears
   * the `Date` of every answer (the server's clock, to the second).
   */
  constructor({ promptToken, storage = globalThis.sessionStorage, onServerDate = () => {} }) {
    this.promptToken = promptToken;
    this.storage = storage;
    this.onServerDate = onServerDate;
    this.asking = null;
  }

  get token() {
    try {
      return this.storage?.getItem(TOKEN_KEY) || null;
    } catch {
      return null;
    }
  }

  set token(value) {
    try {
      if (value) this.storage?.setItem(TOKEN_KEY, value);
      else this.storage?.removeItem(TOKEN_KEY);
    } catch {
      // storage refused (private mode quota): the token lives only as long as this page
    }
    this.memoryToken = value || null;
  }

  authHeaders() {
    const token = this.currentToken();
    return token ? { Authorization: `Bearer ${token}` } : {};
  }

  /** The token requests carry now (null: none). */
  currentToken() {
    return this.token ?? this.memoryToken ?? null;
  }

  /**
   * Asks for a token (once, however many requests are waiting for it). `refused`: the token
   * `used` was tried and refused, so it is forgotten first — unless another has replaced it
   * since that request left, in which case the new one is simply tried.
   */
  askForToken(refused, used = this.currentToken()) {
    const current = this.currentToken();
    if (!this.asking && current !== null && current !== used) return Promise.resolve(current);
    if (!this.asking) {
      const hadToken = current !== null;
      if (refused) this.token = null;
      this.asking = Promise.resolve(this.promptToken(refused && hadToken)).then((token) => {
        this.token = token;
        this.asking = null;
        return token;
      });
    }
    return this.asking;
  }

  /** A JSON request; asks for the token and tries again on 401. Throws ApiError otherwise. */
  async request(method, path, body) {
    for (;;) {
      const used = this.currentToken();
      const headers = { Accept: "application/json", ...this.authHeaders() };
      const init = { method, headers, cache: "no-store" };
      if (body !== undefined) {
        headers["Content-Type"] = "application/json";
        init.body = JSON.stringify(body);
      }
      const response = await fetch(path, init);
      const date = Date.parse(response.headers.get("date") ?? "");
      if (Number.isFinite(date)) this.onServerDate(date);
      if (response.status === 401) {
        await this.askForToken(true, used);
        continue;
      }
      let data = null;
      try {
        data = await response.json();
      } catch {
        data = null;
      }
      if (!response.ok) {
        throw new ApiError(
          response.status,
          data?.error?.code ?? "http_error",
          data?.error?.message ?? `HTTP ${response.status}`,
        );
      }
      return data;
    }
  }

  get(path) {
    return this.request("GET", path);
  }

  post(path, body) {
    return this.request("POST", path, body ?? {});
  }
}
