//! Requests and notifications that the gateway passes through to a server unchanged:
//! `resources/*`, `prompts/*`, `completion/complete`, `logging/setLevel`, and the client's
//! `notifications/roots/list_changed`. They are not tool calls, so they are not governed; they
//! only need the live connection and a way to be cancelled.

use std::sync::{Arc, Weak};

use rmcp::model::{
    CancelledNotificationParam, ClientNotification, ClientRequest, ErrorCode, GetMeta as _,
    RequestMetaObject, ServerPeerInfo, ServerResult, Tool,
};
use rmcp::service::PeerRequestOptions;
use rmcp::{ErrorData, ServiceError};
use tokio_util::sync::CancellationToken;
use toolwarden_core::protocol::ServerStateKind;

use crate::McpServer;
use crate::link::Upstream;

impl McpServer {
    /// Attaches where the server's own requests and notifications for its client go.
    pub(crate) fn attach(&self, upstream: Weak<dyn Upstream>) {
        self.shared.link.attach(upstream);
    }

    /// What the server said about itself at its last `initialize` (capabilities,
    /// instructions), if it was ever up.
    pub(crate) fn info(&self) -> Option<Arc<ServerPeerInfo>> {
        self.shared.info.lock().clone()
    }

    /// The tools as the server last listed them.
    pub(crate) fn raw_tools(&self) -> Arc<Vec<Tool>> {
        self.shared.raw_tools.lock().clone()
    }

    /// Sends `request` on the live connection (waiting while the server is starting) and
    /// returns its answer. A JSON-RPC error from the server comes back unchanged. When
    /// `cancel` fires first, the server gets `notifications/cancelled` for the request.
    pub(crate) async fn request(
        &self,
        mut request: ClientRequest,
        meta: RequestMetaObject,
        cancel: &CancellationToken,
    ) -> Result<ServerResult, ErrorData> {
        let conn = tokio::select! {
            conn = crate::call::ready_conn(&self.shared) => conn.map_err(|e| unavailable(&e.to_string()))?,
            _ = cancel.cancelled() => return Err(cancelled()),
        };
        // The caller's `_meta` goes with it; rmcp sets its own progress token.
        *request.get_meta_mut() = meta;
        let handle = conn
            .peer
            .send_request_with_option(request, PeerRequestOptions::no_options())
            .await
            .map_err(|e| failed(&self.shared.name, e))?;
        let id = handle.id.clone();
        tokio::select! {
            answer = handle.rx => match answer {
                Ok(Ok(result)) => Ok(result),
                Ok(Err(e)) => Err(failed(&self.shared.name, e)),
                Err(_) => Err(unavailable(&format!("MCP server {:?} closed the connection", self.shared.name))),
            },
            _ = cancel.cancelled() => {
                // The typed cancel: rmcp forgets the request, which is what we want here.
                let param = CancelledNotificationParam::new(
                    Some(id),
                    Some("cancelled by the client".into()),
                );
                let _ = conn.peer.notify_cancelled(param).await;
                Err(cancelled())
            }
        }
    }

    /// Sends a notification if the server is up; drops it otherwise.
    pub(crate) async fn notify(&self, notification: ClientNotification) {
        let conn = {
            let snap = self.shared.state.borrow();
            match (snap.kind, &snap.conn) {
                (ServerStateKind::Up, Some(conn)) => Some(conn.clone()),
                _ => None,
            }
        };
        if let Some(conn) = conn
            && let Err(e) = conn.peer.send_notification(notification).await
        {
            tracing::debug!(server = %self.shared.name, error = %e, "forwarding a notification failed");
        }
    }
}

fn unavailable(detail: &str) -> ErrorData {
    ErrorData::internal_error(detail.to_owned(), None)
}

fn cancelled() -> ErrorData {
    ErrorData::new(ErrorCode::INTERNAL_ERROR, "the request was cancelled", None)
}

fn failed(server: &str, e: ServiceError) -> ErrorData {
    match e {
        ServiceError::McpError(error) => error,
        other => ErrorData::internal_error(format!("MCP server {server:?}: {other}"), None),
    }
}
