//! What the test server keeps: what it saw (cancels, calls, subscriptions, log level), its
//! `--tag`, and the injector that writes raw bytes on stdout between whole messages.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

/// Writes raw bytes on stdout between two whole messages (stdio only).
#[derive(Clone)]
pub(crate) struct Injector {
    tx: mpsc::Sender<(Vec<u8>, oneshot::Sender<()>)>,
}

impl Injector {
    pub(crate) fn new(tx: mpsc::Sender<(Vec<u8>, oneshot::Sender<()>)>) -> Self {
        Self { tx }
    }

    /// Closes the pump's stdout (its own descriptor of the pipe) and waits until it is closed.
    pub(crate) async fn close(&self) {
        self.write(Vec::new()).await;
    }

    /// Writes `raw` (nothing: closes stdout) and waits until it is on stdout.
    pub(crate) async fn write(&self, raw: Vec<u8>) {
        let (done, written) = oneshot::channel();
        if self.tx.send((raw, done)).await.is_ok() {
            let _ = written.await;
        }
    }
}

/// Which revisions of MCP the server speaks (`--era`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Era {
    /// Only the `initialize` handshake: `server/discover` is an unknown method.
    Handshake,
    /// Only 2026-07-28: `server/discover` and per-request `_meta`; `initialize` is refused.
    #[value(name = "2026-07-28")]
    Stateless,
    /// Either.
    Both,
}

/// The server; cheap to clone (HTTP sessions share one state).
#[derive(Clone)]
pub(crate) struct TestServer {
    pub(crate) state: Arc<State>,
}

pub(crate) struct State {
    pub(crate) startup_delay: Duration,
    pub(crate) era: Era,
    pub(crate) injector: Option<Injector>,
    pub(crate) cancels: Mutex<Vec<Value>>,
    /// Every `tools/call` received: request id → `{tool, arguments}`.
    pub(crate) calls: Mutex<HashMap<String, Value>>,
    pub(crate) bonus: AtomicBool,
    /// Resource URIs subscribed to, in order.
    pub(crate) subscriptions: Mutex<Vec<String>>,
    /// The last `logging/setLevel`.
    pub(crate) log_level: Mutex<Option<Value>>,
    /// How many `notifications/roots/list_changed` arrived.
    pub(crate) roots_changed: Mutex<u64>,
    /// The tasks of the `task` tool.
    pub(crate) tasks: crate::task_table::Tasks,
    /// The open `subscriptions/listen` streams (2026-07-28).
    pub(crate) listeners: Mutex<Vec<rmcp::service::SubscriptionSink>>,
}

impl State {
    /// Sends `notification` on every open `subscriptions/listen` stream that accepted its
    /// kind (2026-07-28 clients hear of changes only there).
    pub(crate) async fn tell_listeners(&self, notification: rmcp::model::ServerNotification) {
        let sinks = self.listeners.lock().clone();
        for sink in sinks {
            let _ = sink.send(notification.clone()).await;
        }
    }
}

impl TestServer {
    pub(crate) fn new(startup_delay: Duration, injector: Option<Injector>, era: Era) -> Self {
        Self {
            state: Arc::new(State {
                startup_delay,
                era,
                injector,
                cancels: Mutex::new(Vec::new()),
                calls: Mutex::new(HashMap::new()),
                bonus: AtomicBool::new(false),
                subscriptions: Mutex::new(Vec::new()),
                log_level: Mutex::new(None),
                roots_changed: Mutex::new(0),
                tasks: Default::default(),
                listeners: Mutex::new(Vec::new()),
            }),
        }
    }
}

pub(crate) static TAG: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Sets this instance's `--tag`.
pub(crate) fn set_tag(tag: String) {
    let _ = TAG.set(tag);
}

/// `echo`'s description when `--echo-description` gives one.
pub(crate) static ECHO_DESCRIPTION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
