//! rmcp's server handler, one per client connection: the gateway's front door on rmcp's path.
//! It only dispatches — each MCP method to the module of its feature, after marking the session
//! active — so that a feature's rules live with the feature.

#![allow(
    deprecated,
    reason = "logging and resources/subscribe are deprecated by SEP-2577 (MCP 2026-07-28), but \
              the session-based revisions the gateway speaks still use them"
)]

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use rmcp::model::SubscriptionFilter;
use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, CancelTaskParams, CompleteRequestParams,
    CompleteResult, DiscoverResult, GetPromptRequestParams, GetPromptResponse, GetTaskParams,
    GetTaskResult, InitializeRequestParams, InitializeResult, ListPromptsResult,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    ProtocolVersion, ReadResourceRequestParams, ReadResourceResponse, SetLevelRequestParams,
    SubscribeRequestParams, Tool, UnsubscribeRequestParams, UpdateTaskParams,
};
use rmcp::service::{NotificationContext, RequestContext, RoleServer, SubscriptionContext};
use rmcp::{ErrorData, ServerHandler};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use toolwarden_protocol::SessionId;

use super::call::{CallContext, Door};
use super::handshake_tasks::{self, DeclaresTasks};
use super::http_sessions::HttpSessionTag;
use super::options::{TOOLS_TTL, versions};
use super::passthrough::Completed as _;
use super::session::ClientSession;
use super::state::GatewayState;
use super::{completion, convert, passthrough, prompts, resources, tasks};

/// One MCP client's connection to the [`Gateway`](super::Gateway): rmcp's `ServerHandler`. The
/// gateway makes one per stdio connection, per Streamable HTTP session and per stateless HTTP
/// request; dropping it (the connection is gone) ends the connection's own session.
///
/// Which toolwarden session a request belongs to is [`GatewayConnection::session_of`]: the
/// connection's own for handshake clients; for stateless (2026-07-28) requests, the one they
/// name, else one per client identity (see `docs/GATEWAY.md`, "Both eras").
pub struct GatewayConnection {
    gateway: Arc<GatewayState>,
    shutdown: CancellationToken,
    /// The connection's own session, made when first needed: at `initialize`, with the
    /// connection on stdio, never for a stateless HTTP request.
    own: OnceLock<Arc<ClientSession>>,
    /// The own session was registered for stateless requests (stdio).
    registered: AtomicBool,
}

/// The session a request belongs to, and how its client stops waiting for it.
pub(crate) struct Served {
    pub(crate) session: Arc<ClientSession>,
    pub(crate) door: Door,
    /// The request is of the stateless revision: nothing but its answer may reach its client.
    pub(crate) stateless: bool,
}

impl GatewayConnection {
    pub(crate) fn new(gateway: Arc<GatewayState>, shutdown: CancellationToken) -> Self {
        Self {
            gateway,
            shutdown,
            own: OnceLock::new(),
            registered: AtomicBool::new(false),
        }
    }

    /// The connection's own session (made now if it was not yet: the configured principal's,
    /// unless `initialize` made it for the principal of its HTTP request).
    pub(crate) fn session(&self) -> &Arc<ClientSession> {
        self.own.get_or_init(|| {
            let principal = self.gateway.opts.principal.clone();
            self.gateway.new_session(principal, self.shutdown.clone())
        })
    }

    /// The session a request belongs to, touched, with the capabilities a stateless request
    /// declared. A handshake request: the connection's. A stateless request (its `_meta`
    /// names a revision without `initialize`): the session `_meta["toolwarden/session"]`
    /// names; else over HTTP the one of its client identity (bearer token and client name);
    /// else (stdio) the connection's.
    pub(crate) fn session_of(&self, context: &RequestContext<RoleServer>) -> Served {
        if !stateless(context) {
            let session = self.session().clone();
            session.touch();
            return Served {
                session,
                door: Door::Connection,
                stateless: false,
            };
        }
        let parts = context.extensions.get::<http::request::Parts>();
        let principal = self.gateway.principal_of(parts);
        let named = named_session(&context.meta);
        let (session, door) = match (named, parts) {
            (Some(name), _) => {
                let session = self.gateway.stateless_session(
                    &principal,
                    SessionId::new(name),
                    &self.shutdown,
                );
                let door = match parts {
                    Some(_) => Door::Stream(self.shutdown.clone()),
                    None => Door::Joined(self.session().clone()),
                };
                (session, door)
            }
            (None, Some(parts)) => {
                let client = context.meta.client_info();
                let id = identity_session(
                    &self.gateway.identities,
                    &parts.headers,
                    client.as_ref().map(|c| c.name.as_str()),
                );
                let session = self
                    .gateway
                    .stateless_session(&principal, id, &self.shutdown);
                (session, Door::Stream(self.shutdown.clone()))
            }
            (None, None) => {
                let session = self.session().clone();
                if !self.registered.swap(true, Ordering::Relaxed) {
                    self.gateway.register(&session);
                }
                (session, Door::Connection)
            }
        };
        if let Some(capabilities) = context.meta.client_capabilities() {
            session.declare(capabilities);
        }
        session.touch();
        Served {
            session,
            door,
            stateless: true,
        }
    }
}

