//! What running turns share: the environment their calls borrow, the turns running now, and the
//! sessions they belong to (created on a turn's first use, forgotten when idle for an hour).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;
use toolwarden_protocol::{
    ActiveTurn, BreakerInfo, CallId, CallState, CancelReason, EventKind, RunningCall, SessionKey,
    SessionStatus, TurnId,
};

use crate::call::CallEnv;
use crate::cancel::{CancelScope, ScopeKind};
use crate::maps::FastMap;
use crate::metrics::Metrics;
use crate::session::Session;

use super::state::TurnState;

/// Sessions idle this long (no running turn) are forgotten.
const SESSION_IDLE_EVICT: Duration = Duration::from_secs(3600);
/// Sessions are swept when there are more than this many.
const SESSION_SWEEP_AT: usize = 1024;

/// A turn, call or interaction that is not running (finished, or never existed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0} is not running (finished or unknown)")]
pub struct NotFound(pub String);

/// Why an abort was not carried out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AbortError {
    /// No replica runs it.
    #[error(transparent)]
    NotFound(#[from] NotFound),
    /// It runs, but is another principal's, and the asker may abort only its own.
    #[error("turn {0} is another principal's")]
    NotYours(TurnId),
}

/// The running turns and their sessions, and what their calls borrow.
pub(crate) struct TurnRuntime {
    pub(crate) env: CallEnv,
    pub(crate) metrics: Arc<Metrics>,
    /// The root of the cancellation tree (shutdown cancels it).
    pub(crate) root: CancelScope,
    sessions: Mutex<FastMap<SessionKey, Arc<Session>>>,
    turns: Mutex<FastMap<TurnId, Arc<TurnState>>>,
}

impl TurnRuntime {
    pub(crate) fn new(env: CallEnv, metrics: Arc<Metrics>) -> Self {
        Self {
            env,
            metrics,
            root: CancelScope::root(),
            sessions: Mutex::new(FastMap::default()),
            turns: Mutex::new(FastMap::default()),
        }
    }

    /// The session `key`, made now if it is new.
    pub(crate) fn session(&self, key: SessionKey) -> Arc<Session> {
        let mut sessions = self.sessions.lock();
        if let Some(s) = sessions.get(&key) {
            return s.clone();
        }
        if sessions.len() >= SESSION_SWEEP_AT {
            let cutoff = Instant::now().checked_sub(SESSION_IDLE_EVICT);
            if let Some(cutoff) = cutoff {
                sessions.retain(|_, s| !s.is_idle_since(cutoff));
            }
        }
        let s = Arc::new(Session::new(
            key.clone(),
            self.root.child(ScopeKind::Session),
        ));
        sessions.insert(key, s.clone());
        s
    }

    /// The session `key` if this replica knows it.
    pub(crate) fn known_session(&self, key: &SessionKey) -> Option<Arc<Session>> {
        self.sessions.lock().get(key).cloned()
    }

    /// A running turn.
    pub(crate) fn turn(&self, id: &TurnId) -> Option<Arc<TurnState>> {
        self.turns.lock().get(id).cloned()
    }

    /// Who made a running turn.
    pub(crate) fn turn_principal(&self, id: &TurnId) -> Option<Arc<str>> {
        self.turns
            .lock()
            .get(id)
            .map(|t| t.base.session.key.principal.clone())
    }

    /// Registers a turn (it can be aborted from now on); `false` if its id is running already.
    pub(crate) fn register(&self, turn: &Arc<TurnState>) -> bool {
        let mut turns = self.turns.lock();
        if turns.contains_key(turn.id()) {
            return false;
        }
        turns.insert(turn.id().clone(), turn.clone());
        true
    }

    /// The turn ended at `now`: forgets it, and its session if the session was the turn's own.
    pub(crate) fn unregister(&self, turn: &TurnState, now: Instant) {
        if self.turns.lock().remove(turn.id()).is_some() {
            let session = &turn.base.session;
            session.turn_ended(now);
            if session.ephemeral.load(Ordering::Relaxed)
                && session.active_turns.load(Ordering::Relaxed) == 0
            {
                self.sessions.lock().remove(&session.key);
            }
        }
    }

    /// Aborts a running turn (and, through the tree, its calls and child turns).
    pub(crate) fn abort_turn(
        &self,
        turn_id: &TurnId,
        reason: CancelReason,
    ) -> Result<(), NotFound> {
        let turn = self
            .turn(turn_id)
            .ok_or_else(|| NotFound(format!("turn {turn_id}")))?;
        if turn.scope.cancel(reason) {
            self.env
                .bus
                .emit(turn.event_scope(), EventKind::TurnAbort { reason });
        }
        Ok(())
    }

    /// Aborts one call of a running turn; the turn goes on.
    pub(crate) fn abort_call(
        &self,
        turn_id: &TurnId,
        call_id: &CallId,
        reason: CancelReason,
    ) -> Result<(), NotFound> {
        let turn = self
            .turn(turn_id)
            .ok_or_else(|| NotFound(format!("turn {turn_id}")))?;
        let slot = turn
            .slots
            .iter()
            .find(|s| &s.call_id == call_id)
            .ok_or_else(|| NotFound(format!("call {call_id} of turn {turn_id}")))?;
        if slot.view.lock().state == CallState::Done {
            return Err(NotFound(format!("call {call_id} of turn {turn_id}")));
        }
        slot.scope.cancel(reason);
        Ok(())
    }

    /// Cancels every running call of a session and forgets it.
    pub(crate) fn end_session(&self, key: &SessionKey, reason: CancelReason) {
        if let Some(session) = self.sessions.lock().remove(key) {
            session.scope.cancel(reason);
        }
    }

    /// Running turns, oldest first.
    pub(crate) fn active(&self) -> Vec<ActiveTurn> {
        let turns: Vec<Arc<TurnState>> = self.turns.lock().values().cloned().collect();
        let mut v: Vec<ActiveTurn> = turns.iter().map(|t| t.view()).collect();
        v.sort_by(|a, b| {
            a.started_at
                .cmp(&b.started_at)
                .then_with(|| a.turn_id.cmp(&b.turn_id))
        });
        v
    }

    /// How a session's calls are doing; `None` for an unknown session.
    pub(crate) fn session_status(
        &self,
        key: &SessionKey,
        open_breakers: Vec<BreakerInfo>,
    ) -> Option<SessionStatus> {
        let session = self.sessions.lock().get(key).cloned()?;
        let running = self
            .active()
            .into_iter()
            .filter(|t| t.session_id == key.id && *t.principal == *key.principal)
            .flat_map(|t| {
                let turn_id = t.turn_id.clone();
                t.calls
                    .into_iter()
                    .filter(|c| c.state != CallState::Done)
                    .map(move |call| RunningCall {
                        turn_id: turn_id.clone(),
                        call,
                    })
            })
            .collect();
        let h = session.history.lock();
        Some(SessionStatus {
            session_id: key.id.clone(),
            running,
            counts: h
                .counts
                .iter()
                .map(|(k, v)| ((*k).to_owned(), *v))
                .collect(),
            timed_out_tools: h.timed_out.clone(),
            recent_failures: h.recent_failures.iter().cloned().collect(),
            open_breakers,
            servers_not_up: Default::default(),
        })
    }
}
