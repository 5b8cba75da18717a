//! toolwarden's MCP side, through the official `rmcp` crate: the client backend — one
//! [`McpServer`] per configured server, over stdio (a child process) or Streamable HTTP — and
//! the [`Gateway`], the MCP server that agents connect to (see [`Gateway`] and
//! `docs/GATEWAY.md`).
//!
//! The backend keeps the promises of `toolwarden_core::backend`'s stop contract towards servers
//! that do not keep theirs:
//!
//! - **Every call carries a progress token** (rmcp's own); the server's progress for it becomes
//!   the call's heartbeat, and progress for finished calls is dropped.
//! - **A cancel names one request.** `notifications/cancelled` goes to that server for that
//!   request only, with the reason, and the backend *keeps listening*: at the forced stop, a
//!   request that was quiet since its cancel stopped cooperatively; one that kept sending progress
//!   (or answering) is stuck, and `on_stuck` decides: abandon it (counted until its late answer
//!   arrives or the server exits) or restart the server (SIGKILL to its whole process group).
//! - **No orphans.** A stdio server runs in its own process group with a parent-death signal
//!   (`toolwarden_process::GroupChild`); every exit path kills the group and reaps the leader.
//! - **Bad output never hangs a call.** A frame guard reads the server's stdout before rmcp: a
//!   line that is not JSON, is oversized or is a malformed answer fails the call it names with a
//!   transport error, and is logged otherwise (see `servers::frame`).
//! - **Crashes and failed starts heal.** A server that exits is restarted with capped
//!   exponential backoff; calls in flight end `Crashed`, or `ServerRestart` when the restart was
//!   ours.
//!
//! The key design choice: **the cancel is sent as a raw `notifications/cancelled`** (rmcp's
//! `CustomNotification`), not through rmcp's typed cancel. rmcp's typed cancel resolves the
//! pending request at once and throws away whatever the server sends for it afterwards — but a
//! late answer is exactly the evidence the stuck rules need (and what ends an abandoned call).
//! On the wire the two are identical.
//!
//! `docs/MCP-BACKEND.md` has the full rules: starts and restarts, what counts as crashed,
//! transport or rejected, the stuck rules, what rmcp does with bad frames, and every decision
//! the spec leaves open.
//!
//! The crate's two sides are its two modules, named for what they face, and they depend one
//! way: `servers` (toolwarden as a client of MCP servers) and `gateway` (toolwarden as the MCP
//! server its clients connect to); `gateway` uses `servers`' `McpServer`, never the reverse. What a server asks of its own client goes up
//! through the `Upstream` trait that `servers::link` defines and the gateway implements.
#![deny(missing_docs)]

mod gateway;
mod servers;

#[cfg(feature = "parse-count")]
pub use gateway::reads;
pub use gateway::{
    DEFAULT_REQUEST_TIMEOUT, ELICITATION_INTERACTOR, Gateway, GatewayConnection, GatewayError,
    GatewayHttpService, GatewayOptions, HANDSHAKE_WAIT, HttpSessions, STATUS_TOOL,
};
pub use servers::{DEFAULT_STARTUP_TIMEOUT, McpOptions, McpServer, ReadyError};