/// The `_meta` key a stateless request names its toolwarden session with.
pub(crate) const SESSION_META: &str = "toolwarden/session";

/// The longest session name taken from `_meta["toolwarden/session"]`; a longer one is ignored.
const MAX_SESSION_NAME: usize = 200;

/// The session a stateless request names in `_meta["toolwarden/session"]` (trimmed; empty or
/// too long is no name).
pub(crate) fn named_session(meta: &rmcp::model::MetaObject) -> Option<&str> {
    meta.get(SESSION_META)
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|name| !name.is_empty() && name.len() <= MAX_SESSION_NAME)
}

/// The session of a stateless HTTP client that names none: one per client identity — its
/// bearer token (the whole `Authorization` value) and its client name — as `mcp_` and a digest
/// of both, so the token never shows. A returning identity's id comes from `known`.
pub(crate) fn identity_session(
    known: &super::state::Identities,
    headers: &http::HeaderMap,
    client_name: Option<&str>,
) -> SessionId {
    let auth = headers
        .get(http::header::AUTHORIZATION)
        .map(http::HeaderValue::as_bytes);
    known.session(auth, client_name, || derive_session(auth, client_name))
}

/// A stateless identity's session id: `mcp_` and 24 hex digits of a SHA-256 of it.
fn derive_session(auth: Option<&[u8]>, client_name: Option<&str>) -> SessionId {
    use sha2::Digest as _;
    let mut digest = sha2::Sha256::new();
    digest.update(b"toolwarden stateless session\0");
    if let Some(auth) = auth {
        digest.update(auth);
    }
    digest.update(b"\0");
    if let Some(name) = client_name {
        digest.update(name.as_bytes());
    }
    let mut id = String::with_capacity(4 + 24);
    id.push_str("mcp_");
    toolwarden_protocol::hex::push(&mut id, &digest.finalize()[..12]);
    SessionId::new(id)
}

impl Drop for GatewayConnection {
    fn drop(&mut self) {
        if let Some(session) = self.own.get() {
            self.gateway
                .end_session(session, session.disconnect_reason());
        }
    }
}

impl std::fmt::Debug for GatewayConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayConnection")
            .field("session", &self.own.get().map(|s| s.id.clone()))
            .finish()
    }
}

impl ServerHandler for GatewayConnection {
    fn get_info(&self) -> InitializeResult {
        convert::initialize_result(&self.gateway.servers, &self.gateway.opts)
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(versions())
    }

    async fn discover(
        &self,
        _context: RequestContext<RoleServer>,
    ) -> Result<DiscoverResult, ErrorData> {
        self.gateway.first_starts_for_handshake().await;
        let (servers, opts) = (&self.gateway.servers, &self.gateway.opts);
        Ok(convert::discover_result(servers, opts, versions().to_vec()))
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        self.gateway.first_starts_for_handshake().await;
        context.peer.set_peer_info(request.clone());
        let http = context
            .extensions
            .get::<HttpSessionTag>()
            .map(|t| t.0.clone());
        // The session is its `initialize`'s principal's: every later request of it must be too.
        let principal = self
            .gateway
            .principal_of(context.extensions.get::<http::request::Parts>());
        let session = self
            .own
            .get_or_init(|| self.gateway.new_session(principal, self.shutdown.clone()));
        session.initialized(context.peer.clone(), request.capabilities.clone(), http);
        self.gateway.register(session);
        tracing::debug!(session = %session.id, client = %request.client_info.name,
            version = %request.protocol_version, "MCP client initialize");
        let result = self.negotiate_initialize(&request)?;
        // The 2025-11-25 tasks capability, which rmcp drops: seen in the raw request (`http`).
        let declares_tasks = context
            .extensions
            .get::<http::request::Parts>()
            .is_some_and(|p| p.extensions.get::<DeclaresTasks>().is_some());
        if declares_tasks && result.protocol_version.as_str() == handshake_tasks::REVISION {
            session.declare_handshake_tasks();
        }
        Ok(result)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let served = self.session_of(&context);
        // Within the request's deadline (`_meta.timeout_ms`, else `request_timeout`).
        let deadline = super::passthrough::until(&self.gateway, &context.meta).at;
        self.gateway.first_starts_by(deadline).await;
        let tools = self.gateway.tools_for(&served.session.principal.name);
        let mut result = ListToolsResult::with_all_items((*tools).clone());
        if stateless(&context) {
            // The list is the same for every client of a principal; it changes when a server's
            // does.
            result.ttl_ms = Some(TOOLS_TTL.as_millis() as u64);
            result.cache_scope = Some(CacheScope::Private);
        }
        Ok(result)
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.gateway.tool(name)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let Served {
            session,
            door,
            stateless,
        } = self.session_of(&context);
        let tasks = stateless && super::tasks::declared(&context.meta);
        let mut meta = context.meta;
        if let Some(parts) = context.extensions.get::<http::request::Parts>() {
            super::call::trace_from_header(&parts.headers, &mut meta);
        }
        let mut call = CallContext::new(context.id, meta, Arc::new(context.peer), door);
        call.ct = context.ct;
        call.tasks = tasks;
        if stateless {
            return super::rounds::call_tool(&self.gateway, &session, request, call).await;
        }
        super::call::call_tool(&self.gateway, &session, request, call)
            .await
            .map(CallToolResponse::Complete)
    }

