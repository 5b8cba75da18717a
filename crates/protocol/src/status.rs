//! Views of what is running and how tools are doing: `GET /v1/turns/active`,
//! `GET /v1/sessions/{id}/status`, `GET /v1/tools`, and the `toolwarden__status` tool.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::event::{BreakerStateKind, ProgressInfo, ServerStateKind};
use crate::ids::{CallId, SessionId, TurnId};
use crate::outcome::Status;
use crate::policy::Policy;
use crate::time::Timestamp;
use crate::tool::ToolAnnotations;

/// Where a call is in its pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallState {
    /// Arrived, being validated.
    Queued,
    /// Waiting for a person's approval or confirmation.
    AwaitingApproval,
    /// Waiting for its turn in the session (an exclusive call) or for an identical running call.
    Waiting,
    /// An attempt is running.
    Running,
    /// Sleeping before a retry.
    Backoff,
    /// Has its outcome.
    Done,
}

/// One call of a running turn.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ActiveCall {
    /// The call.
    pub call_id: CallId,
    /// Its tool.
    pub tool: String,
    /// Where it is.
    pub state: CallState,
    /// Since its first attempt started (0 before).
    pub elapsed_ms: u64,
    /// The attempt running (0 before the first).
    pub attempt: u32,
    /// The last progress its backend reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<ProgressInfo>,
    /// Its outcome status, once done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

/// A running turn.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ActiveTurn {
    /// The turn.
    pub turn_id: TurnId,
    /// Who made it (`local` when a record predates principals).
    #[serde(default = "crate::principal::local_name")]
    pub principal: Arc<str>,
    /// Its session (the principal's own).
    pub session_id: SessionId,
    /// Its parent turn, for a sub-agent's turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_turn_id: Option<TurnId>,
    /// When it started.
    pub started_at: Timestamp,
    /// Its calls in order.
    pub calls: Vec<ActiveCall>,
}

/// A breaker that is not closed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BreakerInfo {
    /// The tool.
    pub tool: String,
    /// Open or half-open.
    pub state: BreakerStateKind,
    /// Time left open, when open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
}

/// A finished call, as a session remembers it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecentCall {
    /// The call.
    pub call_id: CallId,
    /// Its turn.
    pub turn_id: TurnId,
    /// Its tool.
    pub tool: String,
    /// How it ended.
    #[serde(flatten)]
    pub status: Status,
    /// When it ended.
    pub at: Timestamp,
}

/// A running call of a session.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunningCall {
    /// Its turn.
    pub turn_id: TurnId,
    /// The call.
    #[serde(flatten)]
    pub call: ActiveCall,
}

/// How a session's calls are doing (`GET /v1/sessions/{id}/status`, the `toolwarden__status` tool).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionStatus {
    /// The session.
    pub session_id: SessionId,
    /// Calls running now.
    pub running: Vec<RunningCall>,
    /// Finished calls by status (`ok`, `timeout`, ...).
    pub counts: BTreeMap<String, u64>,
    /// Tools that timed out in this session, by name, with how many times.
    pub timed_out_tools: BTreeMap<String, u64>,
    /// The most recent calls that did not end `ok`, newest last.
    pub recent_failures: Vec<RecentCall>,
    /// Breakers that are not closed (shared by every session).
    pub open_breakers: Vec<BreakerInfo>,
    /// Backend servers that are not up — starting, down or failed — by name, with why (shared
    /// by every session): their tools' calls wait for them, or (`failed`) fail at once.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub servers_not_up: BTreeMap<String, ServerNotUp>,
}

/// A backend server that is not up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerNotUp {
    /// Its state: `starting`, `down` or `failed`.
    pub state: ServerStateKind,
    /// Why, when it is down or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// One tool as the engine governs it (`GET /v1/tools`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolInfo {
    /// The exposed name (`SERVER__TOOL`, `exec`, or an in-process name).
    pub name: String,
    /// What it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Its input schema.
    pub input_schema: Value,
    /// Its output schema, if declared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    /// Its behaviour hints.
    pub annotations: ToolAnnotations,
    /// The backend that serves it (server name, `exec`, `inprocess`).
    pub backend: String,
    /// The effective policy.
    pub policy: Policy,
    /// Its breaker's state.
    pub breaker: BreakerStateKind,
    /// A change its server made to its definition that waits to be accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changed: Option<ToolChange>,
}

/// A change a server made to a pinned tool's definition, not accepted yet.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolChange {
    /// The server listing the new definition.
    pub server: String,
    /// The pinned definition's digest.
    pub old_digest: String,
    /// The new definition's digest.
    pub new_digest: String,
    /// A unified diff from the pinned definition to the new one.
    pub diff: String,
    /// Whether its calls are held until it is accepted.
    pub blocked: bool,
}
