//! A 2026-07-28 server tells of changes only on a `subscriptions/listen` stream: its tool list
//! (which the backend re-reads), its prompt and resource lists, and updates of the resources a
//! client subscribed to. The handshake revisions have `notifications/*/list_changed` on the
//! session and `resources/subscribe`; so that a handshake client of the gateway subscribes to a
//! resource of such a server as it would to any other, the backend translates: it keeps one
//! stream per connection, asking for every list change and for the resources subscribed to
//! (`Wanted`), opens it again when that set changes, and hands what arrives on as the
//! handshake revisions' notifications.

#![allow(
    deprecated,
    reason = "resources/subscribe is deprecated by SEP-2577 (MCP 2026-07-28); it is what this \
              module translates for the session-based revisions"
)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use rmcp::ServiceError;
use rmcp::model::{ErrorCode, GetMeta as _, ServerCapabilities, ServerNotification};

use super::server_core::ServerCore;
use super::session::Conn;

/// The `_meta` key a stream's notifications carry its id in.
const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";

/// How long to wait before opening a stream again after it failed: doubled after each failure
/// in a row, up to `RETRY_MAX`.
const RETRY: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(60);

/// Whether a server offers anything a stream would carry (its capabilities, as it declared
/// them at `server/discover`).
pub(crate) fn worth_listening(capabilities: &ServerCapabilities) -> bool {
    capabilities
        .tools
        .as_ref()
        .is_some_and(|t| t.list_changed == Some(true))
        || capabilities
            .prompts
            .as_ref()
            .is_some_and(|p| p.list_changed == Some(true))
        || capabilities
            .resources
            .as_ref()
            .is_some_and(|r| r.list_changed == Some(true) || r.subscribe == Some(true))
}

/// Keeps `conn`'s stream open until the connection ends; gives up on a server that does not
/// know the method, and waits longer after each failure in a row.
pub(crate) async fn run(shared: Arc<ServerCore>, conn: Arc<Conn>) {
    let mut retry = RETRY;
    loop {
        let changed = shared.wanted.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let filter = shared.wanted.filter();
        let mut subscription = tokio::select! {
            opened = conn.peer.listen(filter) => match opened {
                Ok(subscription) => subscription,
                Err(ServiceError::McpError(e)) if e.code == ErrorCode::METHOD_NOT_FOUND => {
                    tracing::info!(server = %shared.name,
                        "the server does not serve subscriptions/listen: its changes cannot be heard");
                    return;
                }
                Err(e) => {
                    tracing::debug!(server = %shared.name, error = %e, ?retry,
                        "subscriptions/listen failed; trying again");
                    tokio::select! {
                        () = tokio::time::sleep(retry) => {
                            retry = (retry * 2).min(RETRY_MAX);
                            continue;
                        }
                        _ = conn.ended() => return,
                    }
                }
            },
            _ = conn.ended() => return,
        };
        retry = RETRY;
        let acknowledged = subscription
            .acknowledged()
            .resource_subscriptions
            .clone()
            .unwrap_or_default();
        shared
            .wanted
            .acknowledged
            .send_replace(acknowledged.into_iter().collect());
        loop {
            tokio::select! {
                next = subscription.next() => match next {
                    Ok(Some(notification)) => deliver(&shared, &conn, notification),
                    Ok(None) | Err(_) => {
                        // The server ended the stream: open another, unless the connection
                        // ended with it.
                        shared.wanted.acknowledged.send_replace(BTreeSet::new());
                        tokio::select! {
                            () = tokio::time::sleep(retry) => break,
                            _ = conn.ended() => return,
                        }
                    }
                },
                () = &mut changed => {
                    let _ = subscription.cancel().await;
                    break;
                }
                _ = conn.ended() => {
                    shared.wanted.acknowledged.send_replace(BTreeSet::new());
                    return;
                }
            }
        }
    }
}

/// What arrived on the stream, as a session's notification would have: the tool list is read
/// again; the rest goes to the gateway's clients.
fn deliver(shared: &ServerCore, conn: &Conn, mut notification: ServerNotification) {
    notification.get_meta_mut().remove(SUBSCRIPTION_ID);
    match notification {
        ServerNotification::ToolListChangedNotification(_) => {
            conn.calls.tools_changed.notify_one();
        }
        other => match shared.link.get() {
            Some(upstream) => upstream.notify(shared.name.clone(), other),
            None => tracing::trace!(server = %shared.name,
                "no client attached: a server notification was dropped"),
        },
    }
}
