//! Frees what the engine lets go of in bulk — the replay ring's oldest events, the cache's oldest
//! results — on a background thread, so that a call does not pay for freeing memory that a call
//! thousands of calls earlier allocated (long out of the CPU's caches).
//!
//! Evicted items are gathered in batches by their owner (under the lock it already holds) and a
//! full batch is queued here. Queuing never blocks and rarely wakes the thread: waking a thread
//! is a system call, dearer than the frees it saves, so the thread is woken only once
//! [`WAKE_AT`] batches wait (and looks on its own every [`IDLE_LOOK`] for fewer). What waits is
//! memory the engine cannot reuse yet, so it is kept small rather than gathered for long. If the
//! thread cannot be started, batches are freed where they are.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::Thread;
use std::time::Duration;

use parking_lot::Mutex;

/// How many evicted items a batch gathers before it is handed over.
pub(crate) const BATCH: usize = 64;

/// How many batches wait before the thread is woken: 512 items, a wake-up every hundred or so
/// calls at full load.
const WAKE_AT: usize = 8;

/// How often a parked thread looks for batches fewer than [`WAKE_AT`] (left when the engine
/// went quiet).
const IDLE_LOOK: Duration = Duration::from_millis(100);

type Batch = Box<dyn Send>;

struct Reaper {
    queue: Mutex<Vec<Batch>>,
    /// Set by the thread before it parks; whoever queues the [`WAKE_AT`]th batch then wakes it.
    parked: AtomicBool,
    thread: Thread,
}

static REAPER: OnceLock<Option<&'static Reaper>> = OnceLock::new();

fn reaper() -> Option<&'static Reaper> {
    *REAPER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<&'static Reaper>(1);
        let handle = std::thread::Builder::new()
            .name("toolwarden-reaper".into())
            .spawn(move || {
                if let Ok(reaper) = rx.recv() {
                    run(reaper);
                }
            })
            .ok()?;
        let reaper: &'static Reaper = Box::leak(Box::new(Reaper {
            queue: Mutex::new(Vec::with_capacity(WAKE_AT * 2)),
            parked: AtomicBool::new(false),
            thread: handle.thread().clone(),
        }));
        tx.send(reaper).ok()?;
        Some(reaper)
    })
}

fn run(reaper: &'static Reaper) {
    loop {
        let batches = std::mem::take(&mut *reaper.queue.lock());
        if !batches.is_empty() {
            drop(batches);
            continue;
        }
        reaper.parked.store(true, Ordering::SeqCst);
        // Batches queued between the drain and `parked` found the flag unset and woke nobody:
        // look once more before parking.
        if reaper.queue.lock().len() < WAKE_AT {
            std::thread::park_timeout(IDLE_LOOK);
        }
        reaper.parked.store(false, Ordering::SeqCst);
    }
}

/// The batch `evicted` has gathered, once it is full (empty before): the caller hands it to
/// [`bury`] after letting go of its lock.
pub(crate) fn full_batch<T>(evicted: &mut Vec<T>) -> Vec<T> {
    if evicted.len() >= BATCH {
        std::mem::replace(evicted, Vec::with_capacity(BATCH))
    } else {
        Vec::new()
    }
}

/// Frees `batch` on the reaper thread.
pub(crate) fn bury<T: Send + 'static>(batch: Vec<T>) {
    if batch.is_empty() {
        return;
    }
    match reaper() {
        Some(reaper) => {
            let waiting = {
                let mut queue = reaper.queue.lock();
                queue.push(Box::new(batch));
                queue.len()
            };
            if waiting >= WAKE_AT && reaper.parked.swap(false, Ordering::SeqCst) {
                reaper.thread.unpark();
            }
        }
        None => drop(batch),
    }
}
#[cfg(test)]
mod tests {
    use std::sync::mpsc::{Sender, channel};
    use std::time::Duration;

    struct Tells(Sender<std::thread::ThreadId>);

    impl Drop for Tells {
        fn drop(&mut self) {
            let _ = self.0.send(std::thread::current().id());
        }
    }

    #[test]
    fn buried_items_are_freed_on_another_thread() {
        let (tx, rx) = channel();
        super::bury(vec![Tells(tx.clone()), Tells(tx)]);
        for _ in 0..2 {
            let freed_on = rx.recv_timeout(Duration::from_secs(10)).expect("freed");
            assert_ne!(freed_on, std::thread::current().id());
        }
    }
}
