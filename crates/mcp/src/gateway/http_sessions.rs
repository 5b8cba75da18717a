//! The Streamable HTTP sessions: rmcp's in-memory session manager, watched, so that the
//! gateway learns what rmcp does not tell handlers — when a session ends and when a request's
//! response stream closes.
//!
//! rmcp's own session manager keeps a request running when its response stream is closed (so
//! that the client may resume it), and closes idle sessions after 5 minutes *even while a call
//! runs* (it counts only messages). The gateway wants the opposite on both counts: a client
//! that closes a call's stream has gone away from that call, which is aborted
//! (`client_disconnect`); and a session is idle only when its client sent nothing for
//! [`GatewayOptions::http_session_idle`](super::options::GatewayOptions) *and* no call of it runs.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use parking_lot::Mutex;
use rmcp::model::ServerJsonRpcMessage;
use rmcp::model::{ClientJsonRpcMessage, ClientNotification};
use rmcp::transport::common::server_side_http::ServerSseMessage;
use rmcp::transport::streamable_http_server::SessionId as McpSessionId;
use rmcp::transport::streamable_http_server::SessionManager;
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use toolwarden_protocol::CancelReason;

use super::session::sweep_due;
use super::state::GatewayState;

/// Tells a connection's `initialize` which `Mcp-Session-Id` it belongs to.
#[derive(Clone, Debug)]
pub(crate) struct HttpSessionTag(pub(crate) String);

/// The session manager of [`GatewayHttpService`](super::GatewayHttpService): rmcp's in-memory
/// one, watched.
pub struct HttpSessions {
    inner: LocalSessionManager,
    gateway: Weak<GatewayState>,
    /// When each session last heard from its client.
    activity: Mutex<HashMap<McpSessionId, Instant>>,
}

impl std::fmt::Debug for HttpSessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpSessions")
            .field("sessions", &self.activity.lock().len())
            .finish()
    }
}

/// Closes sessions idle for `idle` with no call running; at shutdown, ends them all.
pub(crate) async fn sweep(
    sessions: Weak<HttpSessions>,
    idle: Duration,
    shutdown: CancellationToken,
    closed: CancellationToken,
) {
    loop {
        tokio::select! {
            due = sweep_due(idle, &closed) => if !due { return },
            _ = shutdown.cancelled() => {
                if let Some(sessions) = sessions.upgrade() {
                    sessions.end_all(CancelReason::Shutdown);
                }
                return;
            }
        }
        let Some(sessions) = sessions.upgrade() else {
            return;
        };
        let now = Instant::now();
        let stale: Vec<McpSessionId> = sessions
            .activity
            .lock()
            .iter()
            .filter(|(_, last)| now.duration_since(**last) >= idle)
            .map(|(id, _)| id.clone())
            .collect();
        for id in stale {
            let busy = sessions
                .gateway
                .upgrade()
                .and_then(|gw| gw.http_session(&id))
                .is_some_and(|s| s.has_calls());
            if busy {
                // Idle time starts again once its calls end, not from the request that
                // started them.
                sessions.touch(&id);
                continue;
            }
            tracing::info!(http_session = %id, ?idle, "closing an idle MCP session");
            let _ = sessions.close_session(&id).await;
        }
    }
}

impl HttpSessions {
    /// rmcp's in-memory session manager for `gateway`, without its own idle timeout: idle
    /// sessions are closed by [`sweep`], which knows about running calls.
    pub(crate) fn new(gateway: Weak<GatewayState>) -> Arc<Self> {
        let mut inner = LocalSessionManager::default();
        inner.session_config.keep_alive = None;
        Arc::new(Self {
            inner,
            gateway,
            activity: Mutex::default(),
        })
    }
    pub(crate) fn touch(&self, id: &str) {
        let now = Instant::now();
        let mut activity = self.activity.lock();
        // A known session's time is set in place (no id made for the lookup).
        match activity.get_mut(id) {
            Some(last) => *last = now,
            None => {
                activity.insert(id.into(), now);
            }
        }
    }

