//! The test server's MCP handler: `tools/call` goes to `tools`; what a gateway passes through
//! (resources, templates, subscriptions, prompts, completion, logging, roots) is answered here.

#![allow(
    deprecated,
    reason = "sampling, roots, logging and resources/subscribe are deprecated by SEP-2577 \
              (MCP 2026-07-28), but the session-based revisions still use them"
)]

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rmcp::ErrorData as McpError;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, CancelledNotificationParam,
    CompleteRequestParams, CompleteResult, DiscoverRequestMethod, DiscoverResult,
    GetPromptRequestParams, GetPromptResponse, GetPromptResult, GetTaskParams, GetTaskResult,
    InitializeRequestParams, InitializeResult, ListPromptsResult, ListResourceTemplatesResult,
    ListResourcesResult, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam,
    ProtocolVersion, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult,
    ServerCapabilities, ServerConfig, SetLevelRequestParams, SubscribeRequestParams,
    UnsubscribeRequestParams, UpdateTaskParams,
};
use rmcp::service::{NotificationContext, RequestContext, RoleServer};
use serde_json::{Value, json};

use crate::mrtr;
use crate::state::{Era, TAG, TestServer};

/// What a 2026-07-28-only server supports.
const STATELESS_ONLY: &[ProtocolVersion] = &[ProtocolVersion::V_2026_07_28];
use crate::tools::{ITEM_IDS, NAMES, id_json, tools, wire};

/// A resource whose `resources/read` is never answered (a hung server), unless cancelled.
const NEVER_ANSWERED: &str = "test://hang/never";

/// What `resources/read` answers for `uri`.
fn read(uri: &str) -> Option<String> {
    if uri == "test://static/hello" {
        return Some("hello".into());
    }
    if let Some(tag) = TAG.get()
        && uri == format!("test://{tag}/mine")
    {
        return Some(format!("mine of {tag}"));
    }
    uri.strip_prefix("test://items/")
        .filter(|id| !id.is_empty() && !id.contains('/'))
        .map(|id| format!("item {id}"))
}

impl rmcp::ServerHandler for TestServer {
    fn get_info(&self) -> ServerConfig {
        let capabilities: ServerCapabilities = serde_json::from_value(json!({
            "tools": {"listChanged": true},
            "resources": {"subscribe": true, "listChanged": true},
            "prompts": {"listChanged": true},
            "completions": {},
            "logging": {},
            "extensions": {"io.modelcontextprotocol/tasks": {}}
        }))
        .unwrap_or_default();
        let mut info = InitializeResult::new(capabilities);
        info.instructions = Some("tw-test-server misbehaves on purpose.".into());
        info
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let mut resources = vec![json!({"uri": "test://static/hello", "name": "hello",
            "mimeType": "text/plain"})];
        if let Some(tag) = TAG.get() {
            resources.push(json!({"uri": format!("test://{tag}/mine"), "name": "mine",
                "mimeType": "text/plain"}));
        }
        wire(json!({ "resources": resources }))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        wire(
            json!({"resourceTemplates": [{"uriTemplate": "test://items/{id}", "name": "item",
            "mimeType": "text/plain"}]}),
        )
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        if request.uri == NEVER_ANSWERED {
            // Until the request is cancelled, which is the only way it ends.
            context.ct.cancelled().await;
            return Err(McpError::internal_error("cancelled", None));
        }
        match read(&request.uri) {
            Some(body) => {
                let result: ReadResourceResult = wire(json!({"contents": [
                    {"uri": request.uri, "mimeType": "text/plain", "text": body}]}))?;
                Ok(result.into())
            }
            None => Err(McpError::resource_not_found(
                format!("no resource {}", request.uri),
                None,
            )),
        }
    }

    fn accepted_subscription_filter(
        &self,
        requested: &rmcp::model::SubscriptionFilter,
    ) -> Option<rmcp::model::SubscriptionFilter> {
        Some(requested.clone())
    }

    /// A 2026-07-28 client's stream: its resource subscriptions count as subscriptions (`seen`)
    /// while it is open.
    async fn listen(&self, context: rmcp::service::SubscriptionContext) -> Result<(), McpError> {
        let uris = context
            .accepted()
            .resource_subscriptions
            .clone()
            .unwrap_or_default();
        self.state.subscriptions.lock().extend(uris.iter().cloned());
        self.state.listeners.lock().push(context.sink().clone());
        context.cancelled().await;
        let id = context.sink().id().clone();
        self.state.listeners.lock().retain(|s| *s.id() != id);
        self.state
            .subscriptions
            .lock()
            .retain(|u| !uris.contains(u));
        Ok(())
    }

    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.state.subscriptions.lock().push(request.uri);
        Ok(())
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.state
            .subscriptions
            .lock()
            .retain(|u| *u != request.uri);
        Ok(())
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        wire(
            json!({"prompts": [{"name": "greet", "description": "Greets someone.",
            "arguments": [{"name": "name", "required": true}]}]}),
        )
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        if request.name != "greet" {
            return Err(McpError::invalid_params(
                format!("no prompt {:?}", request.name),
                None,
            ));
        }
        let name = request
            .arguments
            .as_ref()
            .and_then(|a| a.get("name"))
            .and_then(Value::as_str)
            .unwrap_or("you")
            .to_owned();
        let suffix = TAG.get().map(|t| format!(" ({t})")).unwrap_or_default();
        let result: GetPromptResult = wire(json!({"description": "A greeting", "messages": [
            {"role": "user", "content": {"type": "text", "text": format!("Hello, {name}!{suffix}")}}]}))?;
        Ok(result.into())
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, McpError> {
        let request = serde_json::to_value(&request).unwrap_or(Value::Null);
        let prefix = request
            .pointer("/argument/value")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let candidates: &[&str] = match (
            request.pointer("/ref/type").and_then(Value::as_str),
            request.pointer("/argument/name").and_then(Value::as_str),
        ) {
            (Some("ref/prompt"), Some("name")) => &NAMES,
            (Some("ref/resource"), Some("id")) => &ITEM_IDS,
            _ => &[],
        };
        let values: Vec<&str> = candidates
            .iter()
            .copied()
            .filter(|c| c.starts_with(prefix))
            .collect();
        wire(json!({"completion": {"values": values, "total": values.len(), "hasMore": false}}))
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        *self.state.log_level.lock() = serde_json::to_value(request.level).ok();
        Ok(())
    }

