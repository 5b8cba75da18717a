//! The gateway's shared state: its engine and servers, the registry of connected clients, the
//! tool view, the route tables and the recency order. Every part of the gateway reads it; it
//! reads none of them, so it sits at the bottom, below the features and the transports.

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use rmcp::model::{ClientRequest, RequestMetaObject, ServerNotification, Tool};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use toolwarden_core::Engine;
use toolwarden_protocol::{CancelReason, Principal, SessionId, SessionKey};

use crate::McpServer;

use super::convert;
use super::listeners::Listeners;
use super::options::{ELICITATION_INTERACTOR, GatewayOptions, HANDSHAKE_WAIT};
use super::parked::Parked;
use super::route_table::RouteTable;
use super::session::{ClientSession, Recency};
use super::task_board::TaskBoard;

/// What the [`Gateway`](super::Gateway) handle, its connections and its background tasks
/// share. Dropped with the last of them: then the background tasks end and the elicitation
/// interactor leaves the engine.
pub(crate) struct GatewayState {
    pub(super) engine: Engine,
    pub(super) servers: Vec<Arc<McpServer>>,
    pub(super) opts: GatewayOptions,
    /// Live client sessions by principal and toolwarden session id.
    sessions: Mutex<HashMap<SessionKey, Weak<ClientSession>>>,
    /// Live Streamable HTTP sessions by `Mcp-Session-Id`.
    http_sessions: Mutex<HashMap<String, Weak<ClientSession>>>,
    /// The sessions of stateless (2026-07-28) requests, which no connection owns, by their
    /// principal and toolwarden session id, with when a request last came.
    stateless: Mutex<HashMap<SessionKey, (Arc<ClientSession>, Instant)>>,
    /// The session ids of stateless clients that name none, by identity.
    pub(super) identities: Identities,
    /// Calls of stateless clients waiting for their client's next request.
    pub(super) parked: Parked,
    /// Tasks toward clients whose calls run (or ran) here.
    pub(super) task_board: TaskBoard,
    /// Which server serves each exposed tool, and the list last sent to clients.
    tool_view: Mutex<ToolView>,
    /// Where resources, templates and prompts live.
    pub(super) routes: RouteTable,
    /// Stateless clients' open `subscriptions/listen` streams.
    pub(super) listeners: Listeners,
    /// Per server, the client that most recently called one of its tools.
    pub(super) last_client: Mutex<HashMap<Arc<str>, Weak<ClientSession>>>,
    /// Orders calls and sessions by recency.
    recency: Arc<Recency>,
    /// Every server's first start has ended ([`Self::first_starts_by`]).
    first_started: AtomicBool,
    /// Until when a handshake waits for the servers' first start: [`HANDSHAKE_WAIT`] after the
    /// gateway was made ([`Self::first_starts_for_handshake`]).
    handshake_by: Instant,
    /// Fires when the state is dropped: the background tasks end.
    pub(super) closed: CancellationToken,
    pub(super) tasks: TaskTracker,
}

/// The session ids of stateless clients that name none (`handler::identity_session`), by a
/// 128-bit hash of the identity: SipHash-1-3 with 128 bits out, under a random key drawn at
/// start. Without the key nobody can choose two identities that collide, and the token itself
/// is not kept. A returning client so costs one SipHash, not a SHA-256; the map itself hashes
/// nothing again (its keys are keyed hashes already). Forgotten all at once past
/// [`Identities::MAX`].
pub(crate) struct Identities {
    key: (u64, u64),
    names: Mutex<HashMap<u128, SessionId, BuildHasherDefault<Prehashed>>>,
}

impl Default for Identities {
    fn default() -> Self {
        use std::hash::BuildHasher as _;
        // The standard library's random keys, drawn once per process.
        let random = std::hash::RandomState::new();
        Self {
            key: (random.hash_one(0_u8), random.hash_one(1_u8)),
            names: Mutex::default(),
        }
    }
}

impl Identities {
    pub(super) const MAX: usize = 4096;

    /// The session id of the identity (`auth`, `client_name`): the one remembered, else
    /// `derive`d and remembered.
    pub(super) fn session(
        &self,
        auth: Option<&[u8]>,
        client_name: Option<&str>,
        derive: impl FnOnce() -> SessionId,
    ) -> SessionId {
        let key = self.key(auth, client_name);
        if let Some(id) = self.names.lock().get(&key) {
            return id.clone();
        }
        let id = derive();
        let mut names = self.names.lock();
        if names.len() >= Self::MAX {
            names.clear();
        }
        names.insert(key, id.clone());
        id
    }

