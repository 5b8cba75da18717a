//! A server's progress, delivered in the order the server sent it — before the call's answer.
//!
//! rmcp hands each incoming notification to the handler on a task of its own, while an answer
//! goes straight to the waiting request. A server that reports its last step and answers at
//! once could then see its answer reach the call first, and the report — now late for a
//! finished call — dropped: the client never saw the last step.
//!
//! [`InOrder`] wraps the connection's transport and routes a progress report for a call in
//! flight to that call's heartbeat as it reads it, before it reads the next message: everything
//! the server sent before its answer has reached the call when rmcp sees the answer. A report
//! whose token is not in the call table yet (its call is being registered right now) goes on to
//! rmcp and the handler, which waits for the registration (`router`).
//!
//! On a stdio connection the frame guard already does this as it reads each line (`frame`):
//! there an answer may go to its call past rmcp, so the report cannot wait for rmcp to read it.
//!
//! It also keeps a slow server's first start from failing. rmcp's lifecycle probes with
//! `server/discover` and, without an answer within 10 s, falls back to `initialize` on the same
//! connection. A server that is merely slow to start (`npx -y` downloading its package, a JVM, a
//! cold container) then reads both requests at once and answers the probe first — an error, from
//! a handshake-only server — and rmcp, waiting for the answer to `initialize`, takes that late
//! answer for a broken one and fails the start ("uncorrelated error response"). Once the
//! lifecycle has fallen back, the probe's late answer, whatever it says, is dropped here.

use std::sync::Arc;

