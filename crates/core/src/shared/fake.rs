//! A [`SharedState`] for tests that need no Redis: reached or not as a test sets it, answering
//! the cache's claims the way the test scripts them (lead, follow, a hit of another replica's
//! result), and recording what the engine told it. The branches a Redis outage takes are tested
//! in milliseconds. Built for core's own tests, and for others with the `fakes` feature.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use toolwarden_protocol::SessionKey;

use super::{
    AbortAnswer, AbortRequest, BreakerChange, CacheClaim, GateAnswer, GatePlace, LoopRun,
    QuotaAnswer, QuotaTake, ReplicaTurns, SharedHealth, SharedState,
};
use crate::backend::BoxFuture;

/// A result a leader put: its key, the stored bytes, how long they stay fresh.
pub type Put = ([u8; 32], Vec<u8>, Duration);

/// A fake replica's shared state.
#[derive(Debug)]
pub struct FakeShared {
    /// Whether the shared state is reached: every question is answered "unavailable" when not.
    pub up: Mutex<bool>,
    /// The live replicas a quota check reports.
    pub replicas: Mutex<u32>,
    /// Every quota take asked for, with its member.
    pub takes: Mutex<Vec<(Vec<QuotaTake>, String)>>,
    /// Every release and renewal written: (`release` | `renew`, buckets, member).
    pub writes: Mutex<Vec<(&'static str, Vec<String>, String)>>,
    /// The answers to the next cache claims, in order; once they are used up a claim leads
    /// (or, while down, finds the state unavailable).
    pub claims: Mutex<VecDeque<CacheClaim>>,
    /// Every cache claim asked for (its key).
    pub claimed: Mutex<Vec<[u8; 32]>>,
    /// Every result a leader put.
    pub puts: Mutex<Vec<Put>>,
    /// Every key a leader released without a result.
    pub released: Mutex<Vec<[u8; 32]>>,
}

impl FakeShared {
    /// A reached shared state that reports `replicas` live replicas.
    pub fn new(replicas: u32) -> Self {
        Self {
            up: Mutex::new(true),
            replicas: Mutex::new(replicas),
            takes: Mutex::default(),
            writes: Mutex::default(),
            claims: Mutex::default(),
            claimed: Mutex::default(),
            puts: Mutex::default(),
            released: Mutex::default(),
        }
    }

    /// Sets whether the shared state is reached.
    pub fn set_up(&self, up: bool) {
        *self.up.lock().unwrap_or_else(|e| e.into_inner()) = up;
    }

    /// Scripts the answers to the next cache claims.
    pub fn script_claims(&self, claims: impl IntoIterator<Item = CacheClaim>) {
        self.claims
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(claims);
    }

    fn is_up(&self) -> bool {
        *self.up.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn ready<T: Send + 'static>(value: T) -> BoxFuture<T> {
    Box::pin(std::future::ready(value))
}

impl SharedState for FakeShared {
    fn health(&self) -> SharedHealth {
        if self.is_up() {
            SharedHealth::Ok
        } else {
            SharedHealth::Degraded("the fake is down".to_owned())
        }
    }

    fn breaker_changed(&self, _tool: &str, _change: BreakerChange) {}

    fn probe_lease(&self, _tool: &str, _ttl: Duration) -> BoxFuture<bool> {
        ready(true)
    }

    fn probe_release(&self, _tool: &str) {}

    fn cache_claim(&self, key: &[u8; 32], _lock_ttl: Duration) -> BoxFuture<CacheClaim> {
        self.claimed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(*key);
        if !self.is_up() {
            return ready(CacheClaim::Unavailable);
        }
        let scripted = self
            .claims
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front();
        ready(scripted.unwrap_or(CacheClaim::Lead))
    }

    fn cache_put(&self, key: &[u8; 32], value: Vec<u8>, ttl: Duration) {
        self.puts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((*key, value, ttl));
    }

    fn cache_release(&self, key: &[u8; 32]) {
        self.released
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(*key);
    }

    fn abort_elsewhere(&self, _abort: AbortRequest) -> BoxFuture<AbortAnswer> {
        ready(AbortAnswer::NotFound)
    }

    fn replica(&self) -> &str {
        "fake"
    }

    fn turns_elsewhere(&self) -> BoxFuture<Vec<ReplicaTurns>> {
        ready(Vec::new())
    }

    fn loop_run(&self, _session: &SessionKey) -> BoxFuture<Result<Option<LoopRun>, ()>> {
        ready(if self.is_up() { Ok(None) } else { Err(()) })
    }

    fn loop_record(
        &self,
        _session: &SessionKey,
        _call: &[u8; 32],
        _result: Option<[u8; 32]>,
        _ttl: Duration,
    ) -> BoxFuture<Option<u32>> {
        ready(self.is_up().then_some(1))
    }

    fn gate_enter(
        &self,
        _session: &SessionKey,
        _place: GatePlace,
        _ttl: Duration,
    ) -> BoxFuture<GateAnswer> {
        ready(if self.is_up() {
            GateAnswer::Pass
        } else {
            GateAnswer::Unavailable
        })
    }

    fn gate_leave(&self, _session: &SessionKey, _place: GatePlace) {}

    fn quota_take(
        &self,
        takes: Vec<QuotaTake>,
        member: String,
        _lease: Duration,
    ) -> BoxFuture<Result<QuotaAnswer, ()>> {
        if !self.is_up() {
            return ready(Err(()));
        }
        let left = takes.iter().map(|_| None).collect();
        self.takes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((takes, member));
        ready(Ok(QuotaAnswer {
            refused: None,
            replicas: *self.replicas.lock().unwrap_or_else(|e| e.into_inner()),
            left,
        }))
    }

    fn quota_release(&self, buckets: Vec<String>, member: String) {
        self.writes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(("release", buckets, member));
    }

    fn quota_renew(&self, buckets: Vec<String>, member: String, _lease: Duration) {
        self.writes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(("renew", buckets, member));
    }
}
