//! The per-session readers–writer gate (docs/GOVERNANCE.md, "Concurrency within a session").
//!
//! Parallel calls share the gate; an exclusive call owns it. Order is fixed when a turn starts:
//! each call reserves a [`Ticket`] in call order, so an exclusive call waits for every call of its
//! session reserved before it to end, and holds back every call reserved after it. A ticket is
//! released when dropped — a call that ends early (denied, served from the cache) never blocks
//! anyone.

use std::collections::BTreeSet;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

#[derive(Default)]
struct GateState {
    next: u64,
    alive: BTreeSet<u64>,
    exclusive: BTreeSet<u64>,
}

/// One session's gate.
#[derive(Default)]
pub(crate) struct Gate {
    state: Mutex<GateState>,
    released: Notify,
    /// Woken when a call of this session left its place on another replica (docs/SCALE-OUT.md):
    /// calls waiting for the gate across replicas ask again.
    pub(crate) released_elsewhere: Notify,
}

impl Gate {
    /// Reserves the next place in line.
    pub(crate) fn reserve(self: &Arc<Self>, exclusive: bool) -> Ticket {
        let mut s = self.state.lock();
        let id = s.next;
        s.next += 1;
        s.alive.insert(id);
        if exclusive {
            s.exclusive.insert(id);
        }
        Ticket {
            gate: self.clone(),
            id,
            exclusive,
        }
    }

    fn may_run(&self, id: u64, exclusive: bool) -> bool {
        let s = self.state.lock();
        if exclusive {
            s.alive.first() == Some(&id)
        } else {
            s.exclusive.first().is_none_or(|first| *first > id)
        }
    }

    fn release(&self, id: u64) {
        let mut s = self.state.lock();
        s.alive.remove(&id);
        let was_exclusive = s.exclusive.remove(&id);
        let someone_waits = !s.exclusive.is_empty() || was_exclusive;
        drop(s);
        if someone_waits {
            self.released.notify_waiters();
        }
    }
}

/// A place in a session's line. Dropping it leaves the line.
pub(crate) struct Ticket {
    gate: Arc<Gate>,
    id: u64,
    exclusive: bool,
}

impl Ticket {
    /// Waits until this call may run.
    pub(crate) async fn acquire(&self) {
        loop {
            let notified = self.gate.released.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.gate.may_run(self.id, self.exclusive) {
                return;
            }
            notified.await;
        }
    }

    /// Whether this call owns the gate (an exclusive call) or shares it.
    pub(crate) fn exclusive(&self) -> bool {
        self.exclusive
    }

    /// Whether this call could run right now.
    pub(crate) fn ready(&self) -> bool {
        self.gate.may_run(self.id, self.exclusive)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.gate.release(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parallel_calls_share_the_gate() {
        let gate = Arc::new(Gate::default());
        let a = gate.reserve(false);
        let b = gate.reserve(false);
        assert!(a.ready() && b.ready());
    }

    #[test]
    fn an_exclusive_call_waits_for_earlier_calls_and_holds_back_later_ones() {
        let gate = Arc::new(Gate::default());
        let before = gate.reserve(false);
        let excl = gate.reserve(true);
        let after = gate.reserve(false);
        assert!(before.ready());
        assert!(!excl.ready(), "waits for the earlier call");
        assert!(!after.ready(), "held back by the exclusive call");
        drop(before);
        assert!(excl.ready());
        assert!(!after.ready());
        drop(excl);
        assert!(after.ready());
    }

    #[tokio::test]
    async fn acquire_wakes_when_the_line_moves() {
        let gate = Arc::new(Gate::default());
        let excl = gate.reserve(true);
        let after = gate.reserve(false);
        let waiter = tokio::spawn(async move {
            after.acquire().await;
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(excl);
        waiter.await.unwrap();
    }
}
