//! A trail that cannot write (its database restarts, its disk is full), with `before_execution`:
//! a call waits for it at most `store.wait` and runs if it comes back meanwhile; past that it
//! ends `error{store}` without running. Nothing runs unrecorded. A fake store, paused time.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use common::*;
use pretty_assertions::assert_eq;
use serde_json::json;
use tokio::time::Instant;
use toolwarden_core::protocol::{
    AuditPage, AuditQuery, CallsPage, Event, StoreDurability, TaskRecord, TurnId, TurnRecord,
};
use toolwarden_core::{
    AuditStore, BoxFuture, StoreCommits, StoreHealth, StoreReadError, StoreUnavailable,
};

/// A trail that commits every event appended while it is up, and none while it is down.
#[derive(Default)]
struct FlakyTrail {
    down: AtomicBool,
    /// Neither commits nor fails: a database that hangs.
    hung: AtomicBool,
    appended: AtomicU64,
    committed: AtomicU64,
}

impl FlakyTrail {
    fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
        if !down {
            self.committed
                .store(self.appended.load(Ordering::SeqCst), Ordering::SeqCst);
        }
    }
}

impl AuditStore for FlakyTrail {
    fn durability(&self) -> StoreDurability {
        StoreDurability::BeforeExecution
    }
    fn last_seq(&self) -> u64 {
        0
    }
    fn append(&self, event: &Arc<Event>) {
        self.appended.fetch_max(event.seq, Ordering::SeqCst);
        if !self.down.load(Ordering::SeqCst) {
            self.committed.fetch_max(event.seq, Ordering::SeqCst);
        }
    }
    fn is_durable(&self, seq: u64) -> bool {
        self.committed.load(Ordering::SeqCst) >= seq
    }
    fn durable(&self, seq: u64) -> BoxFuture<Result<(), StoreUnavailable>> {
        if self.hung.load(Ordering::SeqCst) {
            return Box::pin(std::future::pending());
        }
        let done = if self.is_durable(seq) {
            Ok(())
        } else {
            Err(StoreUnavailable("disk full".to_owned()))
        };
        Box::pin(std::future::ready(done))
    }
    fn readable(&self, _seq: Option<u64>) -> BoxFuture<Result<(), StoreUnavailable>> {
        Box::pin(std::future::ready(Ok(())))
    }
    fn has_room(&self) -> bool {
        true
    }
    fn room(&self) -> BoxFuture<()> {
        Box::pin(std::future::ready(()))
    }
    fn queue_depth(&self) -> usize {
        0
    }
    fn commits(&self) -> StoreCommits {
        StoreCommits::default()
    }
    fn health(&self) -> StoreHealth {
        if self.down.load(Ordering::SeqCst) {
            StoreHealth::Degraded("disk full".to_owned())
        } else {
            StoreHealth::Ok
        }
    }
    fn events(&self, _query: AuditQuery) -> BoxFuture<Result<AuditPage, StoreReadError>> {
        Box::pin(std::future::ready(Err(StoreReadError("no reads".into()))))
    }
    fn calls(&self, _query: AuditQuery) -> BoxFuture<Result<CallsPage, StoreReadError>> {
        Box::pin(std::future::ready(Err(StoreReadError("no reads".into()))))
    }
    fn turn(&self, _turn_id: TurnId) -> BoxFuture<Result<Option<TurnRecord>, StoreReadError>> {
        Box::pin(std::future::ready(Ok(None)))
    }
    fn put_task(&self, _task: TaskRecord) -> BoxFuture<Result<(), StoreUnavailable>> {
        Box::pin(std::future::ready(Ok(())))
    }
    fn task(&self, _task_id: String) -> BoxFuture<Result<Option<TaskRecord>, StoreReadError>> {
        Box::pin(std::future::ready(Ok(None)))
    }
    fn close(&self) -> BoxFuture<()> {
        Box::pin(std::future::ready(()))
    }
}

fn harness(trail: &Arc<FlakyTrail>, wait: u64) -> Harness {
    let store: Arc<dyn AuditStore> = trail.clone();
    Harness::with("", move |b| b.store(store).store_wait(secs(wait)))
}

#[tokio::test(start_paused = true)]
async fn a_call_waits_for_a_trail_that_comes_back_within_the_wait_and_runs() {
    let trail = Arc::new(FlakyTrail::default());
    let mut h = harness(&trail, 5);
    trail.set_down(true);
    let back = trail.clone();
    tokio::spawn(async move {
        tokio::time::sleep(secs(2)).await;
        back.set_down(false);
    });
    let start = Instant::now();
    let r = h.call("c1", "echo", json!({"q": "hi"})).await;
    assert_eq!(outcome(&r)["status"], "ok", "{r:?}");
    assert_eq!(h.log.runs("echo"), 1);
    let waited = start.elapsed();
    assert!(waited >= secs(2) && waited < secs(3), "{waited:?}");
}

#[tokio::test(start_paused = true)]
async fn a_call_ends_error_store_without_running_once_the_wait_is_over() {
    let trail = Arc::new(FlakyTrail::default());
    let mut h = harness(&trail, 5);
    trail.set_down(true);
    let start = Instant::now();
    let r = h.call("c1", "echo", json!({"q": "hi"})).await;
    assert_eq!(start.elapsed(), secs(5));
    check(
        &r,
        json!({"status": "error", "reason": "store", "attempts": 0, "call_id": "c1",
               "tool": "echo", "duration_ms": 5000,
               "detail": "the audit trail cannot be written: disk full (waited 5s for it); the call was not started, so that nothing runs unrecorded"}),
        "[ERROR] Tool \"echo\" was not started: its call could not be recorded in the audit trail. Reason: the audit trail cannot be written: disk full (waited 5s for it); the call was not started, so that nothing runs unrecorded. It did not run; try again once the trail is back.",
    );
    assert_eq!(h.log.runs("echo"), 0, "it ran unrecorded");
    // A wait of zero ends the call at once.
    let mut h = harness(&trail, 0);
    let start = Instant::now();
    let r = h.call("c2", "echo", json!({"q": "hi"})).await;
    assert_eq!(start.elapsed(), secs(0));
    assert_eq!(outcome(&r)["reason"], "store");
    assert_eq!(h.log.runs("echo"), 0);
}

#[tokio::test(start_paused = true)]
async fn a_call_whose_start_a_hung_trail_never_commits_ends_once_the_wait_is_over() {
    let trail = Arc::new(FlakyTrail::default());
    let mut h = harness(&trail, 3);
    trail.set_down(true);
    trail.hung.store(true, Ordering::SeqCst);
    let start = Instant::now();
    let r = h.call("c1", "echo", json!({"q": "hi"})).await;
    assert_eq!(start.elapsed(), secs(3));
    assert_eq!(outcome(&r)["reason"], "store");
    assert_eq!(
        outcome(&r)["detail"],
        "the audit trail did not commit the call's start (waited 3s for it); the call was not started, so that nothing runs unrecorded"
    );
    assert_eq!(h.log.runs("echo"), 0, "it ran unrecorded");
}
