//! rmcp's server handler, one per client connection: the gateway's front door on rmcp's path.
//! It only dispatches — each MCP method to the module of its feature, after marking the session
//! active — so that a feature's rules live with the feature.

#![allow(
    deprecated,
    reason = "logging and resources/subscribe are deprecated by SEP-2577 (MCP 2026-07-28), but \
              the session-based revisions the gateway speaks still use them"
)]

use std::borrow::Cow;
use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CompleteRequestParams, CompleteResult,
    GetPromptRequestParams, GetPromptResponse, InitializeRequestParams, InitializeResult,
    ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult, ListToolsResult,
    PaginatedRequestParams, ProtocolVersion, ReadResourceRequestParams, ReadResourceResponse,
    SetLevelRequestParams, SubscribeRequestParams, UnsubscribeRequestParams,
};
use rmcp::service::{NotificationContext, RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler};
use tokio_util::sync::CancellationToken;

use super::http_sessions::HttpSessionTag;
use super::options::versions;
use super::session::ClientSession;
use super::state::GatewayState;
use super::{completion, convert, passthrough, prompts, resources};

/// One MCP client's connection to the [`Gateway`](super::Gateway): rmcp's `ServerHandler`. The
/// gateway makes one per stdio connection and per Streamable HTTP session; dropping it (the
/// connection is gone) ends the client's session.
pub struct GatewayConnection {
    gateway: Arc<GatewayState>,
    session: Arc<ClientSession>,
}

impl GatewayConnection {
    pub(crate) fn new(gateway: Arc<GatewayState>, shutdown: CancellationToken) -> Self {
        let session = gateway.new_session(shutdown);
        Self { gateway, session }
    }

    pub(crate) fn session(&self) -> &Arc<ClientSession> {
        &self.session
    }
}

impl Drop for GatewayConnection {
    fn drop(&mut self) {
        self.gateway
            .end_session(&self.session, self.session.disconnect_reason());
    }
}

impl std::fmt::Debug for GatewayConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayConnection")
            .field("session", &self.session.id)
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

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        context.peer.set_peer_info(request.clone());
        let http = context
            .extensions
            .get::<HttpSessionTag>()
            .map(|t| t.0.clone());
        self.session
            .initialized(context.peer.clone(), request.capabilities.clone(), http);
        self.gateway.register(&self.session);
        tracing::debug!(session = %self.session.id, client = %request.client_info.name,
            version = %request.protocol_version, "MCP client initialize");
        self.negotiate_initialize(&request)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        self.session.touch();
        let tools = self.gateway.refresh_tool_view();
        Ok(ListToolsResult::with_all_items((*tools).clone()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.session.touch();
        let context = super::call::CallContext {
            id: context.id,
            meta: context.meta,
            channel: Arc::new(context.peer),
            ct: context.ct,
        };
        super::call::call_tool(&self.gateway, &self.session, request, context)
            .await
            .map(CallToolResponse::Complete)
    }

    async fn list_prompts(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        self.session.touch();
        prompts::list(&self.gateway, &self.session, request, context).await
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        self.session.touch();
        prompts::get(&self.gateway, &self.session, request, context)
            .await
            .map(Into::into)
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        self.session.touch();
        resources::list(&self.gateway, &self.session, request, context).await
    }

    async fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        self.session.touch();
        resources::list_templates(&self.gateway, &self.session, request, context).await
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        self.session.touch();
        resources::read(&self.gateway, &self.session, request, context)
            .await
            .map(Into::into)
    }

    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.session.touch();
        resources::subscribe(&self.gateway, &self.session, request, context).await
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.session.touch();
        resources::unsubscribe(&self.gateway, &self.session, request, context).await
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        self.session.touch();
        completion::complete(&self.gateway, &self.session, request, context).await
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.session.touch();
        passthrough::set_level(&self.gateway, &self.session, request, context).await
    }

    async fn on_roots_list_changed(&self, _context: NotificationContext<RoleServer>) {
        passthrough::roots_list_changed(&self.gateway).await;
    }
}
