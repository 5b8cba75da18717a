//! The MCP gateway: the server side that agents connect to.
//!
//! An MCP client (Claude Desktop, Claude Code, Cursor, ...) connects to the gateway over stdio
//! ([`Gateway::serve_stdio`]) or Streamable HTTP ([`Gateway::http_service`]) instead of to its
//! MCP servers. Every `tools/call` becomes a one-call turn of the [`Engine`] in the client's
//! session, so it is governed: it has deadlines, it can be cancelled, and it ends in exactly
//! one typed outcome, returned as a `CallToolResult` (failures with `isError: true` and the
//! outcome in `_meta["toolwarden/outcome"]`, never as JSON-RPC errors). Everything else —
//! resources, prompts, completion, logging, and the servers' own requests (sampling,
//! elicitation, roots) and notifications — passes through.
//!
//! The key design choice: **one session per connection, and each call's requests ride its
//! own handler task.** A connection (a stdio pipe pair, or one `Mcp-Session-Id`) is one
//! toolwarden session, ended with `client_disconnect` the moment the client goes away. A call's
//! handler task relays its progress under the client's own token, and sends the questions
//! raised during the call (an approval, a server's sampling request) itself, so that over
//! Streamable HTTP they travel on that call's response stream, where the client expects them.
//!
//! `docs/GATEWAY.md` has the full rules: routing, sessions, progress and cancel mapping,
//! approvals through elicitation, and every decision the spec leaves open.

mod call;
mod channel;
mod completion;
mod convert;
mod elicit;
mod fast;
mod handler;
mod http;
mod http_sessions;
mod options;
mod passthrough;
mod prompts;
mod resources;
mod route_table;
mod session;
mod status;
mod stdio;
mod upstream;
mod watch;

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use rmcp::model::{ClientRequest, RequestMetaObject, ServerNotification, Tool};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use toolwarden_core::Engine;
use toolwarden_protocol::{CancelReason, EventKind, ServerStateKind, SessionId};

use crate::McpServer;
use crate::client::link::Upstream;

pub use handler::GatewayConnection;
pub use http::GatewayHttpService;
pub use http_sessions::HttpSessions;
pub use options::{ELICITATION_INTERACTOR, GatewayOptions, STATUS_TOOL};
pub use stdio::GatewayError;

use elicit::{ElicitationInteractor, Elicitations};
use route_table::RouteTable;
use session::{ClientSession, Recency};

/// The MCP gateway: the server side agents connect to. One serves any number of clients, over
/// stdio ([`serve_stdio`](Self::serve_stdio), [`serve_io`](Self::serve_io)) and Streamable HTTP
/// ([`http_service`](Self::http_service)) at once.
///
/// Every `tools/call` becomes a one-call turn of the [`Engine`] in the client's session, so it
/// has deadlines, can be cancelled, and ends in exactly one typed outcome, returned as a
/// `CallToolResult` (failures with `isError: true` and the outcome in
/// `_meta["toolwarden/outcome"]`, never as JSON-RPC errors). Everything else passes through.
///
/// The key design choice: **one session per connection, and each call's messages ride its own
/// handler task.** A connection (a stdio pipe pair, one `Mcp-Session-Id`) is one toolwarden
/// session, ended with `client_disconnect` the moment the client goes away. A call's handler
/// relays its progress under the client's own token, and sends the requests raised during the
/// call (an approval, a server's sampling request) itself, so that over Streamable HTTP they
/// travel on that call's response stream, where the client expects them.
pub struct Gateway {
    engine: Engine,
    servers: Vec<Arc<McpServer>>,
    opts: GatewayOptions,
    /// Live client sessions by toolwarden session id.
    sessions: Mutex<HashMap<SessionId, Weak<ClientSession>>>,
    /// Live Streamable HTTP sessions by `Mcp-Session-Id`.
    http_sessions: Mutex<HashMap<String, Weak<ClientSession>>>,
    /// Which server serves each exposed tool, and the list last sent to clients.
    tool_view: Mutex<ToolView>,
    /// Where resources, templates and prompts live.
    routes: RouteTable,
    /// Per server, the client that most recently called one of its tools.
    last_client: Mutex<HashMap<Arc<str>, Weak<ClientSession>>>,
    /// Orders calls and sessions by recency.
    recency: Arc<Recency>,
    closed: CancellationToken,
    tasks: TaskTracker,
}