    fn end_all(&self, reason: CancelReason) {
        let ids: Vec<McpSessionId> = self.activity.lock().keys().cloned().collect();
        if let Some(gw) = self.gateway.upgrade() {
            for id in ids {
                if let Some(session) = gw.http_session(&id) {
                    gw.end_session(&session, reason);
                }
            }
        }
    }
}

impl SessionManager for HttpSessions {
    type Error = LocalSessionManagerError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(McpSessionId, Self::Transport), Self::Error> {
        let (id, transport) = self.inner.create_session().await?;
        self.touch(&id);
        Ok((id, transport))
    }

    async fn initialize_session(
        &self,
        id: &McpSessionId,
        mut message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        message.insert_extension(HttpSessionTag(id.to_string()));
        self.touch(id);
        self.inner.initialize_session(id, message).await
    }

    async fn has_session(&self, id: &McpSessionId) -> Result<bool, Self::Error> {
        self.inner.has_session(id).await
    }

    async fn close_session(&self, id: &McpSessionId) -> Result<(), Self::Error> {
        self.activity.lock().remove(id);
        // The client went away (DELETE, or idle): its calls end now, before rmcp's teardown.
        if let Some(gw) = self.gateway.upgrade()
            && let Some(session) = gw.http_session(id)
        {
            gw.end_session(&session, session.disconnect_reason());
        }
        self.inner.close_session(id).await
    }

    async fn create_stream(
        &self,
        id: &McpSessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.touch(id);
        let request = match &message {
            ClientJsonRpcMessage::Request(r) => Some(r.id.to_string()),
            _ => None,
        };
        let stream = self.inner.create_stream(id, message).await?;
        Ok(Watched {
            inner: Box::pin(stream),
            on_early_drop: request.map(|request| EarlyDrop {
                gateway: self.gateway.clone(),
                session: id.to_string(),
                request,
            }),
        })
    }

    async fn accept_message(
        &self,
        id: &McpSessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        self.touch(id);
        // A client that cancels a request may close its response stream right after; its
        // call is cancelled by the user, not disconnected: say so before the stream can close.
        if let ClientJsonRpcMessage::Notification(n) = &message
            && let ClientNotification::CancelledNotification(c) = &n.notification
            && let Some(request) = &c.params.request_id
            && let Some(session) = self.gateway.upgrade().and_then(|gw| gw.http_session(id))
        {
            session.stop_request(&request.to_string(), CancelReason::User);
        }
        self.inner.accept_message(id, message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &McpSessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.touch(id);
        self.inner.create_standalone_stream(id).await
    }

    async fn resume(
        &self,
        id: &McpSessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.touch(id);
        self.inner.resume(id, last_event_id).await
    }
}

/// What to tell the gateway when a request's response stream closes before its end.
struct EarlyDrop {
    gateway: Weak<GatewayState>,
    session: String,
    request: String,
}

type SseStream = Pin<Box<dyn Stream<Item = ServerSseMessage> + Send + Sync>>;

/// A request's response stream; dropped before it ended, the request's client went away.
struct Watched {
    inner: SseStream,
    on_early_drop: Option<EarlyDrop>,
}

impl Stream for Watched {
    type Item = ServerSseMessage;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let polled = self.inner.as_mut().poll_next(cx);
        if let Poll::Ready(None) = &polled {
            // The answer went out and the stream ended: nothing was abandoned.
            self.on_early_drop = None;
        }
        polled
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        let Some(drop) = self.on_early_drop.take() else {
            return;
        };
        let Some(gw) = drop.gateway.upgrade() else {
            return;
        };
        if let Some(session) = gw.http_session(&drop.session) {
            tracing::debug!(http_session = %drop.session, request = %drop.request,
                "the client closed a response stream before its answer");
            session.stop_request(&drop.request, CancelReason::ClientDisconnect);
        }
    }
}
