//! The client backend: one [`McpServer`] per configured server, the handle the engine calls
//! tools through and the gateway forwards through. This file is that handle and nothing else;
//! the work is below it — `supervisor` keeps the server running, `call` runs one attempt,
//! `forward` passes the gateway's other requests on, `session` is one connection to the
//! server, and `frame` guards a stdio server's output.

mod call;
mod call_table;
mod convert;
mod forward;
mod frame;
mod handler;
mod in_order;
mod input;
pub(crate) mod link;
mod listen;
mod options;
mod server_core;
mod session;
mod supervisor;
mod task;

use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use rmcp::ErrorData;
use rmcp::model::{
    ClientNotification, ClientRequest, RequestMetaObject, ServerPeerInfo, ServerResult, Tool,
};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use toolwarden_core::{Attempt, AttemptEnd, Backend, BackendHost, BoxFuture};
use toolwarden_protocol::{ServerConfig, ServerStateKind};

pub(crate) use forward::Deadline;
pub use options::{DEFAULT_STARTUP_TIMEOUT, McpOptions, ReadyError};

use link::Upstream;
use server_core::{ServerCore, StateView, Wanted};
use session::{Endpoint, Protocol};

/// One configured MCP server. Implements [`Backend`]: attempts name tools without the
/// `SERVER__` prefix.
pub struct McpServer {
    shared: Arc<ServerCore>,
}

impl McpServer {
    /// Starts connecting in the background and returns at once; state and tools reach `host`.
    /// `cfg`'s `${VAR}`s are already expanded; relative paths in it are taken from `base_dir`.
    pub fn start(
        name: String,
        cfg: ServerConfig,
        host: Arc<dyn BackendHost>,
        base_dir: PathBuf,
    ) -> Arc<McpServer> {
        Self::start_with(name, cfg, host, base_dir, McpOptions::default())
    }

    /// [`start`](Self::start) with explicit [`McpOptions`].
    pub fn start_with(
        name: String,
        cfg: ServerConfig,
        host: Arc<dyn BackendHost>,
        base_dir: PathBuf,
        opts: McpOptions,
    ) -> Arc<McpServer> {
        let protocol = Protocol::from_config(cfg.protocol.as_deref());
        let endpoint = match &protocol {
            Ok(_) => Endpoint::from_config(&cfg, &base_dir),
            Err(e) => Err(e.clone()),
        };
        let startup_timeout = match cfg.startup_timeout {
            None => Some(DEFAULT_STARTUP_TIMEOUT),
            Some(d) if d.duration().is_zero() => None,
            Some(d) => Some(d.duration()),
        };
        if endpoint.is_ok() {
            host.server_declared(&name, startup_timeout);
        }
        let (restart_tx, restart_rx) = mpsc::unbounded_channel();
        let server = Arc::new_cyclic(|me| McpServer {
            shared: Arc::new(ServerCore {
                name: name.into(),
                host,
                opts,
                endpoint,
                protocol: protocol.unwrap_or(Protocol::Auto),
                startup_timeout,
                me: me.clone() as Weak<dyn Backend>,
                state: watch::Sender::new(StateView {
                    kind: ServerStateKind::Starting,
                    detail: None,
                    conn: None,
                    starts: 0,
                    permanent: false,
                    shut_down: false,
                }),
                shutdown: CancellationToken::new(),
                restart_tx,
                abandoned: Mutex::new(0),
                tasks: TaskTracker::new(),
                finished: watch::Sender::new(false),
                link: Arc::default(),
                raw_tools: Mutex::default(),
                info: Mutex::new(None),
                wanted: Wanted::default(),
            }),
        });
        tokio::spawn(supervisor::supervise(server.shared.clone(), restart_rx));
        server
    }

    /// The server's name.
    pub fn server_name(&self) -> &str {
        &self.shared.name
    }

    /// The server's state now: `starting`, `up` or `down` (`restarted` is only an event).
    pub fn state(&self) -> ServerStateKind {
        self.shared.state.borrow().kind
    }

    /// How many of its calls are abandoned right now.
    pub fn abandoned(&self) -> u64 {
        *self.shared.abandoned.lock()
    }

    /// Waits until the server's first start has ended, up or not (or it is shut down), so that
    /// a list made afterwards holds its tools if it could give them. The start itself is bounded
    /// by its `startup_timeout`; this wait too, or by [`DEFAULT_STARTUP_TIMEOUT`] when the start
    /// is uncapped, so that no list waits for ever.
    pub async fn first_start(&self) {
        // The state is `starting` from the server's making through its first attempt (one
        // that cannot even be tried, a bad definition, goes `failed` at once); a second attempt
        // means the first has ended.
        let ended =
            |s: &StateView| s.shut_down || s.kind != ServerStateKind::Starting || s.starts > 1;
        let mut rx = self.shared.state.subscribe();
        if ended(&rx.borrow()) {
            return;
        }
        let bound = self
            .shared
            .startup_timeout
            .unwrap_or(DEFAULT_STARTUP_TIMEOUT)
            + Duration::from_secs(1);
        let _ = tokio::time::timeout(bound, rx.wait_for(ended)).await;
    }

