//! A server's own requests and notifications, on their way to a client.

#![allow(
    deprecated,
    reason = "sampling, roots and logging are deprecated by SEP-2577 (MCP 2026-07-28), but the \
              session-based revisions that clients speak still use them"
)]

use std::sync::Arc;

use futures::future::BoxFuture;
use rmcp::ErrorData;
use rmcp::model::{
    ClientResult, ElicitRequestParams, ErrorCode, ServerNotification, ServerRequest,
};
use tokio_util::sync::CancellationToken;

use super::Gateway;
use super::session::ClientSession;
use crate::client::link::{Upstream, no_client, server_request_method};

impl Upstream for Gateway {
    fn request(
        &self,
        server: Arc<str>,
        request: ServerRequest,
        cancel: CancellationToken,
    ) -> BoxFuture<'static, Result<ClientResult, ErrorData>> {
        let method = server_request_method(&request);
        let Some((session, call)) = self.route_client(&server) else {
            return Box::pin(std::future::ready(Err(no_client(&method))));
        };
        if let Err(e) = supports(&session, &request, &method) {
            return Box::pin(std::future::ready(Err(e)));
        }
        tracing::debug!(%server, %method, session = %session.id, call = ?call,
            "forwarding a server's request to its client");
        Box::pin(async move {
            session
                .request(call.as_deref(), request, None, cancel)
                .await
        })
    }

    fn notify(&self, server: Arc<str>, notification: ServerNotification) {
        match &notification {
            ServerNotification::ResourceUpdatedNotification(n) => {
                for session in self.subscribers(&n.params.uri) {
                    session.notify(&self.tasks, notification.clone());
                }
            }
            ServerNotification::LoggingMessageNotification(_)
            | ServerNotification::ResourceListChangedNotification(_)
            | ServerNotification::PromptListChangedNotification(_) => {
                self.broadcast(notification);
            }
            // Tool lists reach clients through the engine's tool set; progress and cancels
            // belong to requests and are handled by the backend.
            ServerNotification::ToolListChangedNotification(_)
            | ServerNotification::ProgressNotification(_)
            | ServerNotification::CancelledNotification(_) => {}
            _ => {
                if let Some((session, _)) = self.route_client(&server) {
                    session.notify(&self.tasks, notification);
                }
            }
        }
    }
}

/// Whether the client declared what the request needs; the error a client without it would
/// answer otherwise.
fn supports(
    session: &ClientSession,
    request: &ServerRequest,
    method: &str,
) -> Result<(), ErrorData> {
    let caps = session.capabilities();
    let ok = match request {
        ServerRequest::CreateMessageRequest(_) => caps.is_some_and(|c| c.sampling.is_some()),
        ServerRequest::ListRootsRequest(_) => caps.is_some_and(|c| c.roots.is_some()),
        ServerRequest::ElicitRequest(r) => {
            let elicitation = caps.and_then(|c| c.elicitation.as_ref());
            match &r.params {
                ElicitRequestParams::UrlElicitationParams { .. } => {
                    elicitation.is_some_and(|e| e.url.is_some())
                }
                // `elicitation: {}` means form.
                _ => elicitation.is_some_and(|e| e.form.is_some() || e.url.is_none()),
            }
        }
        _ => true,
    };
    if ok {
        Ok(())
    } else {
        Err(ErrorData::new(
            ErrorCode::METHOD_NOT_FOUND,
            format!("{method}: the connected MCP client does not support it"),
            None,
        ))
    }
}
