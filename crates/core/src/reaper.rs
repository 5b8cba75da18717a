//! Frees what the engine lets go of in bulk — the replay ring's oldest events, the cache's oldest
//! results — on a background thread, so that a call does not pay for freeing memory that a call
//! thousands of calls earlier allocated (long out of the CPU's caches).
//!
//! Evicted items are gathered in batches by their owner (under the lock it already holds) and a
//! full batch is handed over here; sending never blocks. If the thread cannot be started, batches
//! are freed where they are.

use std::sync::OnceLock;
use std::sync::mpsc::{Sender, channel};

/// How many evicted items a batch gathers before it is handed over.
pub(crate) const BATCH: usize = 64;

type Batch = Box<dyn Send>;

static REAPER: OnceLock<Option<Sender<Batch>>> = OnceLock::new();

/// Frees `batch` on the reaper thread.
pub(crate) fn bury<T: Send + 'static>(batch: Vec<T>) {
    if batch.is_empty() {
        return;
    }
    let reaper = REAPER.get_or_init(|| {
        let (tx, rx) = channel::<Batch>();
        std::thread::Builder::new()
            .name("toolwarden-reaper".into())
            .spawn(move || {
                for batch in rx {
                    drop(batch);
                }
            })
            .ok()
            .map(|_| tx)
    });
    match reaper {
        Some(tx) => {
            // A send fails only if the thread is gone; the batch then comes back and is freed
            // here.
            let _ = tx.send(Box::new(batch));
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
