//! The toolwarden engine: governed execution of tool calls and turns.
//!
//! Front doors (MCP gateway, HTTP API, CLI, Rust programs) hand the engine calls; backends (MCP
//! servers, the exec tool, in-process functions) run them. The engine stands between and applies
//! every rule of docs/GOVERNANCE.md — validation, loop detection, approvals, cache, circuit
//! breaker, per-session exclusivity, deadlines, retries — and gives back exactly one typed outcome
//! per call.
//!
//! The key design choice: **the caller's outcome and the stopping of the work are separate.** A
//! cancel or timeout decides the outcome at once; stopping the backend's work (cooperatively, then
//! by force) continues behind it on a tracked task and ends in a `tool_stopped` event. Core knows
//! nothing of MCP, HTTP or processes: backends plug in through [`backend::Backend`].
//!
//! ```no_run
//! use serde_json::json;
//! use toolwarden_core::{Engine, InProcessTool, ToolError};
//! use toolwarden_core::protocol::ToolCall;
//!
//! # async fn demo() {
//! let engine = Engine::new();
//! engine.register(InProcessTool::new(
//!     "add",
//!     "Adds two integers",
//!     json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
//!            "required": ["a", "b"]}),
//!     |input, _ctx| async move {
//!         let sum = input["a"].as_i64().unwrap_or(0) + input["b"].as_i64().unwrap_or(0);
//!         Ok::<_, ToolError>(sum.to_string())
//!     },
//! ));
//! let result = engine.call("session-1", ToolCall::new("c1", "add", json!({"a": 2, "b": 3}))).await;
//! assert_eq!(result.text(), "5");
//! # }
//! ```
#![deny(missing_docs)]

mod availability;
pub mod backend;
mod breaker;
mod cache;
mod call;
mod cancel;
pub mod canonical;
pub(crate) mod clock;
pub mod config;
mod engine;
pub mod events;
mod gate;
pub mod hooks;
mod ids;
mod inproc;
pub mod interaction;
mod loop_detect;
mod maps;
pub mod metrics;
pub mod pins;
pub mod policy;
pub mod quotas;
mod reaper;
mod registry;
mod retry;
pub mod rules;
mod servers;
mod session;
pub mod shared;
pub mod shell;
pub mod store;
pub mod suggest;
mod text;
mod trace;
mod turn;

pub use backend::{
    Attempt, AttemptEnd, AttemptError, AttemptMeta, Backend, BackendHost, BoxFuture, Heartbeat,
    ProgressRelay, StopSignals, ToolOutput,
};
pub use call::CallProgress;
pub use config::{
    Config, ConfigDiagnostic, ConfigError, ConfigErrorKind, ConfigOrigin, apply_hints,
};
pub use engine::{Engine, EngineBuilder, ToolBacking};
pub use events::{EventBus, EventScope, EventSink, Matching, Received, Subscription};
pub use ids::PREFIX_SEPARATOR;
pub use inproc::{INPROCESS, InProcessTool, IntoToolOutput, ToolContext, ToolError};
pub use interaction::{
    AnswerError, AnswerSender, InteractionEnd, InteractionRequest, Interactions, Interactor,
};
pub use metrics::Metrics;
pub use policy::{PolicySource, ToolOrigin};
pub use servers::ServerStatus;
pub use store::{AuditStore, StoreCommits, StoreHealth, StoreReadError, StoreUnavailable};
pub use text::{cannot_start, json_type_name, outcome_text};
pub use toolwarden_protocol as protocol;
pub use trace::{attempt_span, call_span};
pub use turn::{
    AbortError, NotFound, ResultRenderer, TurnError, TurnHandle, TurnOutput, TurnRequest,
};
