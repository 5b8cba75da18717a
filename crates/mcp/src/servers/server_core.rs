//! What an [`McpServer`](super::McpServer), its supervisor task and its calls share of one
//! server ([`ServerCore`]): the server's state as watchers see it ([`StateView`]), its live
//! connection, and the reports to the host. It sits below all three so that each can read it
//! without reaching back into the others.

use std::collections::BTreeSet;
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use rmcp::model::{ServerPeerInfo, SubscriptionFilter, Tool};
use tokio::sync::{Notify, mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use toolwarden_core::{AttemptError, Backend, BackendHost};
use toolwarden_protocol::{ServerStateKind, ToolSpec};

use super::convert;
use super::link::Link;
use super::options::McpOptions;
use super::session::{Conn, Endpoint, Protocol};

/// What the server's state watchers see.
#[derive(Clone)]
pub(super) struct StateView {
    pub(super) kind: ServerStateKind,
    pub(super) detail: Option<String>,
    /// The live connection while `Up`.
    pub(super) conn: Option<Arc<Conn>>,
    /// Start attempts begun so far.
    pub(super) starts: u64,
    /// Failed for good (a config error): no start attempt will follow.
    pub(super) permanent: bool,
    pub(super) shut_down: bool,
}

/// Asks the supervisor to kill and restart the server of connection `generation`.
pub(super) struct RestartRequest {
    pub(super) generation: u64,
    pub(super) reason: String,
    /// Answered once the old process group is dead.
    pub(super) done: oneshot::Sender<()>,
}

/// State shared by an [`McpServer`](super::McpServer), its supervisor task and its calls.
pub(super) struct ServerCore {
    pub(super) name: Arc<str>,
    pub(super) host: Arc<dyn BackendHost>,
    pub(super) opts: McpOptions,
    pub(super) endpoint: Result<Endpoint, String>,
    /// Which revision to speak to it (`protocol`).
    pub(super) protocol: Protocol,
    pub(super) startup_timeout: Option<Duration>,
    /// The server itself, as the backend the host is given with its tools.
    pub(super) me: Weak<dyn Backend>,
    pub(super) state: watch::Sender<StateView>,
    pub(super) shutdown: CancellationToken,
    pub(super) restart_tx: mpsc::UnboundedSender<RestartRequest>,
    pub(super) abandoned: Mutex<u64>,
    /// Watchers of abandoned calls.
    pub(super) tasks: TaskTracker,
    pub(super) finished: watch::Sender<bool>,
    /// Where the server's requests and notifications for its client go.
    pub(super) link: Arc<Link>,
    /// The tools as the server last listed them (rmcp's own type: titles, icons, `_meta`).
    pub(super) raw_tools: Mutex<Arc<Vec<Tool>>>,
    /// What the server said about itself at its last `initialize`.
    pub(super) info: Mutex<Option<Arc<ServerPeerInfo>>>,
    /// The resources its clients are subscribed to, for a 2026-07-28 connection's stream.
    pub(super) wanted: Wanted,
}

impl ServerCore {
    pub(super) fn set_state(
        &self,
        kind: ServerStateKind,
        detail: Option<String>,
        conn: Option<Arc<Conn>>,
    ) {
        // The host reports state changes (the binary prints one line each): debug here.
        tracing::debug!(server = %self.name, state = ?kind, detail = ?detail, "MCP server state");
        self.state.send_modify(|s| {
            s.kind = kind;
            s.detail = detail.clone();
            s.conn = conn;
            if kind == ServerStateKind::Starting {
                s.starts += 1;
            }
        });
        self.host.server_state(&self.name, kind, detail);
    }

    /// Reports an event without changing the state kind (`restarted`).
    pub(super) fn event(&self, kind: ServerStateKind, detail: Option<String>) {
        tracing::debug!(server = %self.name, state = ?kind, detail = ?detail, "MCP server event");
        self.host.server_state(&self.name, kind, detail);
    }

    pub(super) fn publish_tools(&self, tools: Vec<Tool>) {
        let specs: Vec<ToolSpec> = tools.iter().map(convert::tool_spec).collect();
        *self.raw_tools.lock() = Arc::new(tools);
        if let Some(me) = self.me.upgrade() {
            self.host.set_tools(&self.name, me, specs);
        }
    }

    /// Counts one more (`+1`) or one fewer (`-1`) abandoned call and reports the total.
    pub(super) fn add_abandoned(&self, delta: i64) {
        let mut n = self.abandoned.lock();
        *n = n.saturating_add_signed(delta);
        self.host.set_abandoned(&self.name, *n);
    }

    /// The live connection, waiting while the server is starting or restarting — at most its
    /// `startup_timeout` (the call's own deadlines and stop apply too). A server that cannot
    /// start (`failed`: a bad config, a command that cannot run) or is shut down fails at once.
    pub(super) async fn ready_conn(&self) -> Result<Arc<Conn>, AttemptError> {
        let mut rx = self.state.subscribe();
        let deadline = self.startup_timeout.map(|t| Instant::now() + t);
        // Why it was down the last time it was, for the error when the wait ends.
        let mut why: Option<String> = None;
        loop {
            {
                let snap = rx.borrow_and_update();
                if snap.kind == ServerStateKind::Down && snap.detail.is_some() {
                    why.clone_from(&snap.detail);
                }
                if snap.shut_down {
                    return Err(AttemptError::Transport(format!(
                        "MCP server {:?} is shut down",
                        self.name
                    )));
                }
                match (snap.kind, &snap.conn) {
                    (ServerStateKind::Up, Some(conn)) if conn.end().is_none() => {
                        return Ok(conn.clone());
                    }
                    (ServerStateKind::Failed, _) => {
                        return Err(AttemptError::Unavailable(toolwarden_core::cannot_start(
                            &self.name,
                            snap.detail.as_deref().unwrap_or("unknown reason"),
                        )));
                    }
                    _ => {}
                }
            }
            let changed = tokio::select! {
                changed = rx.changed() => changed.is_ok(),
                () = async {
                    match deadline {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                } => {
                    return Err(AttemptError::Transport(format!(
                        "MCP server {:?} was not up within {}{}",
                        self.name,
                        toolwarden_protocol::format_duration(self.startup_timeout.unwrap_or_default()),
                        why.map(|d| format!(": {d}")).unwrap_or_default()
                    )));
                }
            };
            if !changed {
                return Err(AttemptError::Transport(format!(
                    "MCP server {:?} is gone",
                    self.name
                )));
            }
        }
    }
}

/// The resources a server's clients are subscribed to, whichever connection serves them
/// (restarts included), and those the open stream was acknowledged for.
pub(crate) struct Wanted {
    uris: Mutex<BTreeSet<String>>,
    pub(super) changed: Notify,
    /// The resources the server acknowledged on the open stream (empty while none is open).
    pub(super) acknowledged: watch::Sender<BTreeSet<String>>,
}

impl Default for Wanted {
    fn default() -> Self {
        Self {
            uris: Mutex::default(),
            changed: Notify::new(),
            acknowledged: watch::Sender::new(BTreeSet::new()),
        }
    }
}

impl Wanted {
    /// Subscribes to `uri` (again: a renewal after a restart changes nothing).
    pub(crate) fn add(&self, uri: &str) {
        if self.uris.lock().insert(uri.to_owned()) {
            self.changed.notify_waiters();
        }
    }

    /// Unsubscribes from `uri`.
    pub(crate) fn remove(&self, uri: &str) {
        if self.uris.lock().remove(uri) {
            self.changed.notify_waiters();
        }
    }

    /// Waits until the server acknowledged `uri` on the open stream (its updates flow from
    /// then on).
    pub(crate) async fn acknowledged(&self, uri: &str) {
        let mut rx = self.acknowledged.subscribe();
        let _ = rx.wait_for(|uris| uris.contains(uri)).await;
    }

    /// What the connection's stream asks for: every list change, and the resources wanted.
    pub(super) fn filter(&self) -> SubscriptionFilter {
        let uris: Vec<String> = self.uris.lock().iter().cloned().collect();
        let builder = SubscriptionFilter::builder()
            .tools_list_changed()
            .prompts_list_changed()
            .resources_list_changed();
        if uris.is_empty() {
            builder.build()
        } else {
            builder.resource_subscriptions(uris).build()
        }
    }
}
