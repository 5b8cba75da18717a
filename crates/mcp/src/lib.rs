//! toolwarden's MCP side, through the official `rmcp` crate: the client backend — one
//! [`McpServer`] per configured server, over stdio (a child process) or Streamable HTTP — and
//! the [`Gateway`], the MCP server that agents connect to (see [`Gateway`] and
//! `docs/GATEWAY.md`).
//!
//! The backend keeps the promises of `toolwarden_core::backend`'s stop contract towards servers
//! that do not keep theirs:
//!
//! - **Every call carries a progress token** (rmcp's own); the server's progress for it becomes
//!   the call's heartbeat, and progress for finished calls is dropped.
//! - **A cancel names one request.** `notifications/cancelled` goes to that server for that
//!   request only, with the reason, and the backend *keeps listening*: at the forced stop, a
//!   request that was quiet since its cancel stopped cooperatively; one that kept sending progress
//!   (or answering) is stuck, and `on_stuck` decides: abandon it (counted until its late answer
//!   arrives or the server exits) or restart the server (SIGKILL to its whole process group).
//! - **No orphans.** A stdio server runs in its own process group with a parent-death signal
//!   (`toolwarden_process::GroupChild`); every exit path kills the group and reaps the leader.
//! - **Bad output never hangs a call.** A frame guard reads the server's stdout before rmcp: a
//!   line that is not JSON, is oversized or is a malformed answer fails the call it names with a
//!   transport error, and is logged otherwise (see `frame`).
//! - **Crashes and failed starts heal.** A server that exits is restarted with capped
//!   exponential backoff; calls in flight end `Crashed`, or `ServerRestart` when the restart was
//!   ours.
//!
//! The key design choice: **the cancel is sent as a raw `notifications/cancelled`** (rmcp's
//! `CustomNotification`), not through rmcp's typed cancel. rmcp's typed cancel resolves the
//! pending request at once and throws away whatever the server sends for it afterwards — but a
//! late answer is exactly the evidence the stuck rules need (and what ends an abandoned call).
//! On the wire the two are identical.
//!
//! `docs/MCP-BACKEND.md` has the full rules: starts and restarts, what counts as crashed,
//! transport or rejected, the stuck rules, what rmcp does with bad frames, and every decision
//! the spec leaves open.
#![deny(missing_docs)]

mod call;
mod convert;
mod forward;
mod frame;
mod gateway;
mod link;
mod router;
mod session;
mod supervisor;

use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use rmcp::model::{ServerPeerInfo, Tool};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use toolwarden_core::protocol::{ServerConfig, ServerStateKind, ToolSpec};
use toolwarden_core::{Attempt, AttemptEnd, Backend, BackendHost, BoxFuture};

use crate::session::{Conn, Endpoint};

pub use gateway::{
    ELICITATION_INTERACTOR, Gateway, GatewayConnection, GatewayError, GatewayHttpService,
    GatewayOptions, HttpSessions, STATUS_TOOL,
};

/// Default cap of a server's start-up (spawn or connect, `initialize`, `tools/list`).
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(20);

/// Tunables of the backend that the config file does not expose.
#[derive(Clone, Debug)]
pub struct McpOptions {
    /// First delay before restarting a server that crashed or failed to start (default 1 s).
    pub restart_backoff_initial: Duration,
    /// Cap of the restart delay, which doubles per consecutive failure (default 30 s).
    pub restart_backoff_max: Duration,
    /// A server that stayed up this long starts its backoff afresh after a crash (default 60 s).
    pub backoff_reset_after: Duration,
    /// Largest message accepted from a server (default 16 MiB, rmcp's own line limit); a
    /// larger one fails the call it answers.
    pub max_message_bytes: usize,
    /// Tell servers that their client supports sampling, elicitation (form and URL) and roots
    /// (default `true`), so that the [`Gateway`] can forward those requests to its own clients.
    /// With no gateway client able to answer, such a request gets a JSON-RPC error saying so.
    /// Set it to `false` for servers that no gateway serves.
    pub forward_client_features: bool,
}

impl Default for McpOptions {
    fn default() -> Self {
        Self {
            restart_backoff_initial: Duration::from_secs(1),
            restart_backoff_max: Duration::from_secs(30),
            backoff_reset_after: Duration::from_secs(60),
            max_message_bytes: 16 * 1024 * 1024,
            forward_client_features: true,
        }
    }
}