    async fn on_roots_list_changed(&self, _context: NotificationContext<RoleServer>) {
        *self.state.roots_changed.lock() += 1;
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        tokio::time::sleep(self.state.startup_delay).await;
        context.peer.set_peer_info(request.clone());
        // A 2026-07-28-only server refuses it: no version it supports has a handshake.
        self.negotiate_initialize(&request)
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        match self.state.era {
            Era::Stateless => Cow::Borrowed(STATELESS_ONLY),
            Era::Handshake | Era::Both => Cow::Borrowed(ProtocolVersion::KNOWN_VERSIONS),
        }
    }

    async fn discover(
        &self,
        _context: RequestContext<RoleServer>,
    ) -> Result<DiscoverResult, McpError> {
        if self.state.era == Era::Handshake {
            // A server written before 2026-07-28 does not know the method.
            return Err(McpError::method_not_found::<DiscoverRequestMethod>());
        }
        tokio::time::sleep(self.state.startup_delay).await;
        Ok(DiscoverResult::from_server_info(
            self.supported_protocol_versions().into_owned(),
            self.get_info(),
        ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(tools(
            self.state.bonus.load(Ordering::SeqCst),
        )))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let args = request.arguments.clone().unwrap_or_default();
        self.state.calls.lock().insert(
            id_json(&context.id).to_string(),
            json!({"tool": request.name.as_ref(), "arguments": Value::Object(args.clone())}),
        );
        let stateless = context
            .protocol_version()
            .is_some_and(|v| !v.has_initialize());
        if stateless && mrtr::asks(&request.name) {
            return mrtr::round(
                &request.name,
                &args,
                request.input_responses.as_ref(),
                request.request_state.as_deref(),
            );
        }
        // Over Streamable HTTP in 2026-07-28 a cancel is the closing of the request's
        // stream, not a notification: note it as one, for `cancels`.
        if request.name == "task" {
            return crate::tasks::run(&self.state, args, &context).await;
        }
        let over_http = stateless && self.state.injector.is_none();
        let _closed = over_http.then(|| self.note_stream_close(&context));
        if over_http && let Some(token) = context.meta.get_progress_token() {
            let started = ProgressNotificationParam::new(token, 0.0).with_message("started");
            let _ = context.peer.notify_progress(started).await;
        }
        self.run(&request.name, args, context)
            .await
            .map(CallToolResponse::Complete)
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        crate::tasks::get(&self.state, &request.task_id).map(GetTaskResult::new)
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        crate::tasks::update(&self.state, &request.task_id, request.input_responses)
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        crate::tasks::cancel(&self.state, &request.task_id)
    }

    async fn on_cancelled(
        &self,
        notification: CancelledNotificationParam,
        _context: NotificationContext<RoleServer>,
    ) {
        let id = notification
            .request_id
            .as_ref()
            .map(id_json)
            .unwrap_or(Value::Null);
        self.state.cancels.lock().push(json!({
            "requestId": id,
            "reason": notification.reason,
        }));
    }
}

impl TestServer {
    /// Until the returned guard drops (the handler finished), a cancel of the request's token
    /// — its response stream closed — is recorded like a `notifications/cancelled` with the
    /// reason `stream closed`.
    fn note_stream_close(&self, context: &RequestContext<RoleServer>) -> StreamWatch {
        let closed = context.ct.clone();
        let note = Note {
            state: self.state.clone(),
            id: id_json(&context.id),
            noted: Arc::default(),
        };
        let watcher = note.clone();
        let task = tokio::spawn(async move {
            closed.cancelled().await;
            watcher.record();
        });
        StreamWatch {
            note,
            closed: context.ct.clone(),
            task,
        }
    }
}

#[derive(Clone)]
struct Note {
    state: Arc<crate::state::State>,
    id: Value,
    noted: Arc<AtomicBool>,
}

impl Note {
    fn record(&self) {
        if !self.noted.swap(true, Ordering::SeqCst) {
            self.state
                .cancels
                .lock()
                .push(json!({"requestId": self.id, "reason": "stream closed"}));
        }
    }
}

/// Watches one request's stream while its handler runs.
pub(crate) struct StreamWatch {
    note: Note,
    closed: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for StreamWatch {
    fn drop(&mut self) {
        // A handler that returned because its stream closed finishes before the watcher runs.
        if self.closed.is_cancelled() {
            self.note.record();
        }
        self.task.abort();
    }
}