    async fn list_prompts(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        let session = self.session_of(&context).session;
        prompts::list(&self.gateway, &session, request, context)
            .await
            .map(passthrough::Completed::completed)
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        let session = self.session_of(&context).session;
        prompts::get(&self.gateway, &session, request, context)
            .await
            .map(|r| r.completed().into())
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let session = self.session_of(&context).session;
        resources::list(&self.gateway, &session, request, context)
            .await
            .map(passthrough::Completed::completed)
    }

    async fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        let session = self.session_of(&context).session;
        resources::list_templates(&self.gateway, &session, request, context)
            .await
            .map(passthrough::Completed::completed)
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let session = self.session_of(&context).session;
        resources::read(&self.gateway, &session, request, context)
            .await
            .map(|r| r.completed().into())
    }

    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let session = self.session_of(&context).session;
        resources::subscribe(&self.gateway, &session, request, context).await
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let session = self.session_of(&context).session;
        resources::unsubscribe(&self.gateway, &session, request, context).await
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        let session = self.session_of(&context).session;
        completion::complete(&self.gateway, &session, request, context)
            .await
            .map(passthrough::Completed::completed)
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let session = self.session_of(&context).session;
        passthrough::set_level(&self.gateway, &session, request, context).await
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let session = self.session_of(&context).session;
        tasks::get(&self.gateway, &session.principal.name, &request.task_id).await
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let session = self.session_of(&context).session;
        let who = &session.principal.name;
        tasks::update(
            &self.gateway,
            who,
            &request.task_id,
            request.input_responses,
        )
        .await
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let session = self.session_of(&context).session;
        tasks::cancel(&self.gateway, &session.principal.name, &request.task_id).await
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        // All of it; rmcp keeps what the gateway's capabilities offer (`listen`).
        Some(requested.clone())
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        self.session_of(context.request_context());
        super::listen::listen(&self.gateway, context, &self.shutdown).await
    }

    async fn on_roots_list_changed(&self, _context: NotificationContext<RoleServer>) {
        passthrough::roots_list_changed(&self.gateway).await;
    }
}

/// Whether a request is of the stateless revision (its `_meta` names one without `initialize`).
fn stateless(context: &RequestContext<RoleServer>) -> bool {
    context
        .meta
        .protocol_version()
        .is_some_and(|v| !v.has_initialize())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_auth(token: &str) -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        headers.insert(
            http::header::AUTHORIZATION,
            http::HeaderValue::from_str(token).unwrap(),
        );
        headers
    }

    #[test]
    fn an_identity_keeps_its_session_and_two_identities_never_share_one() {
        let known = super::super::state::Identities::default();
        let (a, b) = (with_auth("Bearer a"), with_auth("Bearer b"));
        let first = identity_session(&known, &a, Some("agent"));
        assert!(
            first.as_str().starts_with("mcp_") && first.as_str().len() == 28,
            "{first}"
        );
        // Remembered, and the same as a fresh derivation.
        assert_eq!(identity_session(&known, &a, Some("agent")), first);
        let fresh = super::super::state::Identities::default();
        assert_eq!(identity_session(&fresh, &a, Some("agent")), first);
        // Another token, another client name, or none: another session.
        let others = [
            identity_session(&known, &b, Some("agent")),
            identity_session(&known, &a, Some("other")),
            identity_session(&known, &a, None),
            identity_session(&known, &http::HeaderMap::new(), Some("agent")),
        ];
        for (i, other) in others.iter().enumerate() {
            assert_ne!(other, &first);
            for later in &others[i + 1..] {
                assert_ne!(other, later);
            }
        }
        // Past the bound the memory is cleared, not the mapping.
        for n in 0..super::super::state::Identities::MAX + 1 {
            identity_session(&known, &with_auth(&format!("Bearer {n}")), None);
        }
        assert!(known.remembered() <= super::super::state::Identities::MAX);
        assert_eq!(identity_session(&known, &a, Some("agent")), first);
    }
}
