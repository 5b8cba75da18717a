//! Single flight: identical calls of a cacheable tool share one execution. A fresh stored
//! result is served; otherwise a call leads the execution of its key, or follows an identical
//! running call and shares its result — looking again if that one ends without a result to share.

use tokio::time::Instant;
use toolwarden_protocol::CallState;

use crate::cache::{self, Lookup};
use crate::maps::CallDigest;

use super::finish::Finisher;

/// Serves a stored result, or returns the guard of the execution this call leads, or waits for
/// an identical running call. `None` when the call ended here (served from the cache, or
/// cancelled while waiting). `now` moves on with any wait.
pub(super) async fn lead_or_follow(
    fin: &mut Finisher<'_>,
    key: &CallDigest,
    now: &mut Instant,
) -> Option<cache::FlightGuard> {
    loop {
        match fin.env.cache.lookup(key, *now) {
            Lookup::Hit(hit) => {
                fin.cache_hit(&hit);
                return None;
            }
            Lookup::Lead(guard) => return Some(guard),
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
                        fin.cache_hit(&hit);
                        return None;
                    }
                    Some(None) => {}
                }
                *now = Instant::now();
            }
        }
    }
}
