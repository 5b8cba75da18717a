//! The ways back to a client during one of its requests, behind one trait.
//!
//! What a call sends its client — progress under the client's token, a request (an approval, a
//! server's sampling or elicitation request) and, when the gateway stops waiting for the answer,
//! its withdrawal — must travel the way the client is reading: over rmcp, through the peer of the
//! request's handler (over Streamable HTTP that is the request's own response stream); on the
//! gateway's own HTTP answer (`dispatch`), on the call's response. Each way is one [`ClientChannel`];
//! asking and withdrawing is written once, in [`ask`], for all of them. A new way to reach a
//! client is one more implementation.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use rmcp::model::{
    CancelledNotificationParam, ClientResult, ErrorCode, ProgressNotificationParam, RequestId,
    ServerRequest,
};
use rmcp::service::{Peer, PeerRequestOptions, RoleServer};
use rmcp::{ErrorData, ServiceError};
use tokio_util::sync::CancellationToken;

/// A way to reach the client of one request.
pub(crate) trait ClientChannel: Send + Sync + 'static {
    /// Sends `notifications/progress`; an error says why it could not.
    fn notify_progress(
        &self,
        param: ProgressNotificationParam,
    ) -> BoxFuture<'_, Result<(), String>>;

    /// Sends a request to the client; what comes back is its id and the wait for its answer.
    fn send_request(&self, request: ServerRequest) -> BoxFuture<'_, Result<Sent, ErrorData>>;

    /// Tells the client a request sent here is withdrawn (`notifications/cancelled`), and
    /// forgets it. Called from a destructor: it must not wait.
    fn withdraw(&self, param: CancelledNotificationParam);
}

/// A request sent to the client.
pub(crate) struct Sent {
    /// Its JSON-RPC id (for the withdrawal).
    pub(crate) id: RequestId,
    /// Resolves with the client's answer.
    pub(crate) answer: BoxFuture<'static, Result<ClientResult, ErrorData>>,
}

/// Asks the client over `channel` and waits for its answer, at most `timeout`, or until
/// `cancel` fires. Unless the answer came, the request is withdrawn — also when this future is
/// dropped (its call ended).
pub(crate) async fn ask(
    channel: Arc<dyn ClientChannel>,
    request: ServerRequest,
    timeout: Option<Duration>,
    cancel: CancellationToken,
) -> Result<ClientResult, ErrorData> {
    let sent = channel.send_request(request).await?;
    let mut withdrawal = Withdrawal {
        channel: Some(channel),
        id: sent.id,
        reason: "the request was withdrawn",
    };
    let limit = async {
        match timeout {
            Some(t) => tokio::time::sleep(t).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        answer = sent.answer => {
            withdrawal.channel = None;
            answer
        }
        _ = cancel.cancelled() => Err(ErrorData::new(
            ErrorCode::INTERNAL_ERROR,
            "the request was cancelled",
            None,
        )),
        _ = limit => {
            withdrawal.reason = "timed out";
            Err(ErrorData::internal_error("the MCP client did not answer in time", None))
        }
    }
}

/// Withdraws a request of ours when dropped, unless it was answered.
struct Withdrawal {
    channel: Option<Arc<dyn ClientChannel>>,
    id: RequestId,
    reason: &'static str,
}

impl Drop for Withdrawal {
    fn drop(&mut self) {
        if let Some(channel) = self.channel.take() {
            channel.withdraw(CancelledNotificationParam::new(
                Some(self.id.clone()),
                Some(self.reason.into()),
            ));
        }
    }
}

/// rmcp's peer of a request's handler (or of the connection, outside any request): what it
/// sends from the handler's task rides that request's response stream over Streamable HTTP.
impl ClientChannel for Peer<RoleServer> {
    fn notify_progress(
        &self,
        param: ProgressNotificationParam,
    ) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            Peer::<RoleServer>::notify_progress(self, param)
                .await
                .map_err(|e| e.to_string())
        })
    }

    fn send_request(&self, request: ServerRequest) -> BoxFuture<'_, Result<Sent, ErrorData>> {
        Box::pin(async move {
            let handle = self
                .send_request_with_option(request, PeerRequestOptions::no_options())
                .await
                .map_err(|e| {
                    ErrorData::internal_error(format!("the MCP client is gone: {e}"), None)
                })?;
            let answer = async move {
                match handle.rx.await {
                    Ok(Ok(result)) => Ok(result),
                    Ok(Err(ServiceError::McpError(e))) => Err(e),
                    Ok(Err(e)) => Err(ErrorData::internal_error(
                        format!("the MCP client did not answer: {e}"),
                        None,
                    )),
                    Err(_) => Err(ErrorData::internal_error(
                        "the MCP client connection closed",
                        None,
                    )),
                }
            };
            Ok(Sent {
                id: handle.id,
                answer: Box::pin(answer),
            })
        })
    }

    fn withdraw(&self, param: CancelledNotificationParam) {
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let peer = self.clone();
            rt.spawn(async move {
                let _ = peer.notify_cancelled(param).await;
            });
        }
    }
}
