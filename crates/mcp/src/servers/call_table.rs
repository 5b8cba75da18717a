//! Per connection: which request is which call, and where a server's progress goes — the call
//! table that the connection's handler (`handler`) reads and each attempt (`call`) writes.
//!
//! rmcp puts its own `_meta.progressToken` on every request and tells us which one only once the
//! request is queued. The table is filled under `send_lock`, and a progress notification whose
//! token is not (yet) known takes that lock before looking again. A progress report can then
//! never overtake its call's registration, and progress for a finished call is simply dropped.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use rmcp::model::{NumberOrString, ProgressNotificationParam, ProgressToken, RequestId};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use toolwarden_core::{AttemptError, Heartbeat};
use toolwarden_protocol::ProgressInfo;

use super::frame::BadFrame;

/// One request in flight on a connection.
pub(crate) struct OutgoingCall {
    pub(crate) id: RequestId,
    token: ProgressToken,
    heartbeat: Heartbeat,
    inner: Mutex<CallInner>,
    failed: CancellationToken,
}

#[derive(Default)]
struct CallInner {
    last_progress: Option<f64>,
    cancelled_at: Option<Instant>,
    /// When something last arrived for the request after its cancel was sent.
    active_after_cancel: Option<Instant>,
    failure: Option<AttemptError>,
}

impl OutgoingCall {
    fn new(id: RequestId, token: ProgressToken, heartbeat: Heartbeat) -> Self {
        Self {
            id,
            token,
            heartbeat,
            inner: Mutex::new(CallInner::default()),
            failed: CancellationToken::new(),
        }
    }

    /// Records that the cancel was sent now; later progress counts as activity, not heartbeat.
    pub(crate) fn mark_cancelled(&self, at: Instant) {
        self.inner.lock().cancelled_at = Some(at);
    }

    /// When something last arrived for the request after its cancel.
    pub(crate) fn active_after_cancel(&self) -> Option<Instant> {
        self.inner.lock().active_after_cancel
    }

    /// Resolves with the failure the connection found for this request (a bad frame).
    pub(crate) async fn failed(&self) -> AttemptError {
        self.failed.cancelled().await;
        self.inner
            .lock()
            .failure
            .clone()
            .unwrap_or_else(|| AttemptError::Transport("the server sent a bad frame".into()))
    }

    fn fail(&self, error: AttemptError) {
        let mut inner = self.inner.lock();
        if inner.failure.is_none() {
            inner.failure = Some(error);
            if let Some(at) = inner.cancelled_at {
                inner.active_after_cancel = Some(Instant::now().max(at));
            }
            drop(inner);
            self.failed.cancel();
        }
    }

    fn progress(&self, p: &ProgressNotificationParam) {
        let mut inner = self.inner.lock();
        if inner.cancelled_at.is_some() {
            inner.active_after_cancel = Some(Instant::now());
            return;
        }
        // A report that waited for its call's registration may come after a later one; progress
        // only grows.
        if inner.last_progress.is_some_and(|last| p.progress < last) {
            return;
        }
        inner.last_progress = Some(p.progress);
        drop(inner);
        self.heartbeat.progress(ProgressInfo {
            progress: Some(p.progress),
            total: p.total,
            message: p.message.clone(),
        });
    }
}

#[derive(Default)]
struct Calls {
    by_token: HashMap<ProgressToken, Arc<OutgoingCall>>,
    by_id: HashMap<RequestId, Arc<OutgoingCall>>,
}

/// The call table of one connection, shared by its client handler and its calls.
pub(crate) struct CallTable {
    pub(crate) server: Arc<str>,
    calls: Mutex<Calls>,
    /// Held while a request is queued and registered (see the module docs).
    pub(crate) send_lock: tokio::sync::Mutex<()>,
    /// The server said its tool list changed.
    pub(crate) tools_changed: Notify,
    /// A call hit a transport failure on an HTTP connection: is the server still there?
    pub(crate) suspect: Notify,
}

impl CallTable {
    pub(crate) fn new(server: Arc<str>) -> Arc<Self> {
        Arc::new(Self {
            server,
            calls: Mutex::new(Calls::default()),
            send_lock: tokio::sync::Mutex::new(()),
            tools_changed: Notify::new(),
            suspect: Notify::new(),
        })
    }

    /// Registers a request just queued (call with `send_lock` held).
    pub(crate) fn register(
        self: &Arc<Self>,
        id: RequestId,
        token: ProgressToken,
        heartbeat: Heartbeat,
    ) -> Registration {
        let call = Arc::new(OutgoingCall::new(id.clone(), token.clone(), heartbeat));
        let mut calls = self.calls.lock();
        calls.by_token.insert(token, call.clone());
        calls.by_id.insert(id, call.clone());
        Registration {
            table: self.clone(),
            call,
        }
    }

    /// The requests in flight.
    pub(crate) fn in_flight(&self) -> Vec<RequestId> {
        self.calls.lock().by_id.keys().cloned().collect()
    }

    fn lookup(&self, token: &ProgressToken) -> Option<Arc<OutgoingCall>> {
        self.calls.lock().by_token.get(token).cloned()
    }

    /// Delivers a server's progress report to its call's heartbeat now, if its call is in the
    /// table; `false` if it is not (yet).
    pub(super) fn progress_now(&self, p: &ProgressNotificationParam) -> bool {
        match self.lookup(&p.progress_token) {
            Some(call) => {
                call.progress(p);
                true
            }
            None => false,
        }
    }

    /// A server's progress report that `in_order` did not deliver: to its call's heartbeat, or
    /// dropped.
    pub(super) async fn progress(&self, p: ProgressNotificationParam) {
        let call = match self.lookup(&p.progress_token) {
            Some(call) => Some(call),
            None => {
                // Maybe its call is being registered right now: wait for that, look again.
                let _queued = self.send_lock.lock().await;
                self.lookup(&p.progress_token)
            }
        };
        match call {
            Some(call) => call.progress(&p),
            None => tracing::trace!(server = %self.server, token = ?p.progress_token,
                "progress for no call in flight (finished or unknown): dropped"),
        }
    }

    /// A bad frame arrived: fail the request it names, or just log it.
    pub(crate) fn bad_frame(&self, bad: BadFrame) {
        let call = bad.id.as_ref().and_then(|id| {
            let calls = self.calls.lock();
            calls.by_id.get(id).cloned().or_else(|| match id {
                // A numeric id sent back as a string still names our request.
                NumberOrString::String(s) => s
                    .parse::<i64>()
                    .ok()
                    .and_then(|n| calls.by_id.get(&NumberOrString::Number(n)).cloned()),
                NumberOrString::Number(_) => None,
            })
        });
        match call {
            Some(call) => {
                tracing::warn!(server = %self.server, id = %call.id, problem = %bad.problem,
                    "bad frame for a call in flight: failing the call");
                call.fail(AttemptError::Transport(bad.problem));
            }
            None => tracing::warn!(server = %self.server, problem = %bad.problem,
                "the server wrote a bad frame (ignored: it names no call in flight)"),
        }
    }
}

/// A call's place in the table; leaving it (drop) unregisters the call.
pub(crate) struct Registration {
    table: Arc<CallTable>,
    pub(crate) call: Arc<OutgoingCall>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut calls = self.table.calls.lock();
        calls.by_token.remove(&self.call.token);
        calls.by_id.remove(&self.call.id);
    }
}
