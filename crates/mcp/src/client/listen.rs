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

use parking_lot::Mutex;
use rmcp::model::{GetMeta as _, ServerNotification, SubscriptionFilter};
use tokio::sync::Notify;

use super::session::Conn;
use super::shared::Shared;

/// The `_meta` key a stream's notifications carry its id in.
const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";

/// How long to wait before opening a stream again after it failed.
const RETRY: Duration = Duration::from_secs(1);

/// The resources a server's clients are subscribed to, whichever connection serves them
/// (restarts included).
#[derive(Default)]
pub(crate) struct Wanted {
    uris: Mutex<BTreeSet<String>>,
    changed: Notify,
}

impl Wanted {
    /// Subscribes to `uri` (again: a renewal after a restart changes nothing).
    pub(crate) fn add(&self, uri: &str) {
        if self.uris.lock().insert(uri.to_owned()) {
            self.changed.notify_waiters();
        }
    }

    /// Unsubscribes from `uri`.
    pub(crate) fn remove(&self, uri: &str) {
        if self.uris.lock().remove(uri) {
            self.changed.notify_waiters();
        }
    }

    fn filter(&self) -> SubscriptionFilter {
        let uris: Vec<String> = self.uris.lock().iter().cloned().collect();
        let builder = SubscriptionFilter::builder()
            .tools_list_changed()
            .prompts_list_changed()
            .resources_list_changed();
        if uris.is_empty() {
            builder.build()
        } else {
            builder.resource_subscriptions(uris).build()
        }
    }
}

/// Keeps `conn`'s stream open until the connection ends.
pub(crate) async fn run(shared: Arc<Shared>, conn: Arc<Conn>) {
    loop {
        let changed = shared.wanted.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let mut subscription = tokio::select! {
            opened = conn.peer.listen(shared.wanted.filter()) => match opened {
                Ok(subscription) => subscription,
                Err(e) => {
                    tracing::debug!(server = %shared.name, error = %e,
                        "subscriptions/listen failed; trying again");
                    tokio::select! {
                        () = tokio::time::sleep(RETRY) => continue,
                        _ = conn.ended() => return,
                    }
                }
            },
            _ = conn.ended() => return,
        };
        loop {
            tokio::select! {
                next = subscription.next() => match next {
                    Ok(Some(notification)) => deliver(&shared, &conn, notification),
                    Ok(None) | Err(_) => {
                        // The server ended the stream: open another, unless the connection
                        // ended with it.
                        tokio::select! {
                            () = tokio::time::sleep(RETRY) => break,
                            _ = conn.ended() => return,
                        }
                    }
                },
                () = &mut changed => {
                    let _ = subscription.cancel().await;
                    break;
                }
                _ = conn.ended() => return,
            }
        }
    }
}

/// What arrived on the stream, as a session's notification would have: the tool list is read
/// again; the rest goes to the gateway's clients.
fn deliver(shared: &Shared, conn: &Conn, mut notification: ServerNotification) {
    notification.get_meta_mut().remove(SUBSCRIPTION_ID);
    match notification {
        ServerNotification::ToolListChangedNotification(_) => {
            conn.router.tools_changed.notify_one();
        }
        other => match shared.link.get() {
            Some(upstream) => upstream.notify(shared.name.clone(), other),
            None => tracing::trace!(server = %shared.name,
                "no client attached: a server notification was dropped"),
        },
    }
}
