//! Single flight: identical calls of a cacheable tool share one execution. A fresh stored
//! result is served; otherwise a call leads the execution of its key, or follows an identical
//! running call and shares its result — looking again if that one ends without a result to share.
//!
//! With state shared between replicas, a call that would lead here first looks across replicas
//! (one round trip): a result another replica stored is served, a call another replica runs is
//! waited for by polling its key, and only a call nobody runs is led — and its result shared.

use std::time::Duration;

use tokio::time::Instant;
use toolwarden_protocol::CallState;

use crate::cache::{self, CachedResult, Lookup};
use crate::maps::CallDigest;
use crate::shared::{CacheClaim, SharedState};

use super::finish::Finisher;

/// The duty of the call that runs a cacheable call: hand its result to the calls waiting here and,
/// when it leads across replicas too, to the other replicas. Dropped without a result, it frees
/// both.
pub(super) struct Leader<'a> {
    local: cache::FlightGuard,
    shared: Option<SharedLead<'a>>,
}

impl Leader<'_> {
    /// The execution ended `ok`: store the result for `ttl` here and across replicas.
    pub(super) fn complete(mut self, result: CachedResult, ttl: Duration, now: Instant) {
        if let Some(lead) = self.shared.take() {
            lead.shared.cache_put(&lead.key.0, result.encode(), ttl);
            std::mem::forget(lead);
        }
        self.local.complete(result, ttl, now);
    }
}

/// The right to run a call across replicas; dropped, it frees the key.
struct SharedLead<'a> {
    shared: &'a dyn SharedState,
    key: CallDigest,
}

impl Drop for SharedLead<'_> {
    fn drop(&mut self) {
        self.shared.cache_release(&self.key.0);
    }
}

/// The first and the longest pause between two looks at a key another replica runs.
const POLL_FIRST: Duration = Duration::from_millis(5);
const POLL_MAX: Duration = Duration::from_millis(100);

/// Serves a stored result, or returns the guard of the execution this call leads, or waits for
/// an identical running call. `None` when the call ended here (served from the cache, or
/// cancelled while waiting). `now` moves on with any wait. `lock_ttl` bounds how long another
/// replica may hold the key of a call it runs.
pub(super) async fn lead_or_follow<'a>(
    fin: &mut Finisher<'a>,
    key: &CallDigest,
    now: &mut Instant,
    lock_ttl: Duration,
) -> Option<Leader<'a>> {
    loop {
        match fin.env.cache.lookup(key, *now) {
            Lookup::Hit(hit) => {
                Box::pin(fin.serve_hit(&hit)).await;
                return None;
            }
            Lookup::Lead(guard) => {
                let Some(shared) = fin.env.shared.as_deref() else {
                    return Some(Leader {
                        local: guard,
                        shared: None,
                    });
                };
                return Box::pin(lead_across(fin, shared, key, guard, now, lock_ttl)).await;
            }
            Lookup::Follow(f) => {
                let slot = fin.slot;
                slot.set_state(CallState::Waiting);
                let shared = Box::pin(async {
                    tokio::select! {
                        biased;
                        () = slot.scope.cancelled() => None,
                        shared = cache::follow(f) => Some(shared),
                    }
                })
                .await;
                match shared {
                    None => {
                        fin.cancelled();
                        return None;
                    }
                    Some(Some(hit)) => {
                        Box::pin(fin.serve_hit(&hit)).await;
                        return None;
                    }
                    Some(None) => {}
                }
                *now = Instant::now();
            }
        }
    }
}

/// This replica would lead: look across replicas first.
async fn lead_across<'a>(
    fin: &mut Finisher<'a>,
    shared: &'a dyn SharedState,
    key: &CallDigest,
    guard: cache::FlightGuard,
    now: &mut Instant,
    lock_ttl: Duration,
) -> Option<Leader<'a>> {
    let mut pause = POLL_FIRST;
    loop {
        match shared.cache_claim(&key.0, lock_ttl).await {
            CacheClaim::Hit { value, ttl } => {
                *now = Instant::now();
                let Some(hit) = CachedResult::decode(&value) else {
                    // Not a result this version can read: run the call here, sharing nothing.
                    return Some(Leader {
                        local: guard,
                        shared: None,
                    });
                };
                guard.complete(hit.clone(), ttl, *now);
                Box::pin(fin.serve_hit(&hit)).await;
                return None;
            }
            CacheClaim::Lead => {
                return Some(Leader {
                    local: guard,
                    shared: Some(SharedLead { shared, key: *key }),
                });
            }
            CacheClaim::Unavailable => {
                return Some(Leader {
                    local: guard,
                    shared: None,
                });
            }
            CacheClaim::Follow => {
                let slot = fin.slot;
                slot.set_state(CallState::Waiting);
                let waited = tokio::select! {
                    biased;
                    () = slot.scope.cancelled() => false,
                    () = tokio::time::sleep(pause) => true,
                };
                if !waited {
                    fin.cancelled();
                    return None;
                }
                pause = (pause * 2).min(POLL_MAX);
            }
        }
    }
}
