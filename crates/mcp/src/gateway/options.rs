//! What the gateway is configured with, and what it fixes: the names it exposes, the protocol
//! revisions it speaks, and the waits and limits of its transports. One place, so that the
//! rmcp side and the gateway's own HTTP path cannot disagree about them.

use std::time::Duration;

use rmcp::model::ProtocolVersion;
use toolwarden_protocol::Principal;

/// The name of the gateway's own tool: the session's running, timed-out and failed calls and
/// open breakers, for the model.
pub const STATUS_TOOL: &str = "toolwarden__status";

/// The name of the elicitation interactor the gateway attaches to the engine.
pub const ELICITATION_INTERACTOR: &str = "mcp-elicitation";

/// How the gateway exposes what it governs.
#[derive(Clone, Debug)]
pub struct GatewayOptions {
    /// Prompts are named `SERVER__PROMPT` (default `true`), like tools. Tool names come from
    /// the engine, so this must match the `prefix` the servers' host was made with
    /// ([`Engine::host`](toolwarden_core::Engine::host)); `false` is meant for a single server.
    pub prefix: bool,
    /// Streamable HTTP: `Host` values accepted besides loopback (`localhost`, `127.0.0.1`,
    /// `::1`), as `host` or `host:port`. The binary puts its own Host/Origin guard in front;
    /// this is rmcp's own check behind it.
    pub allowed_hosts: Vec<String>,
    /// Streamable HTTP: a session with no request from its client for this long and no call
    /// running is closed (default 5 min).
    pub http_session_idle: Duration,
    /// Streamable HTTP: keep-alive comment interval on response streams (default 15 s).
    pub sse_keep_alive: Duration,
    /// Streamable HTTP: the largest request body, in bytes (default 4 MiB; the binary uses
    /// `http.max_body`). A larger one is answered 413 with a JSON-RPC error, whichever path it
    /// would have taken.
    pub max_body: usize,
    /// Tasks toward clients: how long a task's outcome is kept once its call has ended
    /// (`ttlMs`; default 1 h).
    pub task_ttl: Duration,
    /// Tasks toward clients: the wait between two `tasks/get` suggested to the client
    /// (`pollIntervalMs`; default 1 s).
    pub task_poll_interval: Duration,
    /// The deadline of a request the gateway forwards to a server (`resources/*`,
    /// `prompts/*`, `completion/complete`, `logging/setLevel`) when the client's request
    /// carries none in `_meta.timeout_ms` (default 30 s; the binary uses
    /// `[gateway] request_timeout`). A server that does not answer within it gets
    /// `notifications/cancelled` and the client a JSON-RPC error (-32001).
    pub request_timeout: Duration,
    /// Who the client is when its requests do not say: the stdio client's principal, and that
    /// of HTTP requests that reach the service without a [`Principal`] in their extensions
    /// (the binary's authentication puts one in every request). Default `local`.
    pub principal: Principal,
}

impl Default for GatewayOptions {
    fn default() -> Self {
        Self {
            prefix: true,
            allowed_hosts: Vec::new(),
            http_session_idle: Duration::from_secs(300),
            sse_keep_alive: Duration::from_secs(15),
            max_body: DEFAULT_MAX_BODY,
            task_ttl: Duration::from_secs(3600),
            task_poll_interval: Duration::from_secs(1),
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            principal: Principal::local(),
        }
    }
}

/// The protocol revisions the gateway speaks: those with an `initialize` handshake
/// (2024-11-05 to 2025-11-25) and the stateless 2026-07-28, whose requests each carry their
/// own version and client capabilities.
pub(crate) fn versions() -> &'static [ProtocolVersion] {
    ProtocolVersion::known_up_to(&ProtocolVersion::V_2026_07_28)
}

/// How long a stateless client may keep the tool list (`ttlMs` of `tools/list`): it changes
/// only when a server's list does, and a stateless client hears of no change.
pub(crate) const TOOLS_TTL: Duration = Duration::from_secs(10);

/// For how long after the gateway is made `initialize` (and `server/discover`) wait for the
/// servers' first start, for the capabilities they announce: long enough for a server that
/// starts in seconds, well within the patience of MCP clients, which give up on a handshake
/// that takes long. `toolwarden mcp` waits as long before it reads its client at all. A list
/// waits for the whole start, within its own deadline (`GatewayState::first_starts_by`).
pub const HANDSHAKE_WAIT: Duration = Duration::from_secs(10);

/// How long a closed response stream waits for the client's `notifications/cancelled` for its
/// request before it counts as a disconnect.
pub(crate) const STREAM_CLOSE_SETTLE: Duration = Duration::from_millis(200);

/// How long the gateway's own answer waits for a call's answer before its response starts as an event
/// stream anyway (see `super::respond`).
pub(crate) const JSON_WINDOW: Duration = Duration::from_secs(1);

/// The default deadline of a forwarded request: 30 s.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The longest deadline a client's `_meta.timeout_ms` may give a forwarded request: 30 min
/// (the `max_timeout` default of tool calls).
pub(crate) const MAX_REQUEST_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// The default largest request body on Streamable HTTP: 4 MiB.
pub(crate) const DEFAULT_MAX_BODY: usize = 4 * 1024 * 1024;

/// The prefix of the JSON-RPC ids of the requests the gateway sends on the responses of the
/// calls it serves itself; rmcp numbers its own requests, so the two never meet.
pub(crate) const ANSWER_ID_PREFIX: &str = "toolwarden-";
