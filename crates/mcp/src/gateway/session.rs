//! One client connection: its toolwarden session, its calls in flight, and the requests the
//! gateway sends it. Whatever must find one of the client's calls or requests again — a stop
//! from its closed response stream, a server's request raised during its call, the answer to a
//! request sent on a call's response — finds it here.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::future::BoxFuture;
use parking_lot::Mutex;
use rmcp::ErrorData;
use rmcp::model::{ClientCapabilities, ClientResult, RequestId, ServerNotification, ServerRequest};
use rmcp::service::{Peer, RoleServer};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use toolwarden_protocol::{CancelReason, Principal, SessionId, SessionKey};

use super::channel::{self, ClientChannel};
use super::options::{ANSWER_ID_PREFIX, STREAM_CLOSE_SETTLE};

/// Something to send to the client from a call's handler task (see [`ClientSession::request`]):
/// given the call's way back to its client, the future that sends it.
pub(crate) type Job = Box<dyn FnOnce(Arc<dyn ClientChannel>) -> BoxFuture<'static, ()> + Send>;

/// A call of this client in flight.
pub(crate) struct ClientCall {
    /// The MCP server that serves its tool, if one does.
    pub(crate) server: Option<Arc<str>>,
    /// When it started, in the gateway's order.
    pub(crate) seq: u64,
    /// Requests to send from the call's handler task.
    pub(crate) jobs: mpsc::UnboundedSender<Job>,
}

/// How many stops of not-yet-registered requests are kept.
const EARLY_STOPS_KEPT: usize = 256;

/// A request of the client that the gateway is answering; dropped, it is unregistered.
pub(crate) struct OpenRequest<'a> {
    session: &'a ClientSession,
    key: String,
    pub(crate) stop: Stop,
}

impl Drop for OpenRequest<'_> {
    fn drop(&mut self) {
        self.session.requests.lock().remove(&self.key);
    }
}

/// The client stopped waiting for one request, and why.
#[derive(Clone, Default)]
pub(crate) struct Stop {
    token: CancellationToken,
    reason: Arc<OnceLock<CancelReason>>,
}

impl Stop {
    fn fire(&self, reason: CancelReason) {
        let _ = self.reason.set(reason);
        self.token.cancel();
    }

    /// Resolves with the reason once the client stopped waiting.
    pub(crate) async fn stopped(&self) -> CancelReason {
        self.token.cancelled().await;
        self.reason
            .get()
            .copied()
            .unwrap_or(CancelReason::ClientDisconnect)
    }

    pub(crate) fn token(&self) -> &CancellationToken {
        &self.token
    }
}

/// The gateway's clock of recency: sessions and calls are ordered by the numbers it hands out
/// (the most recent client of a server gets that server's requests).
pub(crate) struct Recency(AtomicU64);

impl Recency {
    pub(crate) fn new() -> Self {
        Self(AtomicU64::new(1))
    }

    /// The next number, larger than every one before.
    pub(crate) fn next(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }
}

/// One MCP client connection.
pub(crate) struct ClientSession {
    pub(crate) id: SessionId,
    /// Who the client is: every request of the session must be this principal's (over HTTP,
    /// the token of its `initialize`, or of the stateless requests that named it).
    pub(crate) principal: Principal,
    /// Where its calls' and sessions' order comes from (shared by the gateway's sessions).
    recency: Arc<Recency>,
    /// The gateway's tasks: what the session sends on its own runs on them.
    tasks: TaskTracker,
    peer: OnceLock<Peer<RoleServer>>,
    /// What the client declared: at `initialize`, or (stateless) with its latest request.
    capabilities: Mutex<Option<Arc<ClientCapabilities>>>,
    http_id: OnceLock<String>,
    /// Calls in flight, by call id (the JSON-RPC request id).
    calls: Mutex<HashMap<String, ClientCall>>,
    /// Requests in flight, by JSON-RPC request id.
    requests: Mutex<HashMap<String, Stop>>,
    /// Stops for requests not registered yet (the stream can close before rmcp hands the
    /// request to its handler).
    early_stops: Mutex<VecDeque<(String, CancelReason)>>,
    /// The shutdown of whatever serves this connection.
    shutdown: CancellationToken,
    /// Resource URIs this client subscribed to.
    subscriptions: Mutex<HashSet<String>>,
    ended: CancellationToken,
    end_reason: Mutex<Option<CancelReason>>,
    last_active: AtomicU64,
    /// Requests the gateway sent on the responses of the calls it serves itself, waiting for
    /// the client's answer, by JSON-RPC id (see [`ClientSession::expect_answer`]).
    answers: Mutex<HashMap<String, oneshot::Sender<Result<ClientResult, ErrorData>>>>,
    next_answer: AtomicU64,
    /// The client declared the 2025-11-25 `tasks` capability at `initialize` (and negotiated
    /// that revision): its `tools/call` may ask for a task (`super::handshake_tasks`).
    handshake_tasks: AtomicBool,
}