    /// How many identities are remembered.
    #[cfg(test)]
    pub(super) fn remembered(&self) -> usize {
        self.names.lock().len()
    }

    fn key(&self, auth: Option<&[u8]>, client_name: Option<&str>) -> u128 {
        use siphasher::sip128::Hasher128 as _;
        use std::hash::Hash as _;
        let mut hasher = siphasher::sip128::SipHasher13::new_with_keys(self.key.0, self.key.1);
        (auth, client_name).hash(&mut hasher);
        hasher.finish128().as_u128()
    }
}

/// The hash of a map whose keys are keyed hashes already: their low 64 bits.
#[derive(Default)]
pub(crate) struct Prehashed(u64);

impl std::hash::Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `u128` keys come here (`write_u128`); anything else is folded in whole.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u128(&mut self, n: u128) {
        // The low half: every bit of a keyed hash is as good as another.
        self.0 = n as u64;
    }
}

#[derive(Default)]
struct ToolView {
    /// Every exposed tool, with the MCP server that serves it (none for `exec` and in-process).
    backends: HashMap<String, Option<Arc<str>>>,
    listed: Option<Arc<Vec<Tool>>>,
    /// The listed tools that map an argument to an `Mcp-Param-*` header.
    header_mapped: HashSet<String>,
}

impl GatewayState {
    pub(super) fn new(
        engine: Engine,
        servers: Vec<Arc<McpServer>>,
        opts: GatewayOptions,
    ) -> Arc<Self> {
        Arc::new(Self {
            engine,
            servers,
            opts,
            sessions: Mutex::default(),
            http_sessions: Mutex::default(),
            stateless: Mutex::default(),
            identities: Identities::default(),
            parked: Parked::default(),
            task_board: TaskBoard::default(),
            tool_view: Mutex::default(),
            routes: RouteTable::default(),
            listeners: Listeners::default(),
            last_client: Mutex::default(),
            recency: Arc::new(Recency::new()),
            first_started: AtomicBool::new(false),
            handshake_by: Instant::now() + HANDSHAKE_WAIT,
            closed: CancellationToken::new(),
            tasks: TaskTracker::new(),
        })
    }

    /// How many clients are connected.
    pub(super) fn clients(&self) -> usize {
        self.sessions
            .lock()
            .values()
            .filter(|s| s.strong_count() > 0)
            .count()
    }

    /// How many sessions are registered (live or just dropped), for `Debug`.
    pub(super) fn registered(&self) -> usize {
        self.sessions.lock().len()
    }

    /// The toolwarden session ids of the connected clients.
    pub(super) fn client_sessions(&self) -> Vec<SessionId> {
        self.sessions
            .lock()
            .iter()
            .filter(|(_, s)| s.strong_count() > 0)
            .map(|(key, _)| key.id.clone())
            .collect()
    }

    /// The next number in the order of calls and sessions.
    pub(super) fn next_seq(&self) -> u64 {
        self.recency.next()
    }

    /// A session for a new connection of `principal`, served until `shutdown`.
    pub(super) fn new_session(
        &self,
        principal: Principal,
        shutdown: CancellationToken,
    ) -> Arc<ClientSession> {
        ClientSession::new(
            principal,
            self.recency.clone(),
            self.tasks.clone(),
            shutdown,
        )
    }

    /// The session of a stateless request that is not its connection's: the live session of
    /// that id if there is one (a handshake client's, or one a stateless request made before),
    /// else a new one, registered, that lives until it has been idle for
    /// [`http_session_idle`](GatewayOptions::http_session_idle) with no call running.
    pub(super) fn stateless_session(
        &self,
        principal: &Principal,
        id: SessionId,
        shutdown: &CancellationToken,
    ) -> Arc<ClientSession> {
        let now = Instant::now();
        let key = SessionKey::new(principal.name.clone(), id);
        let mut stateless = self.stateless.lock();
        if let Some((session, last)) = stateless.get_mut(&key)
            && !session.is_ended()
        {
            *last = now;
            return session.clone();
        }
        if let Some(session) = self.session(&key).filter(|s| !s.is_ended()) {
            return session;
        }
        let session = ClientSession::with_id(
            key.clone(),
            principal.clone(),
            self.recency.clone(),
            self.tasks.clone(),
            shutdown.clone(),
        );
        stateless.insert(key, (session.clone(), now));
        drop(stateless);
        self.register(&session);
        session
    }