/// Why [`McpServer::wait_ready`] gave up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadyError {
    /// The start-up attempt failed (the server keeps being retried in the background).
    #[error("MCP server {server:?} failed to start: {detail}")]
    Down {
        /// The server.
        server: String,
        /// Why.
        detail: String,
    },
    /// The server was still starting when the wait timed out.
    #[error("MCP server {server:?} was not up within {timeout:?}")]
    Timeout {
        /// The server.
        server: String,
        /// How long was waited.
        timeout: Duration,
    },
    /// The server was shut down.
    #[error("MCP server {server:?} is shut down")]
    ShutDown {
        /// The server.
        server: String,
    },
}

/// What the server's state watchers see.
#[derive(Clone)]
pub(crate) struct Snapshot {
    kind: ServerStateKind,
    detail: Option<String>,
    /// The live connection while `Up`.
    conn: Option<Arc<Conn>>,
    /// Start attempts begun so far.
    starts: u64,
    /// Down for good (a config error): no start attempt will follow.
    permanent: bool,
    shut_down: bool,
}

/// Asks the supervisor to kill and restart the server of connection `generation`.
pub(crate) struct RestartRequest {
    generation: u64,
    reason: String,
    /// Answered once the old process group is dead.
    done: oneshot::Sender<()>,
}

/// State shared by an [`McpServer`], its supervisor task and its calls.
pub(crate) struct Shared {
    name: Arc<str>,
    host: Arc<dyn BackendHost>,
    opts: McpOptions,
    endpoint: Result<Endpoint, String>,
    startup_timeout: Option<Duration>,
    me: Weak<McpServer>,
    state: watch::Sender<Snapshot>,
    shutdown: CancellationToken,
    restart_tx: mpsc::UnboundedSender<RestartRequest>,
    abandoned: Mutex<u64>,
    /// Watchers of abandoned calls.
    tasks: TaskTracker,
    finished: watch::Sender<bool>,
    /// Where the server's requests and notifications for its client go.
    link: Arc<link::Link>,
    /// The tools as the server last listed them (rmcp's own type: titles, icons, `_meta`).
    raw_tools: Mutex<Arc<Vec<Tool>>>,
    /// What the server said about itself at its last `initialize`.
    info: Mutex<Option<Arc<ServerPeerInfo>>>,
}

impl Shared {
    fn set_state(&self, kind: ServerStateKind, detail: Option<String>, conn: Option<Arc<Conn>>) {
        match &detail {
            Some(d) if kind == ServerStateKind::Down => {
                tracing::warn!(server = %self.name, detail = %d, "MCP server down")
            }
            _ => {
                tracing::info!(server = %self.name, state = ?kind, detail = ?detail, "MCP server state")
            }
        }
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
    fn event(&self, kind: ServerStateKind, detail: Option<String>) {
        tracing::info!(server = %self.name, state = ?kind, detail = ?detail, "MCP server event");
        self.host.server_state(&self.name, kind, detail);
    }

    fn publish_tools(&self, tools: Vec<Tool>) {
        let specs: Vec<ToolSpec> = tools.iter().map(convert::tool_spec).collect();
        *self.raw_tools.lock() = Arc::new(tools);
        if let Some(me) = self.me.upgrade() {
            self.host.set_tools(&self.name, me, specs);
        }
    }

    /// Counts one more (`+1`) or one fewer (`-1`) abandoned call and reports the total.
    fn add_abandoned(&self, delta: i64) {
        let mut n = self.abandoned.lock();
        *n = n.saturating_add_signed(delta);
        self.host.set_abandoned(&self.name, *n);
    }
}

/// One configured MCP server. Implements [`Backend`]: attempts name tools without the
/// `SERVER__` prefix.
pub struct McpServer {
    shared: Arc<Shared>,
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
        let endpoint = Endpoint::from_config(&cfg, &base_dir);
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
            shared: Arc::new(Shared {
                name: name.into(),
                host,
                opts,
                endpoint,
                startup_timeout,
                me: me.clone(),
                state: watch::Sender::new(Snapshot {
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

    /// Waits until the server is up, or until its current (or, while it is down, its next)
    /// start-up attempt fails, or `timeout`.
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