impl ClientSession {
    /// A session for a new connection; `shutdown` is that of whatever serves it.
    pub(crate) fn new(
        principal: Principal,
        recency: Arc<Recency>,
        tasks: TaskTracker,
        shutdown: CancellationToken,
    ) -> Arc<Self> {
        let id = SessionId::new(format!("mcp_{}", ulid::Ulid::new()));
        Self::with_id(
            SessionKey::new(principal.name.clone(), id),
            principal,
            recency,
            tasks,
            shutdown,
        )
    }

    /// A session of a chosen id (the session of stateless requests); `key`'s principal is
    /// `principal`'s name.
    pub(crate) fn with_id(
        key: SessionKey,
        principal: Principal,
        recency: Arc<Recency>,
        tasks: TaskTracker,
        shutdown: CancellationToken,
    ) -> Arc<Self> {
        let last_active = AtomicU64::new(recency.next());
        debug_assert_eq!(key.principal, principal.name);
        Arc::new(Self {
            id: key.id,
            principal,
            recency,
            tasks,
            peer: OnceLock::new(),
            capabilities: Mutex::new(None),
            http_id: OnceLock::new(),
            calls: Mutex::default(),
            requests: Mutex::default(),
            early_stops: Mutex::default(),
            shutdown,
            subscriptions: Mutex::default(),
            ended: CancellationToken::new(),
            end_reason: Mutex::new(None),
            last_active,
            answers: Mutex::default(),
            next_answer: AtomicU64::new(1),
            handshake_tasks: AtomicBool::new(false),
        })
    }

    /// The session as the engine keys it: its principal's, by its id.
    pub(crate) fn key(&self) -> SessionKey {
        SessionKey::new(self.principal.name.clone(), self.id.clone())
    }

    /// A fresh id for a request to the client, and where its answer will arrive.
    pub(crate) fn expect_answer(
        &self,
    ) -> (String, oneshot::Receiver<Result<ClientResult, ErrorData>>) {
        let n = self.next_answer.fetch_add(1, Ordering::Relaxed);
        let id = format!("{ANSWER_ID_PREFIX}{n}");
        let (tx, rx) = oneshot::channel();
        self.answers.lock().insert(id.clone(), tx);
        (id, rx)
    }

    /// The client answered request `id`; false if nothing waits for it (any more).
    pub(crate) fn answer(&self, id: &str, answer: Result<ClientResult, ErrorData>) -> bool {
        match self.answers.lock().remove(id) {
            Some(tx) => tx.send(answer).is_ok(),
            None => false,
        }
    }

    /// Nothing waits for request `id` any more.
    pub(crate) fn forget_answer(&self, id: &str) {
        self.answers.lock().remove(id);
    }

    /// The client finished `initialize`.
    pub(crate) fn initialized(
        self: &Arc<Self>,
        peer: Peer<RoleServer>,
        capabilities: ClientCapabilities,
        http_id: Option<String>,
    ) {
        let _ = self.peer.set(peer);
        *self.capabilities.lock() = Some(Arc::new(capabilities));
        if let Some(id) = http_id {
            let _ = self.http_id.set(id);
        }
    }

    /// The client negotiated 2025-11-25 and declared its `tasks` capability.
    pub(crate) fn declare_handshake_tasks(&self) {
        self.handshake_tasks.store(true, Ordering::Relaxed);
    }

    /// Whether the client's calls may ask for a 2025-11-25 task.
    pub(crate) fn handshake_tasks(&self) -> bool {
        self.handshake_tasks.load(Ordering::Relaxed)
    }

    /// The connection's peer (a handshake client's, once it initialized).
    pub(crate) fn peer(&self) -> Option<Peer<RoleServer>> {
        self.peer.get().cloned()
    }

    pub(crate) fn http_id(&self) -> Option<&str> {
        self.http_id.get().map(String::as_str)
    }

    pub(crate) fn capabilities(&self) -> Option<Arc<ClientCapabilities>> {
        self.capabilities.lock().clone()
    }