    /// Ends the stateless sessions idle for `idle` with no call running.
    pub(super) fn sweep_stateless(&self, idle: Duration) {
        let now = Instant::now();
        let stale: Vec<Arc<ClientSession>> = {
            let mut stateless = self.stateless.lock();
            let stale: Vec<SessionKey> = stateless
                .iter()
                .filter(|(_, (session, last))| {
                    now.duration_since(*last) >= idle && !session.has_calls()
                })
                .map(|(id, _)| id.clone())
                .collect();
            stale
                .iter()
                .filter_map(|id| stateless.remove(id).map(|(s, _)| s))
                .collect()
        };
        for session in stale {
            tracing::debug!(session = %session.id, "an idle stateless MCP session ended");
            self.end_session(&session, CancelReason::ClientDisconnect);
        }
    }

    /// The MCP server of that name.
    pub(super) fn server(&self, name: &str) -> Option<&Arc<McpServer>> {
        self.servers.iter().find(|s| s.server_name() == name)
    }

    /// A session whose `initialize` succeeded.
    pub(super) fn register(&self, session: &Arc<ClientSession>) {
        self.sessions
            .lock()
            .insert(session.key(), Arc::downgrade(session));
        if let Some(http) = session.http_id() {
            self.http_sessions
                .lock()
                .insert(http.to_owned(), Arc::downgrade(session));
        }
        tracing::info!(session = %session.id, http_session = ?session.http_id(), "MCP client connected");
    }

    /// Ends a session: its running calls end `cancelled{reason}` at once, it leaves the
    /// registry, and its subscriptions go. Idempotent.
    pub(super) fn end_session(&self, session: &ClientSession, reason: CancelReason) {
        if !session.mark_ended(reason) {
            return;
        }
        let key = session.key();
        self.engine.end_session(&key, reason);
        self.sessions.lock().remove(&key);
        if let Some(http) = session.http_id() {
            self.http_sessions.lock().remove(http);
        }
        self.forget_subscriber(&key);
    }

    /// A subscriber (a session, or a `subscriptions/listen` stream) is gone: its subscriptions
    /// go, and the servers of those it was the last subscriber of are unsubscribed.
    pub(super) fn forget_subscriber(&self, subscriber: &SessionKey) {
        for (uri, server) in self.routes.forget_session(subscriber) {
            if let Some(server) = self.server(&server).cloned() {
                self.tasks
                    .spawn(unsubscribe(server, uri, self.opts.request_timeout));
            }
        }
    }

