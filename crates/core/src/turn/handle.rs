//! A turn running on its own task: its completions as they happen, its ordered results at the
//! end, and an abort when the handle is dropped unless it was detached.

use std::sync::{Arc, Weak};

use tokio::sync::{mpsc, oneshot};
use toolwarden_protocol::{CallResult, CancelReason, SessionId, TurnId};

use crate::call::Completion;

use super::request::{FinishedTurn, TurnOutput};
use super::runtime::TurnRuntime;

/// A turn running on its own task.
pub struct TurnHandle {
    turn_id: TurnId,
    session_id: SessionId,
    completions: mpsc::UnboundedReceiver<Completion>,
    done: Option<oneshot::Receiver<FinishedTurn>>,
    abort_on_drop: Option<Weak<TurnRuntime>>,
}

impl std::fmt::Debug for TurnHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TurnHandle")
            .field("turn_id", &self.turn_id)
            .finish_non_exhaustive()
    }
}

impl TurnHandle {
    pub(crate) fn new(
        turn_id: TurnId,
        session_id: SessionId,
        completions: mpsc::UnboundedReceiver<Completion>,
        done: oneshot::Receiver<FinishedTurn>,
        rt: Weak<TurnRuntime>,
    ) -> Self {
        Self {
            turn_id,
            session_id,
            completions,
            done: Some(done),
            abort_on_drop: Some(rt),
        }
    }

    /// The turn's id.
    pub fn turn_id(&self) -> &TurnId {
        &self.turn_id
    }

    /// The turn's session.
    pub fn session_id(&self) -> &SessionId {
        &self.session_id
    }

    /// The next call to complete, with its index; `None` when every call has completed.
    pub async fn next_completed(&mut self) -> Option<(usize, Arc<CallResult>)> {
        self.completions.recv().await
    }

    /// Waits for the turn to end: one result per call, in call order.
    pub async fn finish(mut self) -> TurnOutput {
        let (results, rendered) = match self.done.take() {
            Some(rx) => rx.await.unwrap_or_default(),
            None => (Vec::new(), None),
        };
        self.abort_on_drop = None;
        TurnOutput {
            turn_id: self.turn_id.clone(),
            session_id: self.session_id.clone(),
            results,
            rendered,
        }
    }

    /// Lets the turn run on when this handle is dropped (by default, dropping the handle aborts
    /// the turn as a client disconnect).
    pub fn detach(mut self) {
        self.abort_on_drop = None;
    }
}

impl Drop for TurnHandle {
    fn drop(&mut self) {
        if let Some(rt) = self.abort_on_drop.take().and_then(|w| w.upgrade()) {
            let _ = rt.abort_turn(&self.turn_id, CancelReason::ClientDisconnect);
        }
    }
}
