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
//!
//! This file is the public handle and its wiring. Below it, one way down: the transports
//! (`stdio` over `stdio_frames`, `http` over `dispatch` and `http_sessions`) read each message
//! once (`incoming`): what the gateway answers itself goes to its handler (a call to `call`,
//! through `rounds` for a stateless client, answering over HTTP through `respond`), the rest to
//! rmcp's handler (`handler`), which dispatches to one module per MCP feature (`call`, `prompts`, `resources`, `completion`,
//! `passthrough`; `elicit` and `upstream` for what goes to a client); all of them share
//! `state` (the registry of clients, the tool view, `route_table`), which reads none of them.
//! At the bottom: a client session (`session`), the ways back to a client (`channel`), and
//! what only converts or names things (`convert`, `status`, `options`).

mod call;
mod channel;
mod completion;
mod convert;
mod dispatch;
mod elicit;
mod flow_events;
mod handler;
mod handshake_tasks;
mod http;
mod http_sessions;
mod incoming;
mod listen;
mod listeners;
mod options;
mod parked;
mod passthrough;
mod prompts;
mod resources;
mod respond;
mod rounds;
mod route_table;
mod session;
mod state;
mod status;
mod stdio;
mod stdio_frames;
mod task_board;
mod tasks;
mod upstream;
mod watch;

use std::sync::{Arc, Weak};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;
use toolwarden_core::Engine;
use toolwarden_protocol::{EventKind, ServerStateKind, SessionId};

use crate::McpServer;
use crate::servers::link::Upstream;

pub use handler::GatewayConnection;
pub use http::GatewayHttpService;
pub use http_sessions::HttpSessions;
#[cfg(feature = "parse-count")]
pub use incoming::reads;
pub use options::{
    DEFAULT_REQUEST_TIMEOUT, ELICITATION_INTERACTOR, GatewayOptions, HANDSHAKE_WAIT, STATUS_TOOL,
};
pub use stdio::GatewayError;

use elicit::{ElicitationInteractor, Elicitations};
use state::GatewayState;

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
    state: Arc<GatewayState>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field(
                "servers",
                &self
                    .state
                    .servers
                    .iter()
                    .map(|s| s.server_name())
                    .collect::<Vec<_>>(),
            )
            .field("sessions", &self.state.registered())
            .finish_non_exhaustive()
    }
}

impl Gateway {
    /// A gateway over `engine` and its MCP `servers`. Call it within a Tokio runtime: it
    /// starts three background tasks (tool-list changes, engine events, idle stateless
    /// sessions), which end when the gateway is dropped. It attaches itself to the servers (their requests and notifications
    /// for a client come here) and an elicitation interactor to the engine.
    pub fn new(engine: Engine, servers: Vec<Arc<McpServer>>, opts: GatewayOptions) -> Arc<Gateway> {
        let state = GatewayState::new(engine, servers, opts);
        // Other replicas hand this one the answers to the tasks it holds, and ask their state.
        let weak = Arc::downgrade(&state);
        state
            .engine
            .set_task_answerer(Arc::new(move |request| match weak.upgrade() {
                Some(gw) => tasks::answer_here(&gw, request),
                None => toolwarden_core::shared::TaskAnswer::NotFound,
            }));
        let upstream: Weak<dyn Upstream> = Arc::downgrade(&state) as Weak<dyn Upstream>;
        for server in &state.servers {
            server.attach(upstream.clone());
        }
        let elicitations = Arc::new(Elicitations::default());
        state
            .engine
            .interactions()
            .attach(Arc::new(ElicitationInteractor::new(
                Arc::downgrade(&state),
                elicitations.clone(),
            )));
        state.refresh_tool_view();
        state.tasks.spawn(watch::tools(
            Arc::downgrade(&state),
            state.engine.tools_changed(),
            state.closed.clone(),
        ));
        state.tasks.spawn(watch::stateless(
            Arc::downgrade(&state),
            state.opts.http_session_idle,
            state.closed.clone(),
        ));
        let eliciting = elicitations.clone();
        state.tasks.spawn(watch::events(
            Arc::downgrade(&state),
            elicitations,
            // Only the events it acts on wake it (not four per call).
            state
                .engine
                .events()
                .subscribe_matching(move |event| match &event.kind {
                    EventKind::InteractionAnswered { .. }
                    | EventKind::InteractionTimedOut { .. } => true,
                    EventKind::ToolResult { .. } => eliciting.any(),
                    EventKind::ServerState { state, .. } => *state == ServerStateKind::Restarted,
                    _ => false,
                }),
            state.closed.clone(),
        ));
        Arc::new(Gateway { state })
    }

    /// The engine it governs with.
    pub fn engine(&self) -> &Engine {
        &self.state.engine
    }

    /// How many clients are connected.
    pub fn clients(&self) -> usize {
        self.state.clients()
    }

    /// The toolwarden session ids of the connected clients.
    pub fn client_sessions(&self) -> Vec<SessionId> {
        self.state.client_sessions()
    }

    /// Waits as a client's `initialize` does: until every server's first start has ended, or
    /// [`HANDSHAKE_WAIT`] after the gateway was made. A front door that serves one client
    /// (`toolwarden mcp`) waits this before it reads that client, so that its first calls find
    /// their tools' policies; its `initialize` then waits no longer.
    pub async fn first_starts(&self) {
        self.state.first_starts_for_handshake().await;
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
        stdio::serve(&self.state, read, write, shutdown).await
    }

    /// A Streamable HTTP service for `/mcp` (a tower `Service`; the binary mounts it, e.g.
    /// with axum's `Router::nest_service`, and puts Host/Origin checks in front). One MCP
    /// session (`Mcp-Session-Id`) is one toolwarden session. At `shutdown`, every session
    /// ends (running calls `cancelled{shutdown}`) and every stream closes.
    pub fn http_service(self: &Arc<Self>, shutdown: CancellationToken) -> GatewayHttpService {
        http::service(&self.state, shutdown)
    }
}
