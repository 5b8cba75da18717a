//! The test server's MCP handler: `tools/call` goes to `tools`; what a gateway passes through
//! (resources, templates, subscriptions, prompts, completion, logging, roots) is answered here.

#![allow(
    deprecated,
    reason = "sampling, roots, logging and resources/subscribe are deprecated by SEP-2577 \
              (MCP 2026-07-28), but the session-based revisions still use them"
)]

use std::sync::atomic::Ordering;

use rmcp::ErrorData as McpError;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelledNotificationParam, CompleteRequestParams,
    CompleteResult, GetPromptRequestParams, GetPromptResponse, GetPromptResult,
    InitializeRequestParams, InitializeResult, ListPromptsResult, ListResourceTemplatesResult,
    ListResourcesResult, ListToolsResult, PaginatedRequestParams, ReadResourceRequestParams,
    ReadResourceResponse, ReadResourceResult, ServerCapabilities, ServerConfig,
    SetLevelRequestParams, SubscribeRequestParams, UnsubscribeRequestParams,
};
use rmcp::service::{NotificationContext, RequestContext, RoleServer};
use serde_json::{Value, json};

use crate::state::{TAG, TestServer};
use crate::tools::{ITEM_IDS, NAMES, id_json, tools, wire};

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
            "logging": {}
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
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
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
        self.negotiate_initialize(&request)
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
        let args = request.arguments.unwrap_or_default();
        self.state.calls.lock().insert(
            id_json(&context.id).to_string(),
            json!({"tool": request.name.as_ref(), "arguments": Value::Object(args.clone())}),
        );
        self.run(&request.name, args, context)
            .await
            .map(CallToolResponse::Complete)
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
