//! A named session's state across replicas (docs/SCALE-OUT.md): the loop detector's run and the
//! readers–writer gate, asked of the shared state so that a session whose calls reach several
//! replicas is governed as on one. Each falls back to the session's local state when the shared
//! state cannot be reached; no call fails because of it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use toolwarden_protocol::{CallState, LoopPolicy, SessionKey};

use crate::loop_detect::run_blocks;
use crate::maps::CallDigest;
use crate::session::Session;
use crate::shared::{GateAnswer, GatePlace, SharedState};

use super::slot::CallSlot;

/// Whether the session's run denies `call` (`Some(count)`): the shared run when it can be read,
/// else this replica's.
pub(super) async fn loop_blocks(
    shared: &dyn SharedState,
    session: &Session,
    policy: &LoopPolicy,
    call: &CallDigest,
) -> Option<u32> {
    if policy.block_after == 0 {
        return None;
    }
    match shared.loop_run(&session.key).await {
        Ok(run) => run.and_then(|r| run_blocks(policy, &r.call, r.count, call)),
        Err(()) => session.loops.blocks(policy, call),
    }
}

/// A call's place in its session's gate across replicas; dropped, it leaves it.
pub(super) struct GateHold<'a> {
    shared: &'a dyn SharedState,
    session: &'a SessionKey,
    place: GatePlace,
}

impl Drop for GateHold<'_> {
    fn drop(&mut self) {
        self.shared.gate_leave(self.session, self.place);
    }
}

/// The first and the longest pause between two asks while a call waits for the gate (a call
/// leaving its place on another replica wakes the waiters at once; the pauses only bound a lost
/// wake-up).
const ASK_FIRST: Duration = Duration::from_millis(5);
const ASK_MAX: Duration = Duration::from_millis(100);

/// Places are unique within the process.
static NEXT_PLACE: AtomicU64 = AtomicU64::new(1);

/// Waits until the call may pass its session's gate across replicas. `Some(hold)` while it holds
/// its place (`None` inside: the shared state could not be reached, the local gate decided);
/// `None` when the call was cancelled while it waited.
pub(super) async fn pass_gate<'a>(
    shared: &'a dyn SharedState,
    session: &'a Session,
    exclusive: bool,
    ttl: Duration,
    slot: &CallSlot,
) -> Option<Option<GateHold<'a>>> {
    let place = GatePlace {
        id: NEXT_PLACE.fetch_add(1, Ordering::Relaxed),
        exclusive,
    };
    let hold = GateHold {
        shared,
        session: &session.key,
        place,
    };
    let mut pause = ASK_FIRST;
    let mut placed = false;
    loop {
        let woken = session.gate.released_elsewhere.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        match shared.gate_enter(&session.key, place, ttl).await {
            GateAnswer::Pass => return Some(Some(hold)),
            GateAnswer::Unavailable => {
                // The local gate already let the call through. A place taken by an earlier ask
                // is left (the shared state writes it when it is back); one the failed ask may
                // have taken is the shared state's own to leave.
                if !placed {
                    std::mem::forget(hold);
                }
                return Some(None);
            }
            GateAnswer::Wait => {
                placed = true;
                slot.set_state(CallState::Waiting);
            }
        }
        tokio::select! {
            biased;
            () = slot.scope.cancelled() => return None,
            () = &mut woken => {}
            () = tokio::time::sleep(pause) => pause = (pause * 2).min(ASK_MAX),
        }
    }
}
