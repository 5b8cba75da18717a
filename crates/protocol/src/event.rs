//! Events: typed, sequenced records of what happened (docs/GOVERNANCE.md, "Events").

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::call::CallResult;
use crate::ids::{CallId, InteractionId, TurnId};
use crate::interaction::{Interaction, InteractionAction, InteractionKind};
use crate::outcome::{CancelReason, Decider, DenyReason, TimeoutKind};
use crate::policy::OnToolChange;
use crate::scope::EventScope;
use crate::time::Timestamp;

/// How a cancelled or timed-out call's work was stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopHow {
    /// The backend stopped when asked, within `cancel_grace`.
    Cooperative,
    /// The work was forced to stop (process group killed, task aborted).
    Killed,
    /// The backend server was restarted to stop it.
    Restarted,
    /// The backend ignored the cancel and could not be forced; the work is counted as abandoned.
    Abandoned,
}

impl StopHow {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            StopHow::Cooperative => "cooperative",
            StopHow::Killed => "killed",
            StopHow::Restarted => "restarted",
            StopHow::Abandoned => "abandoned",
        }
    }
}

/// A circuit breaker's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakerStateKind {
    /// Calls pass.
    Closed,
    /// One probe call is admitted.
    HalfOpen,
    /// Calls end at once as `circuit_open`.
    Open,
}

/// A backend server's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServerStateKind {
    /// Being started (process spawned, initialize under way).
    Starting,
    /// Initialized and listing its tools.
    Up,
    /// Crashed, exited, unreachable, or its start timed out: it may come back by itself, and
    /// calls for it wait for it (within its `startup_timeout`).
    Down,
    /// Its start failed in a way that does not fix itself: the command cannot be run (not
    /// found, not executable), the process exited before the MCP handshake, or its definition
    /// is invalid. Calls for it end at once; it is still retried on a backoff (the command may
    /// get installed), without `starting` reports.
    Failed,
    /// Was restarted (by `on_stuck = "restart"` or after a crash).
    Restarted,
}

