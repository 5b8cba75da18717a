//! Wire and data types of toolwarden.
//!
//! This crate holds what crosses a boundary — between the engine and its front doors (MCP, HTTP,
//! CLI), between the engine and the audit trail, and between toolwarden and its users' programs:
//! ids, calls, outcomes, events, interactions, tool specs and the policy configuration. It has no
//! logic beyond parsing and formatting its own values, no runtime and no I/O, so that every other
//! crate (and every client) can depend on it cheaply. The key design choice: **every type here is
//! toolwarden's public contract**, serialized exactly as the docs show it on the wire
//! (docs/GOVERNANCE.md, docs/HTTP-API.md, docs/CONFIG.md); the engine's inner state never derives
//! `Serialize`.
#![deny(missing_docs)]

mod audit;
mod call;
mod config;
mod duration;
mod event;
pub mod hex;
mod ids;
mod interaction;
mod outcome;
mod policy;
mod principal;
mod scope;
mod status;
mod time;
mod tool;
mod trace;

pub use audit::{
    AUDIT_DEFAULT_LIMIT, AUDIT_MAX_LIMIT, AuditCall, AuditEvent, AuditPage, AuditQuery, CallsPage,
    ReplicaRecord, TaskRecord, TurnRecord, TurnRunState, parse_calls_cursor,
};
pub use call::{CallResult, Content, ToolCall};
pub use config::{
    AuthConfig, AuthToken, ConfigFile, ExecConfig, GatewayConfig, HookConfig, HookOnError,
    HttpConfig, MCP_REVISIONS, OAuthConfig, OtelConfig, QuotaConfig, QuotaPer, RedisConfig,
    RuleConfig, RuleDecision, ServerConfig, StoreConfig, StoreDurability,
};
pub use duration::{
    DurationValue, ParseError, SizeValue, format_duration, parse_duration, parse_size,
};
pub use event::{
    BreakerStateKind, EVENT_TYPES, Event, EventKind, ProgressInfo, ServerStateKind, StopHow,
    TurnCall, TurnResults,
};
pub use ids::{CallId, InteractionId, SessionId, TurnId};
pub use interaction::{
    Interaction, InteractionAction, InteractionAnswer, InteractionKind, InteractionOutcome,
};
pub use outcome::{
    CancelReason, ContentDigest, Decider, DenyReason, ErrorReason, InvalidReason, Outcome,
    Provenance, ProvenanceSource, STATUS_FILTERS, STATUS_NAMES, Status, TimeoutKind,
};
pub use policy::{
    Approval, Backoff, BackoffConfig, Breaker, BreakerConfig, Concurrency, LoopConfig, LoopPolicy,
    OnStuck, OnToolChange, POLICY_KEYS, Policy, PolicyConfig, TaskMode,
};
pub use principal::{DEFAULT_PRINCIPAL, LOCAL_PRINCIPAL, Principal, Scope, Scopes, SessionKey};
pub use scope::EventScope;
pub use status::{
    ActiveCall, ActiveTurn, BreakerInfo, CallState, RecentCall, RunningCall, ServerNotUp,
    SessionStatus, ToolChange, ToolInfo,
};
pub use time::Timestamp;
pub use tool::{EXEC_TOOL, ToolAnnotations, ToolSpec};
pub use trace::{SpanId, TraceId, TraceParent, TurnTrace};
