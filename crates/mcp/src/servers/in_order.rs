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
//! rmcp and the handler, which waits for the registration (`call_table`).
//!
//! On a stdio connection the frame guard already does this as it reads each line (`frame`):
//! there an answer may go to its call past rmcp, so the report cannot wait for rmcp to read it.

use std::sync::Arc;

use rmcp::model::{JsonRpcMessage, ServerJsonRpcMessage, ServerNotification};
use rmcp::service::{RoleClient, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;

use super::call_table::CallTable;

/// `T`, with the connection's progress delivered as it is read.
pub(crate) struct InOrder<T> {
    inner: T,
    calls: Arc<CallTable>,
}

impl<T> InOrder<T> {
    pub(crate) fn new(inner: T, calls: Arc<CallTable>) -> Self {
        Self { inner, calls }
    }
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for InOrder<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        loop {
            let message = self.inner.receive().await?;
            if let Some(kept) = self.deliver(message) {
                return Some(kept);
            }
        }
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

impl<T> InOrder<T> {
    /// Delivers a progress report for a registered call; gives back every other message.
    fn deliver(&self, message: ServerJsonRpcMessage) -> Option<ServerJsonRpcMessage> {
        if let JsonRpcMessage::Notification(n) = &message
            && let ServerNotification::ProgressNotification(p) = &n.notification
            && self.calls.progress_now(&p.params)
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
        let calls = CallTable::new("test".into());
        let seen: Arc<Mutex<Vec<f64>>> = Arc::default();
        let relay = {
            let seen = seen.clone();
            Arc::new(move |info: &ProgressInfo| seen.lock().unwrap().push(info.progress.unwrap()))
        };
        let reg = calls.register(
            RequestId::Number(7),
            ProgressToken(NumberOrString::Number(70)),
            Heartbeat::new(Some(relay)),
        );
        let wrapper = InOrder::new((), calls.clone());

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
}