/// Progress a backend reported for a call.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProgressInfo {
    /// Progress so far (increasing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<f64>,
    /// Total, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<f64>,
    /// A human-readable message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// What happened, with its own fields.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventKind {
    /// A turn began.
    TurnStart {
        /// The parent turn, for a sub-agent's turn.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        parent_turn_id: Option<TurnId>,
        /// Its calls, in order: `{"call_id", "tool"}`.
        calls: Vec<TurnCall>,
        /// Its place in a trace, when toolwarden exports spans (`[otel]`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        trace: Option<crate::trace::TurnTrace>,
    },
    /// A turn ended; `results` is the list a front door answers with, in call order.
    TurnEnd {
        /// `completed` (every call ok), `partial` (some call did not end ok) or `aborted`.
        outcome: std::borrow::Cow<'static, str>,
        /// One result per call, in call order.
        results: TurnResults,
    },
    /// A turn was aborted.
    TurnAbort {
        /// Why.
        reason: CancelReason,
    },
    /// A call's first attempt is about to invoke its backend.
    ToolStart {
        /// The input (the audit trail truncates and masks it).
        input: Arc<Value>,
        /// The effective total deadline, in milliseconds (0 = none).
        timeout_ms: u64,
        /// The effective idle deadline, in milliseconds (0 = off).
        idle_timeout_ms: u64,
    },
    /// A running call is alive: on backend progress (at most 4 per second) and every 5 s.
    ToolProgress {
        /// Since the call's first attempt started.
        elapsed_ms: u64,
        /// What the backend reported, if anything.
        #[serde(flatten)]
        progress: ProgressInfo,
    },
    /// An attempt failed retryably and another will start after `delay_ms`.
    ToolRetry {
        /// The attempt about to start (2 for the first retry).
        attempt: u32,
        /// The backoff before it.
        delay_ms: u64,
        /// What failed.
        cause: String,
    },
    /// A deadline fired.
    ToolTimeout {
        /// Which.
        kind: TimeoutKind,
        /// Its limit in milliseconds.
        after_ms: u64,
    },
    /// A call's outcome: the result the caller got (`outcome`, `content`, `is_error`, ...).
    ToolResult {
        /// The result, flattened into the event.
        #[serde(flatten)]
        result: Arc<CallResult>,
        /// From arrival to outcome.
        duration_ms: u64,
    },
    /// The work of a cancelled or timed-out call was stopped.
    ToolStopped {
        /// How.
        how: StopHow,
        /// From the stop request to the stop — or, with `found_quiet`, to the moment the
        /// stop was judged.
        after_ms: u64,
        /// The work stopped unseen: an MCP server that honours a cancel sends nothing more, so
        /// it was found quiet when `cancel_grace` ran out, and taken at its word
        /// (`cooperative`); `after_ms` is then the grace, not when the work stopped.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        found_quiet: bool,
    },
    /// A backend answered a call after its outcome was decided; the answer was discarded.
    ToolLateResult {
        /// Whether the late answer was an error.
        is_error: bool,
        /// How long after the outcome it arrived.
        after_ms: u64,
    },
    /// A human is asked something.
    InteractionRequested {
        /// The question (boxed: it is by far the largest event, and the rarest).
        interaction: Box<Interaction>,
    },
    /// `[[rules]]` decided a call: the most restrictive decision of the rules that matched.
    RuleDecision {
        /// What happens to the call.
        decision: crate::RuleDecision,
        /// The matching rules, by their index in the config file's `[[rules]]` (from 0).
        rules: Vec<usize>,
        /// The reason of the deciding rule, when it gives one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// A human answered.
    InteractionAnswered {
        /// Which interaction.
        interaction_id: InteractionId,
        /// Its kind.
        kind: InteractionKind,
        /// The answer (never a secret's value).
        action: InteractionAction,
        /// Who answered (`http`, `dashboard`, `terminal`, `elicitation`, ...).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<String>,
        /// The principal who answered, when the door knows it (the HTTP API and the
        /// dashboard: the token's; an MCP client's elicitation: the session's).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        answerer: Option<String>,
    },
    /// An interaction's deadline passed without an answer.
    InteractionTimedOut {
        /// Which interaction.
        interaction_id: InteractionId,
        /// Its kind.
        kind: InteractionKind,
        /// Its deadline in milliseconds.
        after_ms: u64,
    },
    /// A call was denied.
    ToolCallDenied {
        /// What decided.
        decider: Decider,
        /// Why.
        reason: DenyReason,
    },
    /// A tool's circuit breaker changed state.
    BreakerState {
        /// The new state.
        state: BreakerStateKind,
    },
    /// A backend server changed state.
    ServerState {
        /// The server's name.
        server: String,
        /// The new state.
        state: ServerStateKind,
        /// Why, when it went down.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        detail: Option<String>,
    },
    /// A `[hooks.NAME]` answered about a call (or failed to: then `decision` is its `on_error`).
    HookDecision {
        /// The hook's name.
        hook: String,
        /// What it decided: `allow`, `ask` or `deny`.
        decision: crate::RuleDecision,
        /// How long it took, in milliseconds.
        duration_ms: u64,
        /// Whether it replaced the call's arguments (the original and the new ones are in
        /// `original_args` and `args`).
        rewritten: bool,
        /// The hook's reason, or what went wrong when it failed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// Whether it failed (timed out, erred, answered garbage) and `decision` is its `on_error`.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        failed: bool,
        /// The arguments as the call gave them, when the hook rewrote them.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        original_args: Option<serde_json::Value>,
        /// The arguments the hook gave, when it rewrote them.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        args: Option<serde_json::Value>,
    },
    /// A `[[quotas]]` entry turned a call away.
    QuotaExceeded {
        /// The quota, by its index in the config file's `[[quotas]]` (from 0).
        quota: usize,
        /// What ran out: `rate_limit` or `concurrency`.
        reason: DenyReason,
        /// Whose bucket: the principal, session or tool name, or `global`.
        bucket: String,
        /// When the call may be allowed, in milliseconds from now.
        retry_after_ms: u64,
    },
    /// A server listed a tool whose definition differs from the one pinned for its name (the
    /// tool, as agents call it, is the event's `tool`).
    ToolChanged {
        /// The server listing it now.
        server: String,
        /// The pinned definition's digest (`sha256:…`).
        old_digest: String,
        /// The new definition's digest.
        new_digest: String,
        /// A unified diff of the two definitions' canonical JSON.
        diff: String,
        /// What `on_tool_change` made of it: `warn`, `block` or `accept`.
        action: OnToolChange,
    },
    /// A tool's definition was pinned: first seen, or a changed definition accepted (the tool is
    /// the event's `tool`). The trail's `tool_accepted` events are the pins.
    ToolAccepted {
        /// The server that lists it.
        server: String,
        /// The definition's digest (`sha256:…`).
        digest: String,
        /// The definition pinned: its description, input schema and annotations.
        definition: Value,
        /// Who accepted it: a principal; none for a tool first seen, or a change that
        /// `on_tool_change = "accept"` took.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<String>,
    },
    /// A call was served from the cache.
    CacheHit {
        /// The call whose result was served.
        origin_call_id: CallId,
        /// When that result was produced.
        fetched_at: Timestamp,
    },
}

/// Every event `type`, as the wire spells them (what [`EventKind::name`] answers).
pub const EVENT_TYPES: &[&str] = &[
    "turn_start",
    "turn_end",
    "turn_abort",
    "tool_start",
    "tool_progress",
    "tool_retry",
    "tool_timeout",
    "tool_result",
    "tool_stopped",
    "tool_late_result",
    "interaction_requested",
    "interaction_answered",
    "interaction_timed_out",
    "tool_call_denied",
    "rule_decision",
    "hook_decision",
    "quota_exceeded",
    "tool_changed",
    "tool_accepted",
    "breaker_state",
    "server_state",
    "cache_hit",
];

