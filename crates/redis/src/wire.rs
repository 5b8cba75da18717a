//! The messages replicas send each other over pub/sub, as JSON.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use toolwarden_protocol::{ActiveTurn, CallId, CancelReason, Event, TurnId};

/// A breaker changed on `replica`.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct BreakerMsg {
    pub(crate) replica: String,
    pub(crate) tool: String,
    /// `Some(ms)`: opened for this long; `None`: closed.
    pub(crate) open_for_ms: Option<u64>,
}

/// An abort that `replica` could not carry out itself; `req` pairs the answers with it.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct AbortMsg {
    pub(crate) replica: String,
    pub(crate) req: u64,
    pub(crate) turn_id: TurnId,
    pub(crate) call_id: Option<CallId>,
    pub(crate) reason: CancelReason,
    /// Only if the turn is this principal's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) only_of: Option<String>,
}

/// `replica` hands a task's answers (`tasks/update`) to whichever replica holds the task, or
/// (`get`) asks it the task's state; `req` pairs the replies with it.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct TaskMsg {
    pub(crate) replica: String,
    pub(crate) req: u64,
    pub(crate) task_id: String,
    pub(crate) principal: String,
    #[serde(default)]
    pub(crate) responses: serde_json::Value,
    /// Asks the task's state instead.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) get: bool,
}

/// `replica` asks every replica for its running turns; `req` pairs the answers with it.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct TurnsAsk {
    pub(crate) replica: String,
    pub(crate) req: u64,
}

/// One replica's answer to an abort (`found`) or to a request for its running turns (`replica`
/// and `turns`).
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct ReplyMsg {
    pub(crate) req: u64,
    #[serde(default)]
    pub(crate) found: bool,
    /// The turn runs there but is not the asker's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) not_yours: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) replica: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) turns: Option<Vec<ActiveTurn>>,
    /// It holds the task, but refused the answers: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) refused: Option<String>,
    /// It holds the task: its state, as `tasks/get` answers it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) task: Option<serde_json::Value>,
}

/// An event of `replica`. `replica` comes first in its JSON: a replica knows its own events
/// back by their first bytes ([`own_events_start`]) without reading the rest.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct EventMsg {
    pub(crate) replica: String,
    pub(crate) event: Arc<Event>,
}

/// How every [`EventMsg`] of `replica` starts.
pub(crate) fn own_events_start(replica: &str) -> Vec<u8> {
    let name = serde_json::to_string(replica).unwrap_or_default();
    format!("{{\"replica\":{name},").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolwarden_protocol::{BreakerStateKind, EventKind, EventScope, Timestamp};

    #[test]
    fn an_event_message_starts_with_its_replica() {
        let event = Arc::new(Event {
            seq: 7,
            ts: Timestamp::from_unix_millis(0),
            scope: Arc::new(EventScope::default()),
            kind: EventKind::BreakerState {
                state: BreakerStateKind::Open,
            },
        });
        for replica in ["a", "replica-\"2\"", "réplica"] {
            let json = serde_json::to_string(&EventMsg {
                replica: replica.to_owned(),
                event: event.clone(),
            })
            .unwrap();
            assert!(
                json.as_bytes().starts_with(&own_events_start(replica)),
                "{json}"
            );
            assert!(!json.as_bytes().starts_with(&own_events_start("b")));
        }
        // A name that begins another's is not mistaken for it.
        assert!(!own_events_start("a2").starts_with(&own_events_start("a")));
    }
}
