//! The engine's side of scale-out (docs/SCALE-OUT.md): what the shared state tells this replica
//! (another replica's breaker change, an abort, an event) and what front doors ask of all
//! replicas (an abort wherever the turn runs, the shared state's health).

use tokio::sync::broadcast;
use tokio::time::Instant;
use toolwarden_protocol::{CallId, CancelReason, SessionKey, TurnId};

use std::sync::Arc;

use crate::shared::{
    AbortAnswer, AbortRequest, BreakerChange, RemoteEvent, ReplicaTurns, SharedHealth, TaskAnswer,
    TaskRequest,
};
use crate::turn::{AbortError, NotFound};

use super::Engine;

impl Engine {
    /// Whether state is shared with other replicas and reached: `None` without shared state.
    pub fn shared_health(&self) -> Option<SharedHealth> {
        self.inner.turns.env.shared.as_ref().map(|s| s.health())
    }

    /// Takes in another replica's breaker change for `tool`. The gauge follows; the `breaker_state` event is the other
    /// replica's, seen through [`Engine::remote_events`].
    pub fn apply_shared_breaker(&self, tool: &str, change: BreakerChange) {
        let runtime = self.inner.registry.runtime_of(tool);
        if let Some(state) = runtime.breaker.apply_shared(change, Instant::now()) {
            runtime.metrics.breaker(state);
        }
    }

    /// Registers how the front door that holds tasks answers requests about them
    /// (`tasks/update`, `tasks/get`) — asked here by [`Engine::answer_task_here`] for other
    /// replicas.
    pub fn set_task_answerer(&self, answerer: Arc<crate::shared::TaskAnswerer>) {
        *self.inner.task_answerer.write() = Some(answerer);
    }

    /// Answers a task this replica holds (`NotFound` when it holds none of that id and
    /// principal, or nothing holds tasks here).
    pub fn answer_task_here(&self, request: &TaskRequest) -> TaskAnswer {
        let answerer = self.inner.task_answerer.read().clone();
        answerer.map_or(TaskAnswer::NotFound, |answer| answer(request))
    }

    /// Hands a request about a task to the replica that holds it, through the shared state
    /// (without one, `NotFound`).
    pub async fn answer_task_elsewhere(&self, request: TaskRequest) -> TaskAnswer {
        match &self.inner.turns.env.shared {
            Some(shared) => shared.task_elsewhere(request).await,
            None => TaskAnswer::NotFound,
        }
    }

    /// Carries out an abort here: `Done` when this replica runs the turn (and the call) and it
    /// may be aborted by the asker.
    pub fn abort_here(&self, abort: &AbortRequest) -> AbortAnswer {
        if let Some(only) = &abort.only_of {
            match self.inner.turns.turn_principal(&abort.turn_id) {
                None => return AbortAnswer::NotFound,
                Some(owner) if owner != *only => return AbortAnswer::NotYours,
                Some(_) => {}
            }
        }
        let done = match &abort.call_id {
            None => self.abort_turn(&abort.turn_id, abort.reason).is_ok(),
            Some(call) => self.abort_call(&abort.turn_id, call, abort.reason).is_ok(),
        };
        if done {
            AbortAnswer::Done
        } else {
            AbortAnswer::NotFound
        }
    }

    /// Aborts a turn (or one of its calls) wherever it runs: here if this replica runs it, else
    /// on the replica that does, asked through the shared state. With `only_of`, only a turn of
    /// that principal is aborted (`NotYours` for another's).
    pub async fn abort_anywhere(
        &self,
        turn_id: &TurnId,
        call_id: Option<&CallId>,
        reason: CancelReason,
        only_of: Option<&str>,
    ) -> Result<(), AbortError> {
        let abort = AbortRequest {
            turn_id: turn_id.clone(),
            call_id: call_id.cloned(),
            reason,
            only_of: only_of.map(Arc::from),
        };
        let answer = match self.abort_here(&abort) {
            AbortAnswer::NotFound => match self.inner.turns.env.shared.clone() {
                Some(shared) => shared.abort_elsewhere(abort).await,
                None => AbortAnswer::NotFound,
            },
            here => here,
        };
        match answer {
            AbortAnswer::Done => Ok(()),
            AbortAnswer::NotYours => Err(AbortError::NotYours(turn_id.clone())),
            AbortAnswer::NotFound => Err(AbortError::NotFound(NotFound(match call_id {
                None => format!("turn {turn_id}"),
                Some(call) => format!("call {call} of turn {turn_id}"),
            }))),
        }
    }

    /// Hands the front doors' event streams an event of another replica. Never blocks.
    pub fn push_remote_event(&self, event: RemoteEvent) {
        let _ = self.inner.remote_events.send(event);
    }

    /// Whether anyone follows other replicas' events now: when nobody does, an event that
    /// arrives is seen by nobody, so the shared state need not even read it.
    pub fn remote_events_followed(&self) -> bool {
        self.inner.remote_events.receiver_count() > 0
    }

    /// Other replicas' events, as they arrive (a subscriber that falls behind loses the oldest).
    pub fn remote_events(&self) -> broadcast::Receiver<RemoteEvent> {
        self.inner.remote_events.subscribe()
    }

    /// A call of `session` left its place in the session's gate on another replica: this
    /// replica's calls waiting for that gate ask again.
    pub fn gate_released_elsewhere(&self, session: &SessionKey) {
        if let Some(s) = self.inner.turns.known_session(session) {
            s.gate.released_elsewhere.notify_waiters();
        }
    }

    /// This replica's name among the replicas; `None` without shared state.
    pub fn replica(&self) -> Option<String> {
        self.inner
            .turns
            .env
            .shared
            .as_ref()
            .map(|s| s.replica().to_owned())
    }

    /// The running turns of every replica: this one's first, then those of every other replica
    /// that answers (only this one's without shared state, or while it cannot be reached).
    pub async fn turns_everywhere(&self) -> Vec<ReplicaTurns> {
        let here = ReplicaTurns {
            replica: self.replica().unwrap_or_default(),
            turns: self.active_turns(),
        };
        let mut all = vec![here];
        if let Some(shared) = self.inner.turns.env.shared.clone() {
            let mut others = shared.turns_elsewhere().await;
            others.sort_by(|a, b| a.replica.cmp(&b.replica));
            all.extend(others);
        }
        all
    }
}