    /// A stateless client declared `capabilities` with its latest request (each request of
    /// the 2026-07-28 revision carries them).
    pub(crate) fn declare(&self, capabilities: ClientCapabilities) {
        let mut current = self.capabilities.lock();
        if current.as_deref() != Some(&capabilities) {
            *current = Some(Arc::new(capabilities));
        }
    }

    /// Whether the client can answer a form elicitation (`elicitation: {}` means form).
    pub(crate) fn supports_form_elicitation(&self) -> bool {
        self.capabilities()
            .and_then(|c| c.elicitation.clone())
            .is_some_and(|e| e.form.is_some() || e.url.is_none())
    }

    pub(crate) fn touch(&self) {
        self.last_active
            .store(self.recency.next(), Ordering::Relaxed);
    }

    pub(crate) fn last_active(&self) -> u64 {
        self.last_active.load(Ordering::Relaxed)
    }

    /// Resolves once the session ended.
    pub(crate) async fn ended(&self) {
        self.ended.cancelled().await;
    }

    pub(crate) fn is_ended(&self) -> bool {
        self.ended.is_cancelled()
    }

    /// Why the session ended, once it did.
    pub(crate) fn end_reason(&self) -> Option<CancelReason> {
        *self.end_reason.lock()
    }

    /// Marks the session ended for `reason`; whether this call ended it (the first reason
    /// counts). What else a session's end undoes — its calls, its place in the gateway — is
    /// the gateway's `end_session`, which calls this.
    pub(crate) fn mark_ended(&self, reason: CancelReason) -> bool {
        {
            let mut why = self.end_reason.lock();
            if why.is_some() {
                return false;
            }
            *why = Some(reason);
        }
        self.ended.cancel();
        let running = self.calls.lock().len();
        if self.peer.get().is_some() {
            tracing::info!(session = %self.id, reason = reason.as_str(), running,
                "MCP client session ended");
        }
        true
    }

    /// Registers a call in flight.
    pub(crate) fn add_call(&self, call_id: &str, slot: ClientCall) {
        self.calls.lock().insert(call_id.to_owned(), slot);
    }

    pub(crate) fn remove_call(&self, call_id: &str) {
        self.calls.lock().remove(call_id);
    }

    pub(crate) fn has_calls(&self) -> bool {
        !self.calls.lock().is_empty()
    }

    /// The key this session knows a call by: its turn (a stateless session's calls), else its
    /// call id (a connection's).
    pub(crate) fn call_key(&self, call_id: Option<&str>, turn_id: Option<&str>) -> Option<String> {
        let calls = self.calls.lock();
        turn_id
            .filter(|t| calls.contains_key(*t))
            .or(call_id)
            .map(str::to_owned)
    }

    /// The most recent call of this session running on `server`: (call id, its seq).
    pub(crate) fn latest_call_on(&self, server: &str) -> Option<(String, u64)> {
        self.calls
            .lock()
            .iter()
            .filter(|(_, c)| c.server.as_deref() == Some(server))
            .max_by_key(|(_, c)| c.seq)
            .map(|(id, c)| (id.clone(), c.seq))
    }

