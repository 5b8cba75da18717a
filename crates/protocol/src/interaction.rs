//! Interactions: questions to a human, each with a finite deadline (docs/GOVERNANCE.md,
//! "Interactions").

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::InteractionId;
use crate::scope::EventScope;
use crate::time::Timestamp;

/// What is asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InteractionKind {
    /// May this call run? (`approval = "ask"`; default timeout 120 s.)
    Approval,
    /// Confirm a destructive call. (`approval = "confirm"`; default timeout 60 s.)
    Confirm,
    /// A secret a server needs (`env_prompt`; default timeout 120 s).
    Password,
    /// A device-code login (timeout declared by the request, 300–600 s).
    DeviceCode,
}

impl InteractionKind {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            InteractionKind::Approval => "approval",
            InteractionKind::Confirm => "confirm",
            InteractionKind::Password => "password",
            InteractionKind::DeviceCode => "device_code",
        }
    }
}

/// The answer's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InteractionAction {
    /// Allow / provide.
    Approve,
    /// Refuse.
    Deny,
}

/// How an interaction ended (the `outcome` label of `toolwarden_interactions_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InteractionOutcome {
    /// Approved by a human.
    Approved,
    /// Denied by a human.
    Denied,
    /// Its deadline passed.
    TimedOut,
    /// Nothing could answer it and it had no default.
    NoInteractor,
    /// Its call was cancelled while it waited.
    Cancelled,
    /// It followed its declared non-interactive default.
    Defaulted,
}

impl InteractionOutcome {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            InteractionOutcome::Approved => "approved",
            InteractionOutcome::Denied => "denied",
            InteractionOutcome::TimedOut => "timed_out",
            InteractionOutcome::NoInteractor => "no_interactor",
            InteractionOutcome::Cancelled => "cancelled",
            InteractionOutcome::Defaulted => "defaulted",
        }
    }
}

/// A pending question to a human.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Interaction {
    /// Its id (answer with `POST /v1/interactions/{id}`).
    pub id: InteractionId,
    /// What is asked.
    pub kind: InteractionKind,
    /// The question, for a person.
    pub message: String,
    /// The call waiting on it: who made it, its session (the principal's own), turn, id and
    /// tool. On the wire these sit flat beside `message`.
    #[serde(flatten)]
    pub scope: EventScope,
    /// The call's input, for approvals and confirms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    /// Kind-specific details (a device code's `verification_uri` and `user_code`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
    /// Its finite deadline, in milliseconds from `created_at`.
    pub timeout_ms: u64,
    /// When it was asked.
    pub created_at: Timestamp,
    /// When it times out.
    pub deadline: Timestamp,
    /// What happens when nothing can answer (headless); `None` = fail at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_action: Option<InteractionAction>,
}

/// A human's answer. A secret's `value` is never logged, evented or stored.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InteractionAnswer {
    /// Approve or deny.
    pub action: InteractionAction,
    /// The secret for a `password` interaction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Why, when denying.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The principal who answered, when the door knows one (the HTTP API, the dashboard, an
    /// MCP client's elicitation); set by the door, never by the answer's sender.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answerer: Option<String>,
}

impl InteractionAnswer {
    /// An approval with no value.
    pub fn approve() -> Self {
        Self {
            action: InteractionAction::Approve,
            value: None,
            reason: None,
            answerer: None,
        }
    }

    /// A denial with no reason.
    pub fn deny() -> Self {
        Self {
            action: InteractionAction::Deny,
            value: None,
            reason: None,
            answerer: None,
        }
    }
}

impl fmt::Debug for InteractionAnswer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InteractionAnswer")
            .field("action", &self.action)
            .field("value", &self.value.as_ref().map(|_| "<redacted>"))
            .field("reason", &self.reason)
            .field("answerer", &self.answerer)
            .finish()
    }
}