    /// Live sessions, most recently active first.
    pub(super) fn live_sessions(&self) -> Vec<Arc<ClientSession>> {
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

    /// A live session by its principal and toolwarden id.
    pub(super) fn session(&self, key: &SessionKey) -> Option<Arc<ClientSession>> {
        self.sessions.lock().get(key).and_then(Weak::upgrade)
    }

    /// Who sent an HTTP request (`parts`), or the stdio client (`None`): the principal the
    /// authentication put in the request, else the configured one.
    pub(super) fn principal_of(&self, parts: Option<&http::request::Parts>) -> Principal {
        parts
            .and_then(|p| p.extensions.get::<Principal>())
            .unwrap_or(&self.opts.principal)
            .clone()
    }

    /// Who sent an HTTP request, by its extensions.
    pub(super) fn principal_of_request(&self, extensions: &http::Extensions) -> Principal {
        extensions
            .get::<Principal>()
            .unwrap_or(&self.opts.principal)
            .clone()
    }

    /// The live session of the call an interaction is about.
    pub(super) fn session_of_interaction(
        &self,
        interaction: &toolwarden_protocol::Interaction,
    ) -> Option<Arc<ClientSession>> {
        let id = interaction.scope.session_id.clone()?;
        let principal = interaction
            .scope
            .principal
            .as_deref()
            .unwrap_or(toolwarden_protocol::LOCAL_PRINCIPAL);
        self.session(&SessionKey::new(principal, id))
    }

    /// A live session by its `Mcp-Session-Id`.
    pub(super) fn http_session(&self, id: &str) -> Option<Arc<ClientSession>> {
        self.http_sessions.lock().get(id).and_then(Weak::upgrade)
    }

    /// Sends a notification to every live client.
    pub(super) fn broadcast(&self, notification: ServerNotification) {
        self.listeners.deliver(&notification);
        for session in self.live_sessions() {
            session.notify(notification.clone());
        }
    }

    /// The server that serves an exposed tool, if an MCP server does.
    pub(super) fn backend_of(&self, tool: &str) -> Option<Arc<str>> {
        if let Some(server) = self.tool_view.lock().backends.get(tool) {
            return server.clone();
        }
        // A tool registered since the last look (or none at all).
        self.refresh_tool_view();
        self.tool_view.lock().backends.get(tool).cloned().flatten()
    }

    /// An exposed tool as clients see it (from the list last made).
    pub(super) fn tool(&self, name: &str) -> Option<Tool> {
        let listed = self.tool_view.lock().listed.clone();
        let tools = listed.unwrap_or_else(|| self.refresh_tool_view());
        tools.iter().find(|t| t.name == name).cloned()
    }

    /// Whether an exposed tool maps an argument to an `Mcp-Param-*` header (from the list last
    /// made, which knows it without reading the tool's schema again).
    pub(super) fn maps_headers(&self, name: &str) -> bool {
        {
            let view = self.tool_view.lock();
            if view.listed.is_some() {
                return !view.header_mapped.is_empty() && view.header_mapped.contains(name);
            }
        }
        self.tool(name)
            .is_some_and(|tool| convert::maps_headers(&tool))
    }

    /// Re-reads which server serves which tool; returns the list clients would see now.
    pub(super) fn refresh_tool_view(&self) -> Arc<Vec<Tool>> {
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

    /// Waits until every server's first start has ended (each at most its `startup_timeout`),
    /// or until `deadline`: a list (tools, prompts, resources) asked for meanwhile waits, within
    /// its request's deadline, so that it is whole; `initialize` waits a while
    /// ([`Self::first_starts_for_handshake`]); calls do not wait for it at all. Once every first
    /// start has ended it costs one load.
    pub(super) async fn first_starts_by(&self, deadline: Instant) {
        if self.first_started.load(Ordering::Acquire) {
            return;
        }
        let all = futures::future::join_all(self.servers.iter().map(|s| s.first_start()));
        if tokio::time::timeout_at(deadline, all).await.is_ok() {
            self.first_started.store(true, Ordering::Release);
        }
    }

    /// [`Self::first_starts_by`] until [`HANDSHAKE_WAIT`] after the gateway was made: what
    /// `initialize` and `server/discover` wait, so that the capabilities they announce (the
    /// servers' union) hold the servers that start in seconds, while a slow one does not cost
    /// the client its handshake. Counted from the gateway's making, so that a front door that
    /// waited for the servers itself before serving (`toolwarden mcp`) adds nothing to it.
    pub(super) async fn first_starts_for_handshake(&self) {
        self.first_starts_by(self.handshake_by).await;
    }

    /// The list a principal's clients see: every tool but those a rule denies it outright
    /// (toolwarden's own status tool, which no rule governs, always stays).
    pub(super) fn tools_for(&self, principal: &str) -> Arc<Vec<Tool>> {
        let tools = self.refresh_tool_view();
        let hidden = |rules: &toolwarden_core::rules::Rules, t: &Tool| {
            t.name != super::options::STATUS_TOOL && rules.hides(&t.name, principal)
        };
        match self.engine.rules() {
            Some(rules) if tools.iter().any(|t| hidden(&rules, t)) => Arc::new(
                tools
                    .iter()
                    .filter(|t| !hidden(&rules, t))
                    .cloned()
                    .collect(),
            ),
            _ => tools,
        }
    }

    /// Re-reads the tool list; whether it differs from the one last listed to clients (a
    /// server that republishes the same list, as at every restart, changes nothing).
    pub(super) fn relist_tools(&self) -> bool {
        let tools = self.refresh_tool_view();
        let mut view = self.tool_view.lock();
        let differs = view.listed.as_ref() != Some(&tools);
        if differs {
            view.header_mapped = tools
                .iter()
                .filter(|tool| convert::maps_headers(tool))
                .map(|tool| tool.name.to_string())
                .collect();
        }
        view.listed = Some(tools);
        differs
    }
}

impl Drop for GatewayState {
    fn drop(&mut self) {
        self.closed.cancel();
        self.engine.interactions().detach(ELICITATION_INTERACTOR);
    }
}

/// Unsubscribes `server` from `uri`, whose last subscriber is gone.
#[allow(
    deprecated,
    reason = "resources/unsubscribe is deprecated by SEP-2577 (MCP 2026-07-28), but the \
              session-based revisions the gateway speaks still use it"
)]
async fn unsubscribe(server: Arc<McpServer>, uri: String, within: Duration) {
    let mut params = rmcp::model::UnsubscribeRequestParams::new(uri);
    params.meta = None;
    let request = ClientRequest::UnsubscribeRequest(rmcp::model::UnsubscribeRequest::new(params));
    let _ = server
        .request(
            request,
            RequestMetaObject::new(),
            &CancellationToken::new(),
            crate::servers::Deadline::after(within),
        )
        .await;
}
