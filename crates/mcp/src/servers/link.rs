//! The seam between a server's connection and the gateway's clients.
//!
//! A backend server may ask its client things (`sampling/createMessage`, `elicitation/create`,
//! `roots/list`) and tell it things (`notifications/message`, `notifications/resources/updated`,
//! `*/list_changed`). The backend is that client; it has no person or model behind it, so it
//! hands those messages on to whatever is attached here: the [`Gateway`](crate::Gateway),
//! which routes them to one of its own clients. With nothing attached, requests fail with a
//! JSON-RPC error that says so and notifications are dropped.
//!
//! Requests and client-bound messages cross this seam with the server's name, so the gateway
//! can route them to the client whose call runs on that server.

use std::sync::{Arc, Weak};

use futures::future::BoxFuture;
use parking_lot::RwLock;
use rmcp::ErrorData;
use rmcp::model::{ClientResult, ErrorCode, ServerNotification, ServerRequest};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

/// Where a server's requests and notifications for its client go.
pub(crate) trait Upstream: Send + Sync + 'static {
    /// Forwards a server-initiated request; `cancel` fires when the server cancels it.
    fn request(
        &self,
        server: Arc<str>,
        request: ServerRequest,
        cancel: CancellationToken,
    ) -> BoxFuture<'static, Result<ClientResult, ErrorData>>;

    /// Forwards a server's notification.
    fn notify(&self, server: Arc<str>, notification: ServerNotification);
}

/// One server's slot for an [`Upstream`]; shared by all its connections (restarts included).
#[derive(Default)]
pub(crate) struct Link {
    upstream: RwLock<Option<Weak<dyn Upstream>>>,
}

impl Link {
    /// Attaches `upstream` (replacing an earlier one).
    pub(crate) fn attach(&self, upstream: Weak<dyn Upstream>) {
        *self.upstream.write() = Some(upstream);
    }

    /// The attached upstream, while it lives.
    pub(crate) fn get(&self) -> Option<Arc<dyn Upstream>> {
        self.upstream.read().as_ref().and_then(Weak::upgrade)
    }
}

/// The error a server gets when no client can answer its request.
pub(crate) fn no_client(method: &str) -> ErrorData {
    ErrorData::new(
        ErrorCode::METHOD_NOT_FOUND,
        format!("{method}: no MCP client is connected to toolwarden that could answer it"),
        None,
    )
}

/// Re-reads a message as another of rmcp's types: rmcp parses untagged result unions by
/// trying each variant, so an answer may arrive as a different (structurally compatible)
/// variant, or raw (`CustomResult`) when it holds something rmcp cannot type.
pub(crate) fn retype<T: DeserializeOwned>(
    value: impl Serialize,
    what: &str,
) -> Result<T, ErrorData> {
    serde_json::to_value(value)
        .and_then(serde_json::from_value)
        .map_err(|e| ErrorData::internal_error(format!("{what}: malformed answer: {e}"), None))
}

/// The JSON-RPC method of a server-initiated request.
pub(crate) fn server_request_method(request: &ServerRequest) -> String {
    match request {
        ServerRequest::PingRequest(_) => "ping".into(),
        ServerRequest::CreateMessageRequest(_) => "sampling/createMessage".into(),
        ServerRequest::ListRootsRequest(_) => "roots/list".into(),
        ServerRequest::ElicitRequest(_) => "elicitation/create".into(),
        ServerRequest::CustomRequest(r) => r.method.clone(),
        _ => "a request".into(),
    }
}
