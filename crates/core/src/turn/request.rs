//! What a front door hands the engine to run a turn, and what it gets back.

use std::sync::Arc;

use serde_json::Value;
use toolwarden_protocol::{
    CallId, CallResult, Principal, SessionId, ToolCall, TraceParent, TurnId,
};

use crate::call::CallProgress;

/// Turns a call's result into what a front door answers with (an Anthropic `tool_result` block,
/// an OpenAI tool message, ...). `turn_end` carries the rendered list.
pub type ResultRenderer = Arc<dyn Fn(&ToolCall, &CallResult) -> Value + Send + Sync>;

/// A turn to run.
#[derive(Clone, Default)]
pub struct TurnRequest {
    /// Who makes the turn (default `local`, with every scope). Its session ids are its own.
    pub principal: Principal,
    /// The session; a new one when absent (or the parent turn's, for a child turn).
    pub session_id: Option<SessionId>,
    /// The turn this one is a sub-agent of: aborting it aborts this one.
    pub parent_turn_id: Option<TurnId>,
    /// A caller-chosen id; generated (`t_<ULID>`) when absent.
    pub turn_id: Option<TurnId>,
    /// The calls, in order.
    pub calls: Vec<ToolCall>,
    /// How `turn_end` renders results (default: the `CallResult`s themselves).
    pub render: Option<ResultRenderer>,
    /// Live progress of the calls (the MCP gateway relays it to its client).
    pub progress: Option<CallProgress>,
    /// The client's trace context (a `traceparent` header or `_meta.traceparent`): the turn's
    /// span is its child, and backends are passed it on.
    pub traceparent: Option<TraceParent>,
}

impl std::fmt::Debug for TurnRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TurnRequest")
            .field("principal", &self.principal.name)
            .field("session_id", &self.session_id)
            .field("parent_turn_id", &self.parent_turn_id)
            .field("turn_id", &self.turn_id)
            .field("calls", &self.calls)
            .field("traceparent", &self.traceparent)
            .finish_non_exhaustive()
    }
}

impl TurnRequest {
    /// A turn of `calls` in `session`.
    pub fn new(session_id: impl Into<SessionId>, calls: Vec<ToolCall>) -> Self {
        Self {
            session_id: Some(session_id.into()),
            calls,
            ..Self::default()
        }
    }
}

/// Why a turn was refused before any call ran.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TurnError {
    /// No calls.
    #[error("a turn needs at least one call")]
    Empty,
    /// A call without an id.
    #[error("call {0} has an empty id")]
    EmptyCallId(usize),
    /// Two calls share an id.
    #[error("call id {0:?} appears more than once in the turn")]
    DuplicateCallId(CallId),
    /// The caller-chosen turn id is already running.
    #[error("turn {0} is already running")]
    DuplicateTurnId(TurnId),
}

/// A finished turn.
#[derive(Debug, Clone)]
pub struct TurnOutput {
    /// The turn.
    pub turn_id: TurnId,
    /// Its session.
    pub session_id: SessionId,
    /// One result per call, in call order (shared with the `tool_result` events).
    pub results: Vec<Arc<CallResult>>,
    /// The results as the turn's renderer made them (see [`TurnRequest::render`]), in call
    /// order: the same list `turn_end` carries, made once.
    pub rendered: Option<Arc<Vec<Value>>>,
}

/// How a turn ended: its results, and their rendering when it has a renderer.
pub(crate) type FinishedTurn = (Vec<Arc<CallResult>>, Option<Arc<Vec<Value>>>);
