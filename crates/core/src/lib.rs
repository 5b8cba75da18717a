//! The toolwarden engine: governed execution of tool calls and turns.
//!
//! Front doors (MCP gateway, HTTP API, CLI, Rust programs) hand the engine calls; backends (MCP
//! servers, the exec tool, in-process functions) run them. The engine stands between and applies
//! every rule of the spec — validation, loop detection, approvals, cache, circuit breaker,
//! per-session exclusivity, deadlines, retries — and gives back exactly one typed outcome per call.
//!
//! The key design choice: **the caller's outcome and the stopping of the work are separate.** A
//! cancel or timeout decides the outcome at once; stopping the backend's work (cooperatively, then
//! by force) continues behind it on a tracked task and ends in a `tool_stopped` event. Core knows
//! nothing of MCP, HTTP or processes: backends plug in through [`backend::Backend`].
#![deny(missing_docs)]

pub mod backend;
pub mod config;

pub use backend::{
    Attempt, AttemptEnd, AttemptError, AttemptMeta, Backend, BackendHost, BoxFuture, Heartbeat,
    ProgressRelay, StopSignals, ToolOutput,
};
pub use config::{
    Config, ConfigDiagnostic, ConfigError, ConfigErrorKind, ConfigOrigin, apply_hints,
};
pub use toolwarden_protocol as protocol;
