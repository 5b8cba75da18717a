//! The open `subscriptions/listen` streams of stateless clients (`listen` serves each), and the
//! delivery of a notification to those that asked for its kind. Below the gateway's state, which
//! holds them; it reads nothing of the gateway.

use parking_lot::Mutex;
use rmcp::model::{ServerNotification, SubscriptionFilter};
use rmcp::service::SubscriptionSink;
use tokio_util::task::TaskTracker;
use toolwarden_protocol::SessionId;

/// The open `subscriptions/listen` streams.
#[derive(Default)]
pub(crate) struct Listeners {
    open: Mutex<Vec<(SessionId, SubscriptionSink)>>,
}

impl Listeners {
    /// Sends `notification` on every open stream that accepted its kind (each sink checks its
    /// own filter), each on a task of its own: a slow client holds up nobody.
    pub(crate) fn deliver(&self, tasks: &TaskTracker, notification: &ServerNotification) {
        let sinks: Vec<SubscriptionSink> = self
            .open
            .lock()
            .iter()
            .filter(|(_, sink)| accepts(sink.accepted(), notification))
            .map(|(_, sink)| sink.clone())
            .collect();
        for sink in sinks {
            let notification = notification.clone();
            tasks.spawn(async move {
                if let Err(e) = sink.send(notification).await {
                    tracing::debug!(subscription = %sink.id(), error = %e,
                        "a notification on a subscriptions/listen stream failed");
                }
            });
        }
    }

    pub(crate) fn add(&self, key: SessionId, sink: SubscriptionSink) {
        self.open.lock().push((key, sink));
    }

    pub(crate) fn remove(&self, key: &SessionId) {
        self.open.lock().retain(|(k, _)| k != key);
    }
}

/// Whether a stream that accepted `filter` takes `notification`.
fn accepts(filter: &SubscriptionFilter, notification: &ServerNotification) -> bool {
    match notification {
        ServerNotification::ToolListChangedNotification(_) => filter.tools_list_changed == Some(true),
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