#[derive(Default)]
struct ToolView {
    /// Every exposed tool, with the MCP server that serves it (none for `exec` and in-process).
    backends: HashMap<String, Option<Arc<str>>>,
    listed: Option<Arc<Vec<Tool>>>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field(
                "servers",
                &self
                    .servers
                    .iter()
                    .map(|s| s.server_name())
                    .collect::<Vec<_>>(),
            )
            .field("sessions", &self.sessions.lock().len())
            .finish_non_exhaustive()
    }
}

impl Gateway {
    /// A gateway over `engine` and its MCP `servers`. Call it within a Tokio runtime: it
    /// starts two background tasks (tool-list changes, engine events), which end when the
    /// gateway is dropped. It attaches itself to the servers (their requests and notifications
    /// for a client come here) and an elicitation interactor to the engine.
    pub fn new(engine: Engine, servers: Vec<Arc<McpServer>>, opts: GatewayOptions) -> Arc<Gateway> {
        let gateway = Arc::new(Gateway {
            engine,
            servers,
            opts,
            sessions: Mutex::default(),
            http_sessions: Mutex::default(),
            tool_view: Mutex::default(),
            routes: RouteTable::default(),
            last_client: Mutex::default(),
            recency: Arc::new(Recency::new()),
            closed: CancellationToken::new(),
            tasks: TaskTracker::new(),
        });
        let upstream: Weak<dyn Upstream> = Arc::downgrade(&gateway) as Weak<dyn Upstream>;
        for server in &gateway.servers {
            server.attach(upstream.clone());
        }
        let elicitations = Arc::new(Elicitations::default());
        gateway
            .engine
            .interactions()
            .attach(Arc::new(ElicitationInteractor::new(
                Arc::downgrade(&gateway),
                elicitations.clone(),
            )));
        gateway.refresh_tool_view();
        gateway.tasks.spawn(watch::tools(
            Arc::downgrade(&gateway),
            gateway.engine.tools_changed(),
            gateway.closed.clone(),
        ));
        let eliciting = elicitations.clone();
        gateway.tasks.spawn(watch::events(
            Arc::downgrade(&gateway),
            elicitations,
            // Only the events it acts on wake it (not four per call).
            gateway
                .engine
                .events()
                .subscribe_matching(move |event| match &event.kind {
                    EventKind::InteractionAnswered { .. }
                    | EventKind::InteractionTimedOut { .. } => true,
                    EventKind::ToolResult { .. } => eliciting.any(),
                    EventKind::ServerState { state, .. } => *state == ServerStateKind::Restarted,
                    _ => false,
                }),
            gateway.closed.clone(),
        ));
        gateway
    }

    /// The engine it governs with.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// How many clients are connected.
    pub fn clients(&self) -> usize {
        self.sessions
            .lock()
            .values()
            .filter(|s| s.strong_count() > 0)
            .count()
    }

