//! Requests and notifications that the gateway passes through to a server unchanged:
//! `resources/*`, `prompts/*`, `completion/complete`, `logging/setLevel`, and the client's
//! `notifications/roots/list_changed`. They are not tool calls, so they are not governed; they
//! only need the live connection and a way to be cancelled.

#![allow(
    deprecated,
    reason = "resources/subscribe is deprecated by SEP-2577 (MCP 2026-07-28); toward a server of \
              that revision it is translated here"
)]

use rmcp::model::{
    CancelledNotificationParam, ClientNotification, ClientRequest, ErrorCode, GetMeta as _,
    RequestMetaObject, ServerResult,
};
use std::time::Duration;

use tokio::time::Instant;

use rmcp::model::RequestId;
use rmcp::service::{Peer, PeerRequestOptions, RoleClient};
use rmcp::{ErrorData, ServiceError};
use tokio_util::sync::CancellationToken;
use toolwarden_protocol::ServerStateKind;

use super::listen;
use super::server_core::ServerCore;
use super::session::ServerEra;

/// Sends `request` on the live connection (waiting while the server is starting) and returns
/// its answer. A JSON-RPC error from the server comes back unchanged. When `cancel` fires
/// first, the server gets `notifications/cancelled` for the request.
///
/// Every request has a deadline, the wait for a starting server included:
/// a server that never answers (or a transport that loses the answer) ends the request with
/// [`TIMED_OUT`] and the server gets `notifications/cancelled` — never silence.
pub(super) async fn request(
    shared: &ServerCore,
    mut request: ClientRequest,
    meta: RequestMetaObject,
    cancel: &CancellationToken,
    until: Deadline,
) -> Result<ServerResult, ErrorData> {
    let (deadline, within) = (until.at, until.length);
    let method = request.method().to_owned();
    // What the server's clients subscribe to, kept whatever state the server is in: toward a
    // 2026-07-28 server it is the connection's `subscriptions/listen` stream (`listen`).
    let subscribing = match &request {
        ClientRequest::SubscribeRequest(r) => {
            shared.wanted.add(&r.params.uri);
            Some(r.params.uri.clone())
        }
        ClientRequest::UnsubscribeRequest(r) => {
            shared.wanted.remove(&r.params.uri);
            None
        }
        _ => None,
    };
    let conn = tokio::select! {
        conn = shared.ready_conn() => conn.map_err(|e| unavailable(&e.to_string()))?,
        _ = cancel.cancelled() => return Err(cancelled()),
        () = tokio::time::sleep_until(deadline) => {
            return Err(timed_out(&shared.name, &method, within));
        }
    };
    // A 2026-07-28 server has no `resources/subscribe`: subscriptions ride the connection's
    // `subscriptions/listen` stream, reopened with the new set; a subscription is answered once
    // the server acknowledged it there.
    if conn.era == ServerEra::Stateless {
        match (&request, subscribing) {
            (ClientRequest::SubscribeRequest(_), Some(uri)) => {
                let offers = shared
                    .info
                    .lock()
                    .as_ref()
                    .is_some_and(|i| listen::worth_listening(&i.capabilities));
                if !offers {
                    return Err(ErrorData::new(
                        ErrorCode::METHOD_NOT_FOUND,
                        format!(
                            "MCP server {:?} offers no resource subscriptions (it speaks 2026-07-28 and declares no subscriptions/listen)",
                            shared.name
                        ),
                        None,
                    ));
                }
                return tokio::select! {
                    () = shared.wanted.acknowledged(&uri) => Ok(ServerResult::empty(())),
                    _ = cancel.cancelled() => Err(cancelled()),
                    () = tokio::time::sleep_until(deadline) => {
                        Err(timed_out(&shared.name, &method, within))
                    }
                };
            }
            (ClientRequest::UnsubscribeRequest(_), _) => return Ok(ServerResult::empty(())),
            _ => {}
        }
    }
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
            withdraw(&conn.peer, id, "cancelled by the client").await;
            Err(cancelled())
        }
        () = tokio::time::sleep_until(deadline) => {
            withdraw(&conn.peer, id, "timed out in toolwarden").await;
            Err(timed_out(&shared.name, &method, within))
        }
    }
}

/// The typed cancel: rmcp forgets the request, which is what we want here.
async fn withdraw(peer: &Peer<RoleClient>, id: RequestId, reason: &str) {
    let param = CancelledNotificationParam::new(Some(id), Some(reason.into()));
    let _ = peer.notify_cancelled(param).await;
}

/// When a request must be answered by, and how long that was when it was set (for messages).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Deadline {
    pub(crate) at: Instant,
    pub(crate) length: Duration,
}

impl Deadline {
    /// `length` from now.
    pub(crate) fn after(length: Duration) -> Self {
        Self {
            at: Instant::now() + length,
            length,
        }
    }
}

/// The JSON-RPC error code of a forwarded request that got no answer within its deadline: the
/// one the MCP SDKs give their own request timeouts.
pub(crate) const TIMED_OUT: ErrorCode = ErrorCode(-32001);

fn timed_out(server: &str, method: &str, within: Duration) -> ErrorData {
    ErrorData::new(
        TIMED_OUT,
        format!(
            "MCP server {server:?} did not answer {method} within {} (toolwarden's deadline for \
             a forwarded request; pass a larger `_meta.timeout_ms` to wait longer)",
            toolwarden_protocol::format_duration(within)
        ),
        None,
    )
}

/// Sends a notification if the server is up; drops it otherwise.
pub(super) async fn notify(shared: &ServerCore, notification: ClientNotification) {
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
