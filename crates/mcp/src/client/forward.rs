//! Requests and notifications that the gateway passes through to a server unchanged:
//! `resources/*`, `prompts/*`, `completion/complete`, `logging/setLevel`, and the client's
//! `notifications/roots/list_changed`. They are not tool calls, so they are not governed; they
//! only need the live connection and a way to be cancelled.

use rmcp::model::{
    CancelledNotificationParam, ClientNotification, ClientRequest, ErrorCode, GetMeta as _,
    RequestMetaObject, ServerResult,
};
use rmcp::service::PeerRequestOptions;
use rmcp::{ErrorData, ServiceError};
use tokio_util::sync::CancellationToken;
use toolwarden_protocol::ServerStateKind;

use super::shared::Shared;

/// Sends `request` on the live connection (waiting while the server is starting) and returns
/// its answer. A JSON-RPC error from the server comes back unchanged. When `cancel` fires
/// first, the server gets `notifications/cancelled` for the request.
pub(super) async fn request(
    shared: &Shared,
    mut request: ClientRequest,
    meta: RequestMetaObject,
    cancel: &CancellationToken,
) -> Result<ServerResult, ErrorData> {
    let conn = tokio::select! {
        conn = shared.ready_conn() => conn.map_err(|e| unavailable(&e.to_string()))?,
        _ = cancel.cancelled() => return Err(cancelled()),
    };
    // The caller's `_meta` goes with it; rmcp sets its own progress token.
    *request.get_meta_mut() = meta;
    let handle = conn
        .peer
        .send_request_with_option(request, PeerRequestOptions::no_options())
        .await
        .map_err(|e| failed(&shared.name, e))?;
    let id = handle.id.clone();
    tokio::select! {
        answer = handle.rx => match answer {
            Ok(Ok(result)) => Ok(result),
            Ok(Err(e)) => Err(failed(&shared.name, e)),
            Err(_) => Err(unavailable(&format!("MCP server {:?} closed the connection", shared.name))),
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
pub(super) async fn notify(shared: &Shared, notification: ClientNotification) {
    let conn = {
        let snap = shared.state.borrow();
        match (snap.kind, &snap.conn) {
            (ServerStateKind::Up, Some(conn)) => Some(conn.clone()),
            _ => None,
        }
    };
    if let Some(conn) = conn
        && let Err(e) = conn.peer.send_notification(notification).await
    {
        tracing::debug!(server = %shared.name, error = %e, "forwarding a notification failed");
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
