//! Frees what the engine lets go of in bulk — the replay ring's oldest events, the cache's oldest
//! results — on a background thread, so that a call does not pay for freeing memory that a call
//! thousands of calls earlier allocated (long out of the CPU's caches).
//!
//! Evicted items are gathered in batches by their owner (under the lock it already holds) and a
//! full batch is queued here. Queuing never blocks and, while the engine is busy, never wakes the
//! thread either: waking a thread is a system call, dearer than the frees it saves. The thread
//! drains the queue, sleeps [`PAUSE`], and drains again; only when it finds the queue empty does it
//! park, and the next batch wakes it. If the thread cannot be started, batches are freed where
//! they are.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::Thread;
use std::time::Duration;

use parking_lot::Mutex;

/// How many evicted items a batch gathers before it is handed over.
pub(crate) const BATCH: usize = 64;

/// How long the thread rests between drains while batches keep coming. What is queued meanwhile
/// is bounded by the engine's rate: at 250,000 calls/s and five evictions each, 100 batches.
const PAUSE: Duration = Duration::from_millis(5);

type Batch = Box<dyn Send>;

struct Reaper {
    queue: Mutex<Vec<Batch>>,
    /// Set by the thread before it parks; whoever queues a batch then wakes it.
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
            queue: Mutex::new(Vec::new()),
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
        if batches.is_empty() {
            reaper.parked.store(true, Ordering::SeqCst);
            // A batch queued between the drain and `parked` would find the flag unset and not
            // wake the thread: look once more before parking.
            if reaper.queue.lock().is_empty() {
                std::thread::park();
            }
            reaper.parked.store(false, Ordering::SeqCst);
            continue;
        }
        drop(batches);
        #[allow(
            clippy::disallowed_methods,
            reason = "the reaper's own thread rests between drains; no timing rule depends on it"
        )]
        std::thread::sleep(PAUSE);
    }
}

/// Frees `batch` on the reaper thread.
pub(crate) fn bury<T: Send + 'static>(batch: Vec<T>) {
    if batch.is_empty() {
        return;
    }
    match reaper() {
        Some(reaper) => {
            reaper.queue.lock().push(Box::new(batch));
            if reaper.parked.swap(false, Ordering::SeqCst) {
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