    /// The toolwarden session ids of the connected clients.
    pub fn client_sessions(&self) -> Vec<SessionId> {
        self.sessions
            .lock()
            .iter()
            .filter(|(_, s)| s.strong_count() > 0)
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Serves one MCP client over this process's stdin and stdout until it disconnects or
    /// `shutdown` fires. Nothing else may write to stdout; log to stderr.
    pub async fn serve_stdio(
        self: &Arc<Self>,
        shutdown: CancellationToken,
    ) -> Result<(), GatewayError> {
        // Pipes (how MCP clients start their servers) are read and written through the event
        // loop; tokio's stdin/stdout hand every read and write to a blocking thread, which costs
        // a thread switch per message each way. Anything else (a file, a terminal) falls back.
        match toolwarden_process::stdio_pipes() {
            Some((read, write)) => self.serve_io(read, write, shutdown).await,
            None => {
                self.serve_io(tokio::io::stdin(), tokio::io::stdout(), shutdown)
                    .await
            }
        }
    }

    /// Serves one MCP client over a byte stream pair (newline-delimited JSON-RPC, as on
    /// stdio) until the client closes `read` or `shutdown` fires. When the client goes away,
    /// its running calls end `cancelled{client_disconnect}` at once; at `shutdown`,
    /// `cancelled{shutdown}`.
    pub async fn serve_io<R, W>(
        self: &Arc<Self>,
        read: R,
        write: W,
        shutdown: CancellationToken,
    ) -> Result<(), GatewayError>
    where
        R: AsyncRead + Send + Unpin + 'static,
        W: AsyncWrite + Send + Unpin + 'static,
    {
        stdio::serve(self, read, write, shutdown).await
    }

    /// A Streamable HTTP service for `/mcp` (a tower `Service`; the binary mounts it, e.g.
    /// with axum's `Router::nest_service`, and puts Host/Origin checks in front). One MCP
    /// session (`Mcp-Session-Id`) is one toolwarden session. At `shutdown`, every session
    /// ends (running calls `cancelled{shutdown}`) and every stream closes.
    pub fn http_service(self: &Arc<Self>, shutdown: CancellationToken) -> GatewayHttpService {
        http::service(self, shutdown)
    }

    fn next_seq(&self) -> u64 {
        self.recency.next()
    }

    /// A session for a new connection, served until `shutdown`.
    fn new_session(&self, shutdown: CancellationToken) -> Arc<ClientSession> {
        ClientSession::new(self.recency.clone(), self.tasks.clone(), shutdown)
    }

    fn server(&self, name: &str) -> Option<&Arc<McpServer>> {
        self.servers.iter().find(|s| s.server_name() == name)
    }

    /// A session whose `initialize` succeeded.
    fn register(&self, session: &Arc<ClientSession>) {
        self.sessions
            .lock()
            .insert(session.id.clone(), Arc::downgrade(session));
        if let Some(http) = session.http_id() {
            self.http_sessions
                .lock()
                .insert(http.to_owned(), Arc::downgrade(session));
        }
        tracing::info!(session = %session.id, http_session = ?session.http_id(), "MCP client connected");
    }

    /// Ends a session: its running calls end `cancelled{reason}` at once, it leaves the
    /// registry, and its subscriptions go. Idempotent.
    fn end_session(&self, session: &ClientSession, reason: CancelReason) {
        if !session.mark_ended(reason) {
            return;
        }
        self.engine.end_session(&session.id, reason);
        self.sessions.lock().remove(&session.id);
        if let Some(http) = session.http_id() {
            self.http_sessions.lock().remove(http);
        }
        for (uri, server) in self.routes.forget_session(&session.id) {
            // It was the last subscriber: the server is unsubscribed.
            if let Some(server) = self.server(&server).cloned() {
                self.tasks.spawn(unsubscribe(server, uri));
            }
        }
    }

    /// Live sessions, most recently active first.
    fn live_sessions(&self) -> Vec<Arc<ClientSession>> {
        let mut live: Vec<Arc<ClientSession>> = self
            .sessions
            .lock()
            .values()
            .filter_map(Weak::upgrade)
            .filter(|s| !s.is_ended())
            .collect();
        live.sort_by_key(|s| std::cmp::Reverse(s.last_active()));
        live
    }

    fn session(&self, id: &SessionId) -> Option<Arc<ClientSession>> {
        self.sessions.lock().get(id).and_then(Weak::upgrade)
    }

    fn http_session(&self, id: &str) -> Option<Arc<ClientSession>> {
        self.http_sessions.lock().get(id).and_then(Weak::upgrade)
    }

    /// Sends a notification to every live client.
    fn broadcast(&self, notification: ServerNotification) {
        for session in self.live_sessions() {
            session.notify(notification.clone());
        }
    }

    /// The server that serves an exposed tool, if an MCP server does.
    fn backend_of(&self, tool: &str) -> Option<Arc<str>> {
        if let Some(server) = self.tool_view.lock().backends.get(tool) {
            return server.clone();
        }
        // A tool registered since the last look (or none at all).
        self.refresh_tool_view();
        self.tool_view.lock().backends.get(tool).cloned().flatten()
    }

    /// Re-reads which server serves which tool; returns the list clients would see now.
    fn refresh_tool_view(&self) -> Arc<Vec<Tool>> {
        let infos = self.engine.tools();
        let mut backends = HashMap::new();
        for info in &infos {
            let server = self
                .server(&info.backend)
                .map(|s| Arc::from(s.server_name()));
            backends.insert(info.name.clone(), server);
        }
        let tools = Arc::new(convert::list_tools(&self.servers, &infos));
        self.tool_view.lock().backends = backends;
        tools
    }
}

/// Unsubscribes `server` from `uri`, whose last subscriber is gone.
#[allow(
    deprecated,
    reason = "resources/unsubscribe is deprecated by SEP-2577 (MCP 2026-07-28), but the \
              session-based revisions the gateway speaks still use it"
)]
async fn unsubscribe(server: Arc<McpServer>, uri: String) {
    let mut params = rmcp::model::UnsubscribeRequestParams::new(uri);
    params.meta = None;
    let request = ClientRequest::UnsubscribeRequest(rmcp::model::UnsubscribeRequest::new(params));
    let _ = server
        .request(request, RequestMetaObject::new(), &CancellationToken::new())
        .await;
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.closed.cancel();
        self.engine.interactions().detach(ELICITATION_INTERACTOR);
    }
}