    /// Registers a request in flight. Its [`Stop`] fires when the client stops waiting for it
    /// other than by closing the session: its response stream closed (Streamable HTTP), or
    /// its `notifications/cancelled` arrived (seen by the HTTP session manager before rmcp).
    /// Dropping the guard unregisters the request.
    pub(crate) fn request_started(&self, request_id: &RequestId) -> OpenRequest<'_> {
        self.request_started_as(request_id.to_string())
    }

    /// [`request_started`](Self::request_started) under a key of the gateway's choosing: the
    /// requests of a stateless session come from many clients, whose JSON-RPC ids may meet.
    pub(crate) fn request_started_as(&self, key: String) -> OpenRequest<'_> {
        let stop = Stop::default();
        let early = {
            let mut early = self.early_stops.lock();
            early
                .iter()
                .position(|(k, _)| *k == key)
                .and_then(|i| early.remove(i))
        };
        if let Some((_, reason)) = early {
            stop.fire(reason);
        }
        self.requests.lock().insert(key.clone(), stop.clone());
        OpenRequest {
            session: self,
            key,
            stop,
        }
    }

    /// The client stopped waiting for request `key`, for `reason`: its response stream closed
    /// (`client_disconnect`) or it cancelled the request (`user`). The first reason counts.
    ///
    /// A closed stream counts only after [`STREAM_CLOSE_SETTLE`]: a client that cancels a
    /// request may close its stream just before it sends `notifications/cancelled` (rmcp's
    /// client does), and then the call was cancelled by its user, not disconnected.
    pub(crate) fn stop_request(&self, key: &str, reason: CancelReason) {
        let stop = self.requests.lock().get(key).cloned();
        match stop {
            Some(stop) if reason == CancelReason::ClientDisconnect => {
                let later = async move {
                    tokio::time::sleep(STREAM_CLOSE_SETTLE).await;
                    stop.fire(reason);
                };
                self.tasks.spawn(later);
            }
            Some(stop) => stop.fire(reason),
            None => {
                let mut early = self.early_stops.lock();
                if early.iter().any(|(k, _)| k == key) {
                    return;
                }
                if early.len() == EARLY_STOPS_KEPT {
                    early.pop_front();
                }
                early.push_back((key.to_owned(), reason));
            }
        }
    }

    /// Why the connection is going away: the server's shutdown, or else the client left.
    pub(crate) fn disconnect_reason(&self) -> CancelReason {
        if self.shutdown.is_cancelled() {
            CancelReason::Shutdown
        } else {
            CancelReason::ClientDisconnect
        }
    }

    /// Why the client stopped waiting for a request when rmcp cancelled its handler: the
    /// session's end, the server's shutdown, or else the client's own cancel.
    pub(crate) fn cancel_reason(&self) -> CancelReason {
        self.end_reason()
            .unwrap_or(if self.shutdown.is_cancelled() {
                CancelReason::Shutdown
            } else {
                CancelReason::User
            })
    }

    pub(crate) fn subscribe(&self, uri: &str) -> bool {
        self.subscriptions.lock().insert(uri.to_owned())
    }

    pub(crate) fn unsubscribe(&self, uri: &str) -> bool {
        self.subscriptions.lock().remove(uri)
    }

    pub(crate) fn is_subscribed(&self, uri: &str) -> bool {
        self.subscriptions.lock().contains(uri)
    }

    /// Sends a notification (on its own task: it must not hold up the caller).
    pub(crate) fn notify(&self, notification: ServerNotification) {
        let Some(peer) = self.peer.get().cloned() else {
            return;
        };
        let session = self.id.clone();
        self.tasks.spawn(async move {
            if let Err(e) = peer.send_notification(notification).await {
                tracing::debug!(%session, error = %e, "a notification to the client failed");
            }
        });
    }

    /// Sends a request to the client and waits for its answer, at most `timeout`, or until
    /// `cancel` fires (then the client gets `notifications/cancelled` for it). With a call
    /// named by `during_call` in flight, the request is sent from that call's handler task, so
    /// that over Streamable HTTP it travels on the call's own response stream.
    pub(crate) async fn request(
        &self,
        during_call: Option<&str>,
        request: ServerRequest,
        timeout: Option<Duration>,
        cancel: CancellationToken,
    ) -> Result<ClientResult, ErrorData> {
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move |channel| {
            Box::pin(async move {
                let _ = tx.send(channel::ask(channel, request, timeout, cancel).await);
            })
        });
        let job = match during_call.and_then(|id| self.calls.lock().get(id).map(|c| c.jobs.clone()))
        {
            Some(jobs) => match jobs.send(job) {
                Ok(()) => None,
                Err(mpsc::error::SendError(job)) => Some(job),
            },
            None => Some(job),
        };
        if let Some(job) = job {
            // Outside a call, only a connection's peer reaches the client; a stateless client
            // has none (it is reached only through its calls).
            let Some(peer) = self.peer.get().cloned() else {
                return Err(ErrorData::internal_error(
                    "the MCP client can be reached only during its calls",
                    None,
                ));
            };
            let fut = job(Arc::new(peer));
            self.tasks.spawn(fut);
        }
        rx.await.unwrap_or_else(|_| {
            Err(ErrorData::internal_error(
                "the call ended before the client answered",
                None,
            ))
        })
    }
}

/// Waits until a sweep of the sessions idle for `idle` is due: every quarter of `idle`, between
/// 100 ms and 30 s. False when `closed` fires first: the sweeping is over.
pub(crate) async fn sweep_due(idle: Duration, closed: &CancellationToken) -> bool {
    let every = (idle / 4).clamp(Duration::from_millis(100), Duration::from_secs(30));
    tokio::select! {
        _ = tokio::time::sleep(every) => true,
        _ = closed.cancelled() => false,
    }
}
