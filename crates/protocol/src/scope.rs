//! Who an event or an interaction is about: its principal, session, turn, call and tool.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::ids::{CallId, SessionId, TurnId};

/// Who an event (or an interaction) is about. Every event of one call (or of one turn) shares
/// one, by `Arc`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventScope {
    /// Who made the turn (none for events about no call: server states, breakers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<Arc<str>>,
    /// The session (its id is the principal's own: two principals' `s1` are two sessions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<SessionId>,
    /// The turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<TurnId>,
    /// The call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<CallId>,
    /// The tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<Arc<str>>,
}
