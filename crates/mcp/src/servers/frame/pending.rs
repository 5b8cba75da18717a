//! Our `tools/call` requests still waiting for their answers, by id. Two kinds:
//!
//! - sent through rmcp (a 2026-07-28 connection): the transport adds each as it goes out, and
//!   the guard parses its answer itself (an optimization only: an answer whose id is missing
//!   takes rmcp's general path, which is just as right);
//! - sent past rmcp ([`super::Direct`]): the guard hands the answer to the call that waits for
//!   it, and rmcp never hears of the request. The call's [`DirectAnswer`] removes its entry
//!   when it is dropped, and the guard closes them all when the server's output ends.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use parking_lot::Mutex;
use rmcp::model::{NumberOrString, RequestId, ServerJsonRpcMessage};
use tokio::sync::oneshot;

/// Who waits for an answer.
pub(super) enum Waiter {
    /// rmcp's service loop (the guard may parse the answer for it).
    Rmcp,
    /// A call that sent its request past rmcp.
    Direct(oneshot::Sender<ServerJsonRpcMessage>),
}

#[derive(Default)]
struct PendingState {
    waiting: HashMap<RequestId, Waiter>,
    /// The server's output ended: no answer will come.
    closed: bool,
}

/// The ids of our `tools/call` requests whose answers have not come yet.
#[derive(Default)]
pub(crate) struct PendingCalls(Mutex<PendingState>);

impl PendingCalls {
    /// More than this many unanswered calls sent through rmcp (abandoned ones never answer) and
    /// those are forgotten.
    const MAX: usize = 65_536;

    /// Notes a `tools/call` sent through rmcp.
    pub(super) fn insert(&self, id: RequestId) {
        let mut inner = self.0.lock();
        if inner.waiting.len() >= Self::MAX {
            inner.waiting.retain(|_, w| matches!(w, Waiter::Direct(_)));
        }
        inner.waiting.insert(id, Waiter::Rmcp);
    }

    /// Registers a request sent past rmcp; `None` once the server's output has ended.
    pub(super) fn expect(self: &Arc<Self>, id: RequestId) -> Option<DirectAnswer> {
        let (tx, rx) = oneshot::channel();
        let mut inner = self.0.lock();
        if inner.closed {
            return None;
        }
        inner.waiting.insert(id.clone(), Waiter::Direct(tx));
        drop(inner);
        Some(DirectAnswer {
            rx,
            calls: self.clone(),
            id,
        })
    }

    /// Takes whoever waits for `id` (a numeric id sent back as a string still names it).
    pub(super) fn take(&self, id: &RequestId) -> Option<Waiter> {
        let mut inner = self.0.lock();
        inner.waiting.remove(id).or_else(|| match id {
            NumberOrString::String(s) => s
                .parse::<i64>()
                .ok()
                .and_then(|n| inner.waiting.remove(&NumberOrString::Number(n))),
            NumberOrString::Number(_) => None,
        })
    }

    /// The server's output ended: every call still waiting learns it, and later ones at once.
    pub(super) fn close(&self) {
        let mut inner = self.0.lock();
        inner.closed = true;
        inner.waiting.clear();
    }
}

/// The answer to a request sent past rmcp, once the guard reads it; `None` when the server's
/// output ended first. Dropping it forgets the request (a late answer is then left to rmcp,
/// which drops it).
pub(crate) struct DirectAnswer {
    rx: oneshot::Receiver<ServerJsonRpcMessage>,
    calls: Arc<PendingCalls>,
    id: RequestId,
}

impl Future for DirectAnswer {
    type Output = Option<ServerJsonRpcMessage>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.rx).poll(cx).map(Result::ok)
    }
}

impl Drop for DirectAnswer {
    fn drop(&mut self) {
        let mut inner = self.calls.0.lock();
        if matches!(inner.waiting.get(&self.id), Some(Waiter::Direct(_))) {
            inner.waiting.remove(&self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_calls_stay_bounded_and_keep_direct_ones() {
        let calls = Arc::new(PendingCalls::default());
        let direct = calls.expect(NumberOrString::Number(-1)).unwrap();
        for n in 0..(PendingCalls::MAX as i64 + 10) {
            calls.insert(NumberOrString::Number(n));
        }
        assert!(calls.0.lock().waiting.len() <= PendingCalls::MAX);
        let last = NumberOrString::Number(PendingCalls::MAX as i64 + 5);
        assert!(matches!(calls.take(&last), Some(Waiter::Rmcp)));
        assert!(calls.take(&last).is_none());
        assert!(matches!(
            calls.take(&NumberOrString::String("-1".into())),
            Some(Waiter::Direct(_))
        ));
        drop(direct);
    }

    #[tokio::test]
    async fn a_dropped_answer_forgets_its_request_and_a_closed_output_ends_the_others() {
        let calls = Arc::new(PendingCalls::default());
        drop(calls.expect(NumberOrString::Number(1)).unwrap());
        assert!(calls.take(&NumberOrString::Number(1)).is_none());
        let waiting = calls.expect(NumberOrString::Number(2)).unwrap();
        calls.close();
        assert!(waiting.await.is_none());
        assert!(calls.expect(NumberOrString::Number(3)).is_none());
    }
}