impl EventKind {
    /// The `type` as the wire spells it.
    pub fn name(&self) -> &'static str {
        match self {
            EventKind::TurnStart { .. } => "turn_start",
            EventKind::TurnEnd { .. } => "turn_end",
            EventKind::TurnAbort { .. } => "turn_abort",
            EventKind::ToolStart { .. } => "tool_start",
            EventKind::ToolProgress { .. } => "tool_progress",
            EventKind::ToolRetry { .. } => "tool_retry",
            EventKind::ToolTimeout { .. } => "tool_timeout",
            EventKind::ToolResult { .. } => "tool_result",
            EventKind::ToolStopped { .. } => "tool_stopped",
            EventKind::ToolLateResult { .. } => "tool_late_result",
            EventKind::InteractionRequested { .. } => "interaction_requested",
            EventKind::InteractionAnswered { .. } => "interaction_answered",
            EventKind::RuleDecision { .. } => "rule_decision",
            EventKind::InteractionTimedOut { .. } => "interaction_timed_out",
            EventKind::ToolCallDenied { .. } => "tool_call_denied",
            EventKind::BreakerState { .. } => "breaker_state",
            EventKind::ServerState { .. } => "server_state",
            EventKind::CacheHit { .. } => "cache_hit",
            EventKind::HookDecision { .. } => "hook_decision",
            EventKind::QuotaExceeded { .. } => "quota_exceeded",
            EventKind::ToolChanged { .. } => "tool_changed",
            EventKind::ToolAccepted { .. } => "tool_accepted",
        }
    }
}

/// The results of a turn as `turn_end` carries them: serialized as one list either way.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TurnResults {
    /// The engine's own results (no front door asked for another form).
    Results(Vec<Arc<CallResult>>),
    /// What a front door answers with (Anthropic `tool_result` blocks, OpenAI tool messages, ...),
    /// shared with that answer.
    Rendered(Arc<Vec<Value>>),
}

impl TurnResults {
    /// How many results.
    pub fn len(&self) -> usize {
        match self {
            TurnResults::Results(r) => r.len(),
            TurnResults::Rendered(r) => r.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One call of a turn, as `turn_start` lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnCall {
    /// The call.
    pub call_id: CallId,
    /// Its tool.
    pub tool: Arc<str>,
}

/// A typed, sequenced record of something that happened.
///
/// `seq` increases by one per event in a process. Process-level events (`server_state`) have no
/// session; every other event names the session it happened in. On the wire the scope's fields
/// and the kind's sit flat beside `seq` and `ts`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Sequence number, +1 per event in a process.
    pub seq: u64,
    /// When it happened.
    pub ts: Timestamp,
    /// Who it is about.
    #[serde(flatten)]
    pub scope: Arc<EventScope>,
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    #[test]
    fn the_governance_events_read_back_as_written() {
        let scope = Arc::new(EventScope {
            tool: Some("t__echo".into()),
            ..EventScope::default()
        });
        for kind in [
            EventKind::HookDecision {
                hook: "review".into(),
                decision: crate::RuleDecision::Ask,
                duration_ms: 4,
                rewritten: true,
                reason: Some("why".into()),
                failed: true,
                original_args: Some(json!({"a": 1})),
                args: Some(json!({"a": 2})),
            },
            EventKind::QuotaExceeded {
                quota: 1,
                reason: DenyReason::RateLimit,
                bucket: "alice".into(),
                retry_after_ms: 12_000,
            },
            EventKind::ToolChanged {
                server: "t".into(),
                old_digest: "sha256:a".into(),
                new_digest: "sha256:b".into(),
                diff: "-a\n+b\n".into(),
                action: OnToolChange::Block,
            },
            EventKind::ToolAccepted {
                server: "t".into(),
                digest: "sha256:b".into(),
                definition: json!({"description": "x"}),
                by: Some("alice".into()),
            },
        ] {
            let e = Event {
                seq: 3,
                ts: Timestamp::from_unix_millis(0),
                scope: scope.clone(),
                kind,
            };
            let text = serde_json::to_string(&e).unwrap();
            assert!(EVENT_TYPES.contains(&e.kind.name()), "{text}");
            let back: Event = serde_json::from_str(&text).unwrap();
            assert_eq!(back, e, "{text}");
        }
    }

    #[test]
    fn events_serialize_flat_with_their_type() {
        let e = Event {
            seq: 7,
            ts: Timestamp::from_unix_millis(0),
            scope: Arc::new(EventScope {
                principal: Some("alice".into()),
                session_id: Some("s1".into()),
                turn_id: Some("t_1".into()),
                call_id: Some("c1".into()),
                tool: Some("build".into()),
            }),
            kind: EventKind::ToolProgress {
                elapsed_ms: 1500,
                progress: ProgressInfo {
                    progress: Some(3.0),
                    total: Some(10.0),
                    message: None,
                },
            },
        };
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(
            v,
            json!({"seq":7,"ts":"1970-01-01T00:00:00.000Z","principal":"alice","session_id":"s1","turn_id":"t_1",
                   "call_id":"c1","tool":"build","type":"tool_progress","elapsed_ms":1500,
                   "progress":3.0,"total":10.0})
        );
        let back: Event = serde_json::from_value(v).unwrap();
        assert_eq!(back, e);
    }
}
