//! Backend servers: the ones declared before their first start, their states as they last
//! reported them, the `toolwarden_server_up` gauge and the `server_state` events that follow each
//! change. A call for a tool of a server that is not up yet waits here (see `availability`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;
use toolwarden_protocol::{EventKind, ServerStateKind};

use crate::events::{EventBus, EventScope};
use crate::ids::PREFIX_SEPARATOR;
use crate::metrics::Metrics;

/// A backend server's last reported state.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ServerStatus {
    /// Its state.
    pub state: ServerStateKind,
    /// Why, when it is down.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The MCP revision it was reached in at its last start (`2025-11-25`, `2026-07-28`, ...);
    /// none before its first start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
}

/// A server declared before its start: how long its start may take, and how its tools are named.
#[derive(Clone, Copy, Debug)]
struct Declared {
    startup_timeout: Option<Duration>,
    prefixed: bool,
}

/// A server a call is waiting for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct AwaitedServer {
    pub(crate) name: String,
    pub(crate) startup_timeout: Option<Duration>,
    /// The tool's name within the server.
    pub(crate) tool: String,
}

/// Every server's last reported state.
pub(crate) struct Servers {
    statuses: Mutex<BTreeMap<String, ServerStatus>>,
    declared: Mutex<BTreeMap<String, Declared>>,
    /// Bumped on every report, so that waiting calls look again.
    changed: watch::Sender<u64>,
    metrics: Arc<Metrics>,
    bus: Arc<EventBus>,
}

impl Servers {
    pub(crate) fn new(metrics: Arc<Metrics>, bus: Arc<EventBus>) -> Self {
        Self {
            statuses: Mutex::new(BTreeMap::new()),
            declared: Mutex::new(BTreeMap::new()),
            changed: watch::Sender::new(0),
            metrics,
            bus,
        }
    }

    /// A server is about to start: calls for its tools wait for it while it is not up.
    pub(crate) fn declare(&self, server: &str, startup_timeout: Option<Duration>, prefixed: bool) {
        self.declared.lock().insert(
            server.to_owned(),
            Declared {
                startup_timeout,
                prefixed,
            },
        );
        self.statuses
            .lock()
            .entry(server.to_owned())
            .or_insert(ServerStatus {
                state: ServerStateKind::Starting,
                detail: None,
                protocol: None,
            });
        self.changed.send_modify(|g| *g = g.wrapping_add(1));
    }

    /// A server reports a state (or, for `restarted`, an event).
    pub(crate) fn report(&self, server: &str, state: ServerStateKind, detail: Option<String>) {
        self.metrics
            .set_server_up(server, state == ServerStateKind::Up);
        {
            let mut statuses = self.statuses.lock();
            let entry = statuses.entry(server.to_owned()).or_insert(ServerStatus {
                state,
                detail: None,
                protocol: None,
            });
            entry.state = state;
            entry.detail.clone_from(&detail);
        }
        self.changed.send_modify(|g| *g = g.wrapping_add(1));
        self.bus.emit(
            &Arc::new(EventScope::default()),
            EventKind::ServerState {
                server: server.to_owned(),
                state,
                detail,
            },
        );
    }

    /// The revision `server` was reached in at its last start.
    pub(crate) fn reached_in(&self, server: &str, protocol: &str) {
        let mut statuses = self.statuses.lock();
        let entry = statuses.entry(server.to_owned()).or_insert(ServerStatus {
            state: ServerStateKind::Starting,
            detail: None,
            protocol: None,
        });
        entry.protocol = Some(protocol.to_owned());
    }

    /// Every server's last state, by name.
    pub(crate) fn snapshot(&self) -> BTreeMap<String, ServerStatus> {
        self.statuses.lock().clone()
    }

    /// A server's last state.
    pub(crate) fn status(&self, server: &str) -> Option<ServerStatus> {
        self.statuses.lock().get(server).cloned()
    }

    /// The declared server that `tool` would belong to, while that server is not up: the one
    /// its `SERVER__` prefix names, or — when tools are not prefixed — the only server.
    pub(crate) fn awaited_for(&self, tool: &str) -> Option<AwaitedServer> {
        let declared = self.declared.lock();
        let (name, d, own) = match tool.split_once(PREFIX_SEPARATOR) {
            Some((server, own)) if declared.get(server).is_some_and(|d| d.prefixed) => {
                (server, declared.get(server)?, own)
            }
            _ => {
                let mut unprefixed = declared.iter().filter(|(_, d)| !d.prefixed);
                let (name, d) = unprefixed.next()?;
                (name.as_str(), d, tool)
            }
        };
        let up = self
            .statuses
            .lock()
            .get(name)
            .is_some_and(|s| s.state == ServerStateKind::Up);
        (!up).then(|| AwaitedServer {
            name: name.to_owned(),
            startup_timeout: d.startup_timeout,
            tool: own.to_owned(),
        })
    }

    /// A receiver that sees a change after every declaration and report.
    pub(crate) fn watch(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }
}
