//! A call's place: its slot in its turn (where it writes its one result) and the part of its
//! turn it sees ([`CallTurn`]: the turn's id, session and start, where progress and completions
//! go). A call writes into these two and nothing else of the turn's.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio::time::Instant;
use toolwarden_protocol::{CallId, CallResult, CallState, ProgressInfo, TurnId};

use crate::backend::ProgressRelay;
use crate::cancel::CancelScope;
use crate::session::Session;
use crate::trace::TurnContext;

/// Receives every progress report of every call of a turn as it happens.
pub type CallProgress = Arc<dyn Fn(&CallId, &ProgressInfo) + Send + Sync>;

/// A call that completed: its index in the turn and its result.
pub(crate) type Completion = (usize, Arc<CallResult>);

/// One call's live state, as `GET /v1/turns/active` shows it.
pub(crate) struct SlotView {
    pub(crate) state: CallState,
    pub(crate) started: Option<Instant>,
    pub(crate) attempt: u32,
    pub(crate) progress: Option<ProgressInfo>,
    pub(crate) status: Option<&'static str>,
}

/// One call's place in its turn.
pub(crate) struct CallSlot {
    pub(crate) index: usize,
    pub(crate) call_id: CallId,
    pub(crate) tool: Arc<str>,
    pub(crate) scope: CancelScope,
    pub(crate) view: Mutex<SlotView>,
    /// The call's result, once it has one, and when it ended.
    pub(crate) result: Mutex<Option<(Arc<CallResult>, Instant)>>,
}

impl CallSlot {
    /// A queued call's slot.
    pub(crate) fn new(index: usize, call_id: CallId, tool: Arc<str>, scope: CancelScope) -> Self {
        Self {
            index,
            call_id,
            tool,
            scope,
            view: Mutex::new(SlotView {
                state: CallState::Queued,
                started: None,
                attempt: 0,
                progress: None,
                status: None,
            }),
            result: Mutex::new(None),
        }
    }

    pub(crate) fn set_state(&self, state: CallState) {
        self.view.lock().state = state;
    }
}

/// What the calls of a turn see of it.
pub(crate) struct CallTurn {
    pub(crate) id: TurnId,
    pub(crate) session: Arc<Session>,
    /// When the turn's calls arrived (its start).
    pub(crate) started: Instant,
    /// Live progress of the calls, if the turn has a listener.
    pub(crate) progress: Option<CallProgress>,
    /// The turn's trace context, if spans are exported or the client gave one.
    pub(crate) trace: Option<TurnContext>,
    /// The scopes of the turn's principal (what `[[rules]]` see as `scopes`).
    pub(crate) scopes: toolwarden_protocol::Scopes,
    stream: Mutex<Option<mpsc::UnboundedSender<Completion>>>,
    /// Whether `stream` was ever set: a turn nobody streams never locks it.
    streaming: AtomicBool,
}

impl CallTurn {
    pub(crate) fn new(
        id: TurnId,
        session: Arc<Session>,
        started: Instant,
        progress: Option<CallProgress>,
        trace: Option<TurnContext>,
    ) -> Self {
        Self {
            id,
            session,
            started,
            progress,
            trace,
            scopes: toolwarden_protocol::Scopes::all(),
            stream: Mutex::new(None),
            streaming: AtomicBool::new(false),
        }
    }

    /// The progress relay of one call, if the turn has a listener.
    pub(crate) fn relay_for(&self, call_id: &CallId) -> Option<ProgressRelay> {
        let progress = self.progress.clone()?;
        let call_id = call_id.clone();
        Some(Arc::new(move |info: &ProgressInfo| {
            progress(&call_id, info)
        }))
    }

    /// A call's result (the call ended at `end`): kept in its slot and streamed.
    pub(crate) fn complete(&self, slot: &CallSlot, result: Arc<CallResult>, end: Instant) {
        if self.streaming.load(Ordering::Acquire)
            && let Some(tx) = &*self.stream.lock()
        {
            let _ = tx.send((slot.index, result.clone()));
        }
        *slot.result.lock() = Some((result, end));
    }

    /// Streams the calls' completions from now on (set before the turn starts).
    pub(crate) fn stream_completions(&self) -> mpsc::UnboundedReceiver<Completion> {
        let (tx, rx) = mpsc::unbounded_channel();
        *self.stream.lock() = Some(tx);
        self.streaming.store(true, Ordering::Release);
        rx
    }

    /// Ends the completion stream (the turn is over).
    pub(crate) fn close_stream(&self) {
        if self.streaming.load(Ordering::Acquire) {
            *self.stream.lock() = None;
        }
    }
}
