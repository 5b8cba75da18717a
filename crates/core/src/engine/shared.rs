//! The engine's side of scale-out (docs/SCALE-OUT.md): what the shared state tells this replica
//! (another replica's breaker change, an abort, an event) and what front doors ask of all
//! replicas (an abort wherever the turn runs, the shared state's health).

use tokio::sync::broadcast;
use tokio::time::Instant;
use toolwarden_protocol::{CallId, CancelReason, SessionId, TurnId};

use crate::shared::{AbortRequest, BreakerChange, RemoteEvent, ReplicaTurns, SharedHealth};
use crate::turn::NotFound;

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

    /// Carries out an abort here; `true` when this replica runs the turn (and the call).
    pub fn abort_here(&self, abort: &AbortRequest) -> bool {
        match &abort.call_id {
            None => self.abort_turn(&abort.turn_id, abort.reason).is_ok(),
            Some(call) => self.abort_call(&abort.turn_id, call, abort.reason).is_ok(),
        }
    }

    /// Aborts a turn (or one of its calls) wherever it runs: here if this replica runs it, else
    /// on the replica that does, asked through the shared state. `NotFound` when no replica runs
    /// it.
    pub async fn abort_anywhere(
        &self,
        turn_id: &TurnId,
        call_id: Option<&CallId>,
        reason: CancelReason,
    ) -> Result<(), NotFound> {
        let local = match call_id {
            None => self.abort_turn(turn_id, reason),
            Some(call) => self.abort_call(turn_id, call, reason),
        };
        let Err(not_found) = local else {
            return Ok(());
        };
        let Some(shared) = self.inner.turns.env.shared.clone() else {
            return Err(not_found);
        };
        let abort = AbortRequest {
            turn_id: turn_id.clone(),
            call_id: call_id.cloned(),
            reason,
        };
        if shared.abort_elsewhere(abort).await {
            Ok(())
        } else {
            Err(not_found)
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
    pub fn gate_released_elsewhere(&self, session: &SessionId) {
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
