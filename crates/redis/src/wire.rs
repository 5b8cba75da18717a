//! The messages replicas send each other over pub/sub, as JSON.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use toolwarden_protocol::{CallId, CancelReason, Event, TurnId};

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
}

/// One replica's answer to an abort.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ReplyMsg {
    pub(crate) req: u64,
    pub(crate) found: bool,
}

/// An event of `replica`.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct EventMsg {
    pub(crate) replica: String,
    pub(crate) event: Arc<Event>,
}
