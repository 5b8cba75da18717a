//! Backend servers' states as they last reported them, with the `toolwarden_server_up` gauge and
//! the `server_state` events that follow each change.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;
use toolwarden_protocol::{EventKind, ServerStateKind};

use crate::events::{EventBus, EventScope};
use crate::metrics::Metrics;

/// A backend server's last reported state.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ServerStatus {
    /// Its state.
    pub state: ServerStateKind,
    /// Why, when it is down.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// Every server's last reported state.
pub(crate) struct Servers {
    statuses: Mutex<BTreeMap<String, ServerStatus>>,
    metrics: Arc<Metrics>,
    bus: Arc<EventBus>,
}

impl Servers {
    pub(crate) fn new(metrics: Arc<Metrics>, bus: Arc<EventBus>) -> Self {
        Self {
            statuses: Mutex::new(BTreeMap::new()),
            metrics,
            bus,
        }
    }

    /// A server reports a state (or, for `restarted`, an event).
    pub(crate) fn report(&self, server: &str, state: ServerStateKind, detail: Option<String>) {
        self.metrics
            .set_server_up(server, state == ServerStateKind::Up);
        self.statuses.lock().insert(
            server.to_owned(),
            ServerStatus {
                state,
                detail: detail.clone(),
            },
        );
        self.bus.emit(
            &Arc::new(EventScope::default()),
            EventKind::ServerState {
                server: server.to_owned(),
                state,
                detail,
            },
        );
    }

    /// Every server's last state, by name.
    pub(crate) fn snapshot(&self) -> BTreeMap<String, ServerStatus> {
        self.statuses.lock().clone()
    }
}