    /// Waits until the server is up, or until its current (or, while it is down, its next)
    /// start-up attempt fails, or `timeout`. A server that cannot start (`failed`) fails the
    /// wait at once.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<(), ReadyError> {
        let server = self.shared.name.to_string();
        let mut rx = self.shared.state.subscribe();
        let first = rx.borrow().clone();
        let waited = tokio::time::timeout(timeout, async {
            let mut snap = first.clone();
            loop {
                if snap.shut_down {
                    return Err(ReadyError::ShutDown { server });
                }
                let live = snap.conn.as_ref().is_some_and(|c| c.end().is_none());
                match snap.kind {
                    // Up, unless its connection just ended (the state follows in a moment).
                    ServerStateKind::Up if live => return Ok(()),
                    // A server that cannot start fails the wait at once.
                    ServerStateKind::Failed => {
                        return Err(ReadyError::Down {
                            server,
                            detail: snap.detail.unwrap_or_default(),
                        });
                    }
                    // A failure counts once a start attempt began after (or was under way
                    // when) we started waiting.
                    ServerStateKind::Down
                        if snap.starts > first.starts || first.kind != ServerStateKind::Down =>
                    {
                        return Err(ReadyError::Down {
                            server,
                            detail: snap.detail.unwrap_or_default(),
                        });
                    }
                    _ => {}
                }
                if rx.changed().await.is_err() {
                    return Err(ReadyError::ShutDown { server });
                }
                snap = rx.borrow_and_update().clone();
            }
        })
        .await;
        waited.unwrap_or_else(|_| {
            Err(ReadyError::Timeout {
                server: self.shared.name.to_string(),
                timeout,
            })
        })
    }

    /// Cancels the calls in flight, closes the connection, kills the process group and reaps
    /// it; returns when all of that is done. Idempotent.
    pub async fn shutdown(&self) {
        self.shared.shutdown.cancel();
        let mut finished = self.shared.finished.subscribe();
        let _ = finished.wait_for(|done| *done).await;
        self.shared.tasks.close();
        self.shared.tasks.wait().await;
    }
    /// Attaches where the server's own requests and notifications for its client go.
    pub(crate) fn attach(&self, upstream: Weak<dyn Upstream>) {
        self.shared.link.attach(upstream);
    }

    /// What the server said about itself at its last `initialize` (capabilities,
    /// instructions), if it was ever up.
    pub(crate) fn info(&self) -> Option<Arc<ServerPeerInfo>> {
        self.shared.info.lock().clone()
    }

    /// The tools as the server last listed them.
    pub(crate) fn raw_tools(&self) -> Arc<Vec<Tool>> {
        self.shared.raw_tools.lock().clone()
    }

    /// Sends `request` on the live connection (waiting while the server is starting) and
    /// returns its answer. A JSON-RPC error from the server comes back unchanged. When
    /// `cancel` fires first, the server gets `notifications/cancelled` for the request. No
    /// answer by `until` (the wait for a starting server included): a JSON-RPC error with
    /// code -32001, and the server gets `notifications/cancelled`.
    ///
    /// Not an `async fn`: that would keep a second copy of `request` (some hundred bytes) in
    /// every future that forwards one, and every request handler of the gateway is as large as
    /// its largest.
    pub(crate) fn request(
        &self,
        request: ClientRequest,
        meta: RequestMetaObject,
        cancel: &CancellationToken,
        until: Deadline,
    ) -> impl Future<Output = Result<ServerResult, ErrorData>> {
        forward::request(&self.shared, request, meta, cancel, until)
    }

    /// Sends a notification if the server is up; drops it otherwise.
    pub(crate) fn notify(&self, notification: ClientNotification) -> impl Future<Output = ()> {
        forward::notify(&self.shared, notification)
    }
}

impl Drop for McpServer {
    fn drop(&mut self) {
        // The supervisor notices and kills the process group.
        self.shared.shutdown.cancel();
    }
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("name", &self.shared.name)
            .field("state", &self.state())
            .finish()
    }
}

impl Backend for McpServer {
    fn name(&self) -> &str {
        &self.shared.name
    }

    fn start(&self, attempt: Attempt) -> BoxFuture<AttemptEnd> {
        Box::pin(call::run(self.shared.clone(), attempt))
    }
}
