//! Sessions: a conversation's calls share a cancellation scope, a readers–writer gate, a loop
//! detector, and a memory of how its calls ended (for `toolwarden__status`).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;
use tokio::time::Instant;
use toolwarden_protocol::{Outcome, RecentCall, SessionKey, Status, Timestamp};

use crate::cancel::CancelScope;
use crate::gate::Gate;
use crate::loop_detect::LoopDetector;

/// How many failed calls a session remembers.
const RECENT_FAILURES: usize = 20;

#[derive(Default)]
pub(crate) struct History {
    pub(crate) counts: BTreeMap<&'static str, u64>,
    pub(crate) timed_out: BTreeMap<String, u64>,
    pub(crate) recent_failures: VecDeque<RecentCall>,
}

pub(crate) struct Session {
    /// Whose session, and its id.
    pub(crate) key: SessionKey,
    pub(crate) scope: CancelScope,
    pub(crate) gate: Arc<Gate>,
    pub(crate) loops: LoopDetector,
    pub(crate) history: Mutex<History>,
    pub(crate) active_turns: AtomicUsize,
    pub(crate) last_used: Mutex<Instant>,
    /// Made for one turn that named no session: forgotten when its turn ends.
    pub(crate) ephemeral: std::sync::atomic::AtomicBool,
}

impl Session {
    pub(crate) fn new(key: SessionKey, scope: CancelScope) -> Self {
        Self {
            key,
            scope,
            gate: Arc::new(Gate::default()),
            loops: LoopDetector::default(),
            history: Mutex::new(History::default()),
            active_turns: AtomicUsize::new(0),
            last_used: Mutex::new(Instant::now()),
            ephemeral: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Remembers how a call ended (failures in detail, successes as a count).
    pub(crate) fn record(&self, outcome: &Outcome) {
        let mut h = self.history.lock();
        *h.counts.entry(outcome.status.name()).or_insert(0) += 1;
        if !outcome.status.is_error() {
            return;
        }
        if let Status::Timeout { .. } = outcome.status {
            *h.timed_out.entry(outcome.tool.to_string()).or_insert(0) += 1;
        }
        if h.recent_failures.len() == RECENT_FAILURES {
            h.recent_failures.pop_front();
        }
        h.recent_failures.push_back(RecentCall {
            call_id: outcome.call_id.clone(),
            turn_id: outcome.turn_id.clone(),
            tool: outcome.tool.to_string(),
            status: outcome.status.clone(),
            at: Timestamp::now(),
        });
    }

    pub(crate) fn turn_started(&self) {
        self.active_turns.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn turn_ended(&self, now: Instant) {
        self.active_turns.fetch_sub(1, Ordering::Relaxed);
        *self.last_used.lock() = now;
    }

    pub(crate) fn is_idle_since(&self, cutoff: Instant) -> bool {
        self.active_turns.load(Ordering::Relaxed) == 0 && *self.last_used.lock() < cutoff
    }
}
