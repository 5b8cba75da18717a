//! rmcp's client handler for one connection: what the server sends that is not an answer. Its
//! progress goes to the call table (`call_table`), a changed tool list to the supervisor, and its
//! own requests and notifications for its client across the `link` to the gateway.

#![allow(
    deprecated,
    reason = "sampling, roots and logging are deprecated by SEP-2577 (MCP 2026-07-28), but the \
              session-based revisions that clients speak still use them, and they pass through"
)]

use std::sync::Arc;

use rmcp::model::{
    ClientCapabilities, ClientConfig, ClientResult, CreateMessageRequest,
    CreateMessageRequestParams, CreateMessageResult, CustomNotification, CustomRequest,
    CustomResult, ElicitRequest, ElicitRequestParams, ElicitResult, ElicitationCapability,
    FormElicitationCapability, GetMeta as _, Implementation, JsonObject, ListRootsRequest,
    ListRootsResult, LoggingMessageNotification, LoggingMessageNotificationParam,
    ProgressNotificationParam, PromptListChangedNotification, ProtocolVersion,
    ResourceListChangedNotification, ResourceUpdatedNotification, ResourceUpdatedNotificationParam,
    RootsCapabilities, SamplingCapability, ServerNotification, ServerRequest, TASKS_EXTENSION_ID,
    UrlElicitationCapability,
};
use rmcp::service::{NotificationContext, RequestContext, RoleClient};
use rmcp::{ClientHandler, ErrorData};

use super::call_table::CallTable;
use super::link::{Link, no_client, retype, server_request_method};

/// rmcp's client handler for one connection.
#[derive(Clone)]
pub(crate) struct ConnectionHandler {
    pub(crate) calls: Arc<CallTable>,
    /// Where the server's requests and notifications for its client go (the gateway).
    pub(crate) link: Arc<Link>,
    /// Declare sampling, elicitation and roots, so they can be forwarded (`McpOptions`).
    pub(crate) forward: bool,
    /// The revision `initialize` offers (the server's `protocol`, else 2025-11-25).
    pub(crate) offer: ProtocolVersion,
}

impl ConnectionHandler {
    /// Forwards a server-initiated request to the attached upstream, until the server cancels
    /// it (`ctx.ct`).
    async fn forward(
        &self,
        mut request: ServerRequest,
        context: RequestContext<RoleClient>,
    ) -> Result<ClientResult, ErrorData> {
        let method = server_request_method(&request);
        let Some(upstream) = self.link.get() else {
            return Err(no_client(&method));
        };
        // rmcp moved the request's `_meta` into the context; put it back for the client (the
        // progress token is rmcp's business on each hop).
        let mut meta = context.meta;
        meta.remove("progressToken");
        *request.get_meta_mut() = meta;
        let server = self.calls.server.clone();
        tracing::debug!(server = %server, %method, "forwarding a server's request to a client");
        upstream.request(server, request, context.ct).await
    }

    fn notify(&self, notification: ServerNotification) {
        match self.link.get() {
            Some(upstream) => upstream.notify(self.calls.server.clone(), notification),
            None => tracing::trace!(server = %self.calls.server,
                "no client attached: a server notification was dropped"),
        }
    }
}

impl ClientHandler for ConnectionHandler {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.calls.progress(params).await;
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        // The supervisor re-reads the list; the engine's tool set changes; the gateway tells
        // its clients from there.
        self.calls.tools_changed.notify_one();
    }

    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        let request = ServerRequest::CreateMessageRequest(CreateMessageRequest::new(params));
        match self.forward(request, context).await? {
            ClientResult::CreateMessageResult(result) => Ok(*result),
            other => retype(other, "sampling/createMessage"),
        }
    }

    async fn list_roots(
        &self,
        context: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, ErrorData> {
        let request = ServerRequest::ListRootsRequest(ListRootsRequest::default());
        match self.forward(request, context).await? {
            ClientResult::ListRootsResult(result) => Ok(result),
            other => retype(other, "roots/list"),
        }
    }

    async fn create_elicitation(
        &self,
        params: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        let request = ServerRequest::ElicitRequest(ElicitRequest::new(params));
        match self.forward(request, context).await? {
            ClientResult::ElicitResult(result) => Ok(result),
            other => retype(other, "elicitation/create"),
        }
    }

    async fn on_custom_request(
        &self,
        request: CustomRequest,
        context: RequestContext<RoleClient>,
    ) -> Result<CustomResult, ErrorData> {
        let request = ServerRequest::CustomRequest(request);
        match self.forward(request, context).await? {
            ClientResult::CustomResult(result) => Ok(result),
            other => retype(other, "a custom request"),
        }
    }

    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.notify(ServerNotification::LoggingMessageNotification(
            LoggingMessageNotification::new(params),
        ));
    }

    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.notify(ServerNotification::ResourceUpdatedNotification(
            ResourceUpdatedNotification::new(params),
        ));
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.notify(ServerNotification::ResourceListChangedNotification(
            ResourceListChangedNotification::default(),
        ));
    }

    async fn on_prompt_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.notify(ServerNotification::PromptListChangedNotification(
            PromptListChangedNotification::default(),
        ));
    }

    async fn on_custom_notification(
        &self,
        notification: CustomNotification,
        _context: NotificationContext<RoleClient>,
    ) {
        self.notify(ServerNotification::CustomNotification(notification));
    }

    fn get_info(&self) -> ClientConfig {
        let mut capabilities = ClientCapabilities::default();
        if self.forward {
            let mut roots = RootsCapabilities::default();
            roots.list_changed = Some(true);
            capabilities.roots = Some(roots);
            let mut sampling = SamplingCapability::default();
            sampling.tools = Some(JsonObject::new());
            sampling.context = Some(JsonObject::new());
            capabilities.sampling = Some(sampling);
            let mut elicitation = ElicitationCapability::default();
            elicitation.form = Some(FormElicitationCapability::default());
            elicitation.url = Some(UrlElicitationCapability::default());
            capabilities.elicitation = Some(elicitation);
        }
        // Servers may answer with tasks: the backend follows them (`task`).
        capabilities
            .extensions
            .get_or_insert_with(Default::default)
            .insert(TASKS_EXTENSION_ID.to_owned(), JsonObject::new());
        let mut config = ClientConfig::new(
            capabilities,
            Implementation::new("toolwarden", env!("CARGO_PKG_VERSION")),
        );
        // What `initialize` offers; `server/discover` offers 2026-07-28 (see `session`).
        config.protocol_version = self.offer.clone();
        config
    }
}