use rmcp::model::{
    ClientJsonRpcMessage, ClientRequest, JsonRpcMessage, RequestId, ServerJsonRpcMessage,
    ServerNotification,
};
use rmcp::service::{RoleClient, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;

use super::router::Router;

/// `T`, with the connection's progress delivered as it is read, and a lifecycle probe's late
/// answer dropped.
pub(crate) struct InOrder<T> {
    inner: T,
    router: Arc<Router>,
    probe: Probe,
}

/// The `server/discover` probe of the connection's lifecycle, while its answer may still come.
#[derive(Debug, Default, PartialEq)]
enum Probe {
    /// No probe was sent, or its answer came in time.
    #[default]
    None,
    /// Sent; its answer is awaited.
    Sent(RequestId),
    /// Sent, and the lifecycle gave up on it (`initialize` went out): its answer is dropped.
    Abandoned(RequestId),
}

impl<T> InOrder<T> {
    pub(crate) fn new(inner: T, router: Arc<Router>) -> Self {
        Self {
            inner,
            router,
            probe: Probe::None,
        }
    }
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for InOrder<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.probe.sending(&item);
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        loop {
            let message = self.inner.receive().await?;
            if !self.probe.receiving(&message) {
                continue;
            }
            if let Some(kept) = self.deliver(message) {
                return Some(kept);
            }
        }
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

impl Probe {
    /// Notes a `server/discover` going out, and an `initialize` after it (the fallback).
    fn sending(&mut self, item: &ClientJsonRpcMessage) {
        let JsonRpcMessage::Request(request) = item else {
            return;
        };
        match (&request.request, std::mem::take(self)) {
            (ClientRequest::DiscoverRequest(_), _) => *self = Probe::Sent(request.id.clone()),
            (ClientRequest::InitializeRequest(_), Probe::Sent(id)) => *self = Probe::Abandoned(id),
            (_, probe) => *self = probe,
        }
    }

    /// Whether `message` goes on: not when it answers an abandoned probe.
    fn receiving(&mut self, message: &ServerJsonRpcMessage) -> bool {
        let answers = match message {
            JsonRpcMessage::Response(r) => Some(&r.id),
            JsonRpcMessage::Error(e) => e.id.as_ref(),
            _ => None,
        };
        match (&*self, answers) {
            (Probe::Sent(id), Some(answer)) if id == answer => {
                *self = Probe::None;
                true
            }
            (Probe::Abandoned(id), Some(answer)) if id == answer => {
                tracing::debug!(%id, "dropping the late answer to server/discover: the lifecycle fell back to initialize");
                *self = Probe::None;
                false
            }
            _ => true,
        }
    }
}

impl<T> InOrder<T> {
    /// Delivers a progress report for a registered call; gives back every other message.
    fn deliver(&self, message: ServerJsonRpcMessage) -> Option<ServerJsonRpcMessage> {
        if let JsonRpcMessage::Notification(n) = &message
            && let ServerNotification::ProgressNotification(p) = &n.notification
            && self.router.progress_now(&p.params)
        {
            return None;
        }
        Some(message)
    }
}

#[cfg(test)]
mod tests {
    use rmcp::model::{
        CallToolResult, JsonRpcNotification, JsonRpcResponse, JsonRpcVersion2_0, Notification,
        NumberOrString, ProgressNotificationParam, ProgressToken, RequestId, ServerResult,
    };
    use std::sync::Mutex;
    use toolwarden_core::Heartbeat;
    use toolwarden_protocol::ProgressInfo;

    use super::*;

    fn progress(token: i64, step: f64) -> ServerJsonRpcMessage {
        let param =
            ProgressNotificationParam::new(ProgressToken(NumberOrString::Number(token)), step);
        JsonRpcMessage::Notification(JsonRpcNotification {
            jsonrpc: JsonRpcVersion2_0,
            notification: ServerNotification::ProgressNotification(Notification::new(param)),
        })
    }

    fn answer(id: i64) -> ServerJsonRpcMessage {
        JsonRpcMessage::Response(JsonRpcResponse {
            jsonrpc: JsonRpcVersion2_0,
            id: RequestId::Number(id),
            result: ServerResult::CallToolResult(CallToolResult::success(vec![])),
        })
    }

    /// What the handler would get: the messages `deliver` gives back.
    #[test]
    fn a_registered_calls_progress_reaches_its_heartbeat_before_the_answer_is_passed_on() {
        let router = Router::new("test".into());
        let seen: Arc<Mutex<Vec<f64>>> = Arc::default();
        let relay = {
            let seen = seen.clone();
            Arc::new(move |info: &ProgressInfo| seen.lock().unwrap().push(info.progress.unwrap()))
        };
        let reg = router.register(
            RequestId::Number(7),
            ProgressToken(NumberOrString::Number(70)),
            Heartbeat::new(Some(relay)),
        );
        let wrapper = InOrder::new((), router.clone());

        for step in 1..=5 {
            assert!(wrapper.deliver(progress(70, step as f64)).is_none());
        }
        // The report of another (unknown) token goes on to rmcp, as does the answer.
        assert!(wrapper.deliver(progress(71, 1.0)).is_some());
        assert!(wrapper.deliver(answer(7)).is_some());
        assert_eq!(*seen.lock().unwrap(), vec![1.0, 2.0, 3.0, 4.0, 5.0]);

        drop(reg);
        assert!(
            wrapper.deliver(progress(70, 6.0)).is_some(),
            "a finished call's token is unknown"
        );
    }

    fn request(id: i64, request: ClientRequest) -> ClientJsonRpcMessage {
        JsonRpcMessage::Request(rmcp::model::JsonRpcRequest {
            jsonrpc: JsonRpcVersion2_0,
            id: RequestId::Number(id),
            request,
        })
    }

    fn discover() -> ClientRequest {
        ClientRequest::DiscoverRequest(rmcp::model::DiscoverRequest::default())
    }

    fn initialize() -> ClientRequest {
        ClientRequest::InitializeRequest(rmcp::model::InitializeRequest::new(
            rmcp::model::InitializeRequestParams::default(),
        ))
    }

    fn refusal(id: i64) -> ServerJsonRpcMessage {
        JsonRpcMessage::Error(rmcp::model::JsonRpcError {
            jsonrpc: JsonRpcVersion2_0,
            id: Some(RequestId::Number(id)),
            error: rmcp::ErrorData::method_not_found::<rmcp::model::DiscoverRequestMethod>(),
        })
    }

    #[test]
    fn a_probe_answered_in_time_goes_on_and_a_late_one_is_dropped() {
        // In time: the refusal reaches rmcp (which then falls back itself).
        let mut probe = Probe::default();
        probe.sending(&request(0, discover()));
        assert!(probe.receiving(&refusal(0)));
        probe.sending(&request(1, initialize()));
        assert!(probe.receiving(&answer(1)));
        assert_eq!(probe, Probe::None);

        // Late: rmcp gave up on it and sent `initialize`; the probe's answer, refusal or
        // result, is dropped once, and the answer to `initialize` goes on.
        for late in [refusal(0), answer(0)] {
            let mut probe = Probe::default();
            probe.sending(&request(0, discover()));
            probe.sending(&request(1, initialize()));
            assert!(!probe.receiving(&late));
            assert!(probe.receiving(&answer(1)));
            assert!(probe.receiving(&answer(0)), "dropped once only");
        }
    }
}
