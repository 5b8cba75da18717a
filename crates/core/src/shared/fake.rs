//! A [`SharedState`] for tests that need no Redis: reached or not as a test sets it, answering
//! every question the way the test says (a cache claim to lead, follow or miss), and recording
//! what the engine told it. The branches a Redis outage takes are tested in milliseconds.

use std::sync::Mutex;
use std::time::Duration;

use toolwarden_protocol::SessionKey;

use super::{
    AbortAnswer, AbortRequest, BreakerChange, CacheClaim, GateAnswer, GatePlace, LoopRun,
    QuotaAnswer, QuotaTake, ReplicaTurns, SharedHealth, SharedState,
};
use crate::backend::BoxFuture;

/// A fake replica's shared state.
#[derive(Debug)]
pub(crate) struct FakeShared {
    /// Whether the shared state is reached: every question is answered "unavailable" when not.
    pub(crate) up: Mutex<bool>,
    /// The live replicas a quota check reports.
    pub(crate) replicas: Mutex<u32>,
    /// Every quota take asked for, with its member.
    pub(crate) takes: Mutex<Vec<(Vec<QuotaTake>, String)>>,
    /// Every release and renewal written: (`release` | `renew`, buckets, member).
    pub(crate) writes: Mutex<Vec<(&'static str, Vec<String>, String)>>,
}

impl FakeShared {
    pub(crate) fn new(replicas: u32) -> Self {
        Self {
            up: Mutex::new(true),
            replicas: Mutex::new(replicas),
            takes: Mutex::default(),
            writes: Mutex::default(),
        }
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

    fn cache_claim(&self, _key: &[u8; 32], _lock_ttl: Duration) -> BoxFuture<CacheClaim> {
        ready(if self.is_up() {
            CacheClaim::Lead
        } else {
            CacheClaim::Unavailable
        })
    }

    fn cache_put(&self, _key: &[u8; 32], _value: Vec<u8>, _ttl: Duration) {}

    fn cache_release(&self, _key: &[u8; 32]) {}

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
