//! The events of a stateless client's call ([`FlowEvent`]: progress, questions, its end), from
//! the call to whichever request drives it (`super::rounds`) or to its task (`super::task_board`).
//!
//! An unbounded queue with one receiver, as tokio's `mpsc::unbounded_channel` is, but made
//! with one small allocation and none more until the first event. Most calls send none (a
//! quick call's end is read from the call itself, `rounds::first_round`), while tokio's channel
//! allocates a block of slots up front: about a thousand instructions a stateless call paid and
//! a handshake call did not. The receiver
//! learns that every sender is gone (`None`, `Disconnected`); sending after the receiver is
//! dropped fails; events still queued when the receiver is dropped are dropped with it (a
//! question's answer channel so closes, as with tokio's channel).

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;
use rmcp::ErrorData;
use rmcp::model::{CallToolResult, ClientResult, InputRequest, ProgressNotificationParam};
use std::task::{Poll, Waker};
pub(crate) use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::oneshot;

/// Where the client's answer to a question goes.
pub(crate) type Answer = oneshot::Sender<Result<ClientResult, ErrorData>>;

/// What a call tells the request driving it.
pub(crate) enum FlowEvent {
    Progress(ProgressNotificationParam),
    Ask {
        key: String,
        request: InputRequest,
        answer: Answer,
    },
    Withdraw(String),
    Done(Result<CallToolResult, ErrorData>),
}

/// A sender and the receiver of a new queue.
pub(crate) fn channel() -> (EventSender, EventReceiver) {
    let shared = Arc::new(Mutex::new(State {
        queue: VecDeque::new(),
        senders: 1,
        receiving: true,
        waiting: None,
    }));
    (EventSender(shared.clone()), EventReceiver(shared))
}

struct State {
    queue: VecDeque<FlowEvent>,
    senders: usize,
    /// The receiver is there.
    receiving: bool,
    /// The receiver waiting: woken by an event, or by the last sender going.
    waiting: Option<Waker>,
}

impl State {
    /// The next event if one is in; `Disconnected` when none is and every sender is gone.
    fn next(&mut self) -> Result<FlowEvent, TryRecvError> {
        match self.queue.pop_front() {
            Some(event) => Ok(event),
            None if self.senders == 0 => Err(TryRecvError::Disconnected),
            None => Err(TryRecvError::Empty),
        }
    }
}

/// Wakes the receiver if it waits, once the lock is let go.
fn wake(mut state: parking_lot::MutexGuard<'_, State>) {
    let waiting = state.waiting.take();
    drop(state);
    if let Some(waker) = waiting {
        waker.wake();
    }
}

/// The receiver of a call's events is gone: nobody follows the call any more.
#[derive(Debug)]
pub(crate) struct ReceiverGone;

/// Sends a call's events.
pub(crate) struct EventSender(Arc<Mutex<State>>);

impl EventSender {
    /// Queues `event`; an error (and the event dropped) when the receiver is gone.
    pub(crate) fn send(&self, event: FlowEvent) -> Result<(), ReceiverGone> {
        let mut state = self.0.lock();
        if !state.receiving {
            return Err(ReceiverGone);
        }
        state.queue.push_back(event);
        wake(state);
        Ok(())
    }
}

impl Clone for EventSender {
    fn clone(&self) -> Self {
        self.0.lock().senders += 1;
        Self(self.0.clone())
    }
}

impl Drop for EventSender {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.senders -= 1;
        if state.senders == 0 {
            wake(state);
        }
    }
}

/// Receives a call's events.
pub(crate) struct EventReceiver(Arc<Mutex<State>>);

impl EventReceiver {
    /// The next event if one is in; `Disconnected` when none is and every sender is gone.
    pub(crate) fn try_recv(&mut self) -> Result<FlowEvent, TryRecvError> {
        self.0.lock().next()
    }

    /// The next event; `None` once every sender is gone and the queue is empty. Cancel-safe:
    /// an event is taken from the queue only when this returns it.
    pub(crate) async fn recv(&mut self) -> Option<FlowEvent> {
        std::future::poll_fn(|cx| {
            let mut state = self.0.lock();
            match state.next() {
                Ok(event) => return Poll::Ready(Some(event)),
                Err(TryRecvError::Disconnected) => return Poll::Ready(None),
                Err(TryRecvError::Empty) => {}
            }
            // Looked at and registered under one lock: a send cannot slip in between.
            match &mut state.waiting {
                Some(waker) => waker.clone_from(cx.waker()),
                none => *none = Some(cx.waker().clone()),
            }
            Poll::Pending
        })
        .await
    }
}

impl Drop for EventReceiver {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.receiving = false;
        let left = std::mem::take(&mut state.queue);
        drop(state);
        drop(left);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn withdraw(key: &str) -> FlowEvent {
        FlowEvent::Withdraw(key.to_owned())
    }

    fn key(event: FlowEvent) -> String {
        match event {
            FlowEvent::Withdraw(key) => key,
            _ => panic!("another event"),
        }
    }

    #[tokio::test]
    async fn events_arrive_in_order_and_the_end_of_the_senders_is_seen() {
        let (tx, mut rx) = channel();
        assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
        let other = tx.clone();
        tx.send(withdraw("a")).unwrap();
        other.send(withdraw("b")).unwrap();
        assert_eq!(key(rx.recv().await.unwrap()), "a");
        drop(tx);
        assert_eq!(key(rx.try_recv().unwrap()), "b");
        let waiting = tokio::spawn(async move {
            let event = rx.recv().await.map(key);
            (event, rx.recv().await.is_none())
        });
        tokio::task::yield_now().await;
        other.send(withdraw("c")).unwrap();
        drop(other);
        assert_eq!(waiting.await.unwrap(), (Some("c".to_owned()), true));
    }

    #[tokio::test]
    #[expect(
        deprecated,
        reason = "roots are deprecated (SEP-2577); any question will do here"
    )]
    async fn a_dropped_receiver_gives_events_back_and_drops_what_it_held() {
        let (tx, rx) = channel();
        let (answer, asked) = tokio::sync::oneshot::channel();
        let request =
            rmcp::model::InputRequest::ListRoots(rmcp::model::ListRootsRequest::default());
        tx.send(FlowEvent::Ask {
            key: "q".to_owned(),
            request,
            answer,
        })
        .ok()
        .unwrap();
        drop(rx);
        // The question's answer channel closed with the receiver.
        assert!(asked.await.is_err());
        assert!(tx.send(withdraw("late")).is_err());
    }
}
