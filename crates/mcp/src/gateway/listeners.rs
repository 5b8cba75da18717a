//! The open `subscriptions/listen` streams of stateless clients (`listen` serves each), and the
//! delivery of a notification to those that asked for its kind. Below the gateway's state, which
//! holds them; it reads nothing of the gateway.

use parking_lot::Mutex;
use rmcp::model::{ServerNotification, SubscriptionFilter};
use rmcp::service::SubscriptionSink;
use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;
use toolwarden_protocol::SessionKey;

/// The open `subscriptions/listen` streams: each with a queue its own task empties in order, so
/// that a stream's notifications arrive in the order they were delivered, and a slow client
/// holds up nobody.
#[derive(Default)]
pub(crate) struct Listeners {
    open: Mutex<Vec<Listener>>,
}

struct Listener {
    key: SessionKey,
    accepted: SubscriptionFilter,
    queue: mpsc::UnboundedSender<ServerNotification>,
}

impl Listeners {
    /// Queues `notification` for every open stream that accepted its kind.
    pub(crate) fn deliver(&self, notification: &ServerNotification) {
        for listener in self.open.lock().iter() {
            if accepts(&listener.accepted, notification) {
                let _ = listener.queue.send(notification.clone());
            }
        }
    }

    /// A stream opened: `sink` sends what is delivered to it, in order, on a task of `tasks`
    /// that ends when the stream is [removed](Self::remove).
    pub(crate) fn add(&self, key: SessionKey, sink: SubscriptionSink, tasks: &TaskTracker) {
        let (queue, mut rx) = mpsc::unbounded_channel::<ServerNotification>();
        let accepted = sink.accepted().clone();
        tasks.spawn(async move {
            while let Some(notification) = rx.recv().await {
                if let Err(e) = sink.send(notification).await {
                    tracing::debug!(subscription = %sink.id(), error = %e,
                        "a notification on a subscriptions/listen stream failed");
                }
            }
        });
        self.open.lock().push(Listener {
            key,
            accepted,
            queue,
        });
    }

    /// A stream closed.
    pub(crate) fn remove(&self, key: &SessionKey) {
        self.open.lock().retain(|l| l.key != *key);
    }
}

/// Whether a stream that accepted `filter` takes `notification`.
fn accepts(filter: &SubscriptionFilter, notification: &ServerNotification) -> bool {
    match notification {
        ServerNotification::ToolListChangedNotification(_) => {
            filter.tools_list_changed == Some(true)
        }
        ServerNotification::PromptListChangedNotification(_) => {
            filter.prompts_list_changed == Some(true)
        }
        ServerNotification::ResourceListChangedNotification(_) => {
            filter.resources_list_changed == Some(true)
        }
        ServerNotification::ResourceUpdatedNotification(n) => filter
            .resource_subscriptions
            .as_ref()
            .is_some_and(|uris| uris.contains(&n.params.uri)),
        _ => false,
    }
}
