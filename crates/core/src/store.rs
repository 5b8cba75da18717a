//! The audit trail as the engine and front doors see it (docs/AUDIT.md): one trait, [`AuditStore`],
//! that a durable store implements (`toolwarden-store`: SQLite, and PostgreSQL for replicas that
//! share one trail), and the engine's three hooks into it.
//!
//! The key design choice: **the engine never waits for the store on its event path.** Every
//! event is handed to [`AuditStore::append`], which only enqueues (the store writes in the
//! background, many events per transaction). The engine waits in exactly two places, both before
//! work starts:
//!
//! - **before a turn's calls start** ([`admit`]), while the store's write queue is full — the
//!   back-pressure that slows new calls instead of dropping events (counted in
//!   `toolwarden_store_queue_full_total` and `toolwarden_store_queue_wait_seconds_total`);
//! - **before a call's backend is invoked** ([`tool_start_durable`]), with
//!   `durability = "before_execution"`: until the call's `tool_start` is committed. When the
//!   store cannot write, the backend is not invoked at all and the call ends
//!   `error{transport}` saying the audit trail cannot be written: no side effect happens
//!   unrecorded.
//!
//! The bus's `seq` continues after the store's last one, so `seq` increases across restarts and a
//! client's `Last-Event-ID` from an earlier run still names an event in the trail.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::time::Instant;
use toolwarden_protocol::{
    AuditPage, AuditQuery, CallsPage, CancelReason, Event, ReplicaRecord, StoreDurability,
    TaskRecord, TurnId, TurnRecord,
};

use crate::backend::BoxFuture;
use crate::cancel::CancelScope;
use crate::events::{EventBus, EventSink};
use crate::metrics::{Metrics, register_all};

/// How long a call's `tool_start` waits, by default, for a trail that cannot write before the
/// call ends `error{store}` without running.
pub const DEFAULT_STORE_WAIT: Duration = Duration::from_secs(5);

/// How often a call waiting for a trail that cannot write looks again.
const STORE_RECHECK: Duration = Duration::from_millis(50);

/// The store cannot commit what it was given (its health says why).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the audit trail cannot be written: {0}")]
pub struct StoreUnavailable(pub String);

/// A read of the trail failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the audit trail cannot be read: {0}")]
pub struct StoreReadError(pub String);

/// Whether the store can write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreHealth {
    /// Its last write went through.
    Ok,
    /// Its last write failed; it retries, keeping every event.
    Degraded(String),
}

/// A durable audit trail. Writes are enqueued and committed in the background, in `seq` order;
/// reads run off the caller's thread.
pub trait AuditStore: Send + Sync + 'static {
    /// When a call's `tool_start` must be committed.
    fn durability(&self) -> StoreDurability;

    /// The highest `seq` in the store when it was opened (recovery's records included): the
    /// engine's `seq` continues after it.
    fn last_seq(&self) -> u64;

    /// Enqueues one event. Runs on the engine's path, in `seq` order: it must never block and
    /// never drop the event.
    fn append(&self, event: &Arc<Event>);

    /// Whether every event up to `seq` is committed.
    fn is_durable(&self, seq: u64) -> bool;

    /// Resolves once every event up to `seq` is committed, or with an error while the store
    /// cannot write. A store whose commit is a quick local write may make it right here, on the
    /// caller's thread, and return a future that is already resolved.
    fn durable(&self, seq: u64) -> BoxFuture<Result<(), StoreUnavailable>>;

    /// Resolves once every event up to `seq` (`None`: every event appended so far) is committed
    /// and can be read through [`AuditStore::events`], [`AuditStore::calls`] and
    /// [`AuditStore::turn`] — a store may commit events somewhere its reads do not look yet, and
    /// is asked here to make them readable now — or with an error while it cannot write.
    fn readable(&self, seq: Option<u64>) -> BoxFuture<Result<(), StoreUnavailable>>;

    /// Whether the write queue has room for new work.
    fn has_room(&self) -> bool;

    /// Resolves when the write queue has room.
    fn room(&self) -> BoxFuture<()>;

    /// Events enqueued and not yet committed.
    fn queue_depth(&self) -> usize;

    /// How many transactions the store has committed since it opened, and how many events they
    /// wrote (their ratio is how well commits are shared between calls).
    fn commits(&self) -> StoreCommits;

    /// Whether the store can write.
    fn health(&self) -> StoreHealth;

    /// A page of events (`GET /v1/audit`).
    fn events(&self, query: AuditQuery) -> BoxFuture<Result<AuditPage, StoreReadError>>;

    /// A page of calls, newest first (`GET /v1/audit/calls`).
    fn calls(&self, query: AuditQuery) -> BoxFuture<Result<CallsPage, StoreReadError>>;

    /// A turn's record (`GET /v1/turns/{id}`); `None` for a turn the trail does not know.
    fn turn(&self, turn_id: TurnId) -> BoxFuture<Result<Option<TurnRecord>, StoreReadError>>;

    /// Records a task toward an MCP client (it replaces one of the same id); resolves once it is
    /// committed, or with an error when the store cannot write. A task whose turn ended more
    /// than its `ttl_ms` ago is deleted when old rows are pruned.
    fn put_task(&self, task: TaskRecord) -> BoxFuture<Result<(), StoreUnavailable>>;

    /// The task of that id; `None` for one the trail does not know (or no longer keeps).
    fn task(&self, task_id: String) -> BoxFuture<Result<Option<TaskRecord>, StoreReadError>>;

    /// The replicas sharing this trail, each with its lease (`GET /v1/replicas`); `None` for a
    /// trail of one process (SQLite), which has no leases.
    fn replicas(&self) -> BoxFuture<Result<Option<Vec<ReplicaRecord>>, StoreReadError>> {
        Box::pin(async { Ok(None) })
    }

    /// Commits everything enqueued so far and stops writing. Idempotent.
    fn close(&self) -> BoxFuture<()>;
}

/// What a store has committed since it opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreCommits {
    /// Transactions committed.
    pub commits: u64,
    /// Events they wrote.
    pub events: u64,
}

/// The bus feeds the store through this sink.
struct StoreSink(Arc<dyn AuditStore>);

impl EventSink for StoreSink {
    fn record(&self, event: &Arc<Event>) {
        self.0.append(event);
    }
}

/// The engine's handle on its store, with the store's metrics.
pub(crate) struct StoreHook {
    pub(crate) store: Arc<dyn AuditStore>,
    /// How long a call's `tool_start` may wait for a trail that cannot write.
    wait: Duration,
    queue_full: Counter,
    queue_wait: Counter<f64, std::sync::atomic::AtomicU64>,
    queue_depth: Gauge,
    up: Gauge,
    commits: Counter,
    events_committed: Counter,
}

/// Attaches `store` to a new engine's bus: `seq` continues after the store's, every event is
/// appended, and the store's metrics are registered.
pub(crate) fn attach(
    bus: &EventBus,
    metrics: &Metrics,
    store: Arc<dyn AuditStore>,
    wait: Duration,
) -> StoreHook {
    bus.continue_after(store.last_seq());
    bus.add_sink(Arc::new(StoreSink(store.clone())));
    let hook = StoreHook {
        store,
        wait,
        queue_full: Counter::default(),
        queue_wait: Counter::default(),
        queue_depth: Gauge::default(),
        up: Gauge::default(),
        commits: Counter::default(),
        events_committed: Counter::default(),
    };
    register_all! { metrics;
        hook.queue_full => "store_queue_full", "Turns that waited before their calls started because the audit trail's write queue was full";
        hook.queue_wait => "store_queue_wait_seconds", "Time turns waited for room in the audit trail's write queue";
        hook.queue_depth => "store_queue_depth", "Events waiting to be committed to the audit trail";
        hook.up => "store_up", "Whether the audit trail can write (1) or not (0)";
        hook.commits => "store_commits", "Commits of the audit trail (SQLite: appends to its pending file; PostgreSQL: transactions)";
        hook.events_committed => "store_events_committed", "Events the audit trail's commits wrote";
    }
    hook
}

/// Brings the store's gauges up to date (before the metrics are encoded).
pub(crate) fn refresh_metrics(hook: Option<&StoreHook>) {
    if let Some(hook) = hook {
        hook.queue_depth.set(hook.store.queue_depth() as i64);
        hook.up
            .set(i64::from(hook.store.health() == StoreHealth::Ok));
        let done = hook.store.commits();
        // Counters only rise: bring each up to the store's own count.
        hook.commits
            .inc_by(done.commits.saturating_sub(hook.commits.get()));
        hook.events_committed
            .inc_by(done.events.saturating_sub(hook.events_committed.get()));
    }
}

/// Back-pressure: waits, before a turn's calls start, while the store's write queue is full.
/// A store that cannot write does not hold calls here (they fail at once at their `tool_start`
/// with `before_execution`, and keep their events queued with `async`).
pub(crate) async fn admit(hook: Option<&StoreHook>) {
    let Some(hook) = hook else { return };
    if hook.store.has_room() || hook.store.health() != StoreHealth::Ok {
        return;
    }
    hook.queue_full.inc();
    let waited = Instant::now();
    hook.store.room().await;
    hook.queue_wait.inc_by(waited.elapsed().as_secs_f64());
}

/// Why a call's backend must not be invoked.
pub(crate) enum Unrecorded {
    /// The call was cancelled while its `tool_start` was being committed.
    Cancelled(CancelReason),
    /// The store cannot write: the call would run unrecorded.
    Failed(String),
}

/// With `before_execution`, waits until the call's `tool_start` (`seq`) is committed; with
/// `async` (or no store), returns at once.
pub(crate) async fn tool_start_durable(
    hook: Option<&StoreHook>,
    scope: &CancelScope,
    seq: u64,
) -> Result<(), Unrecorded> {
    let Some(hook) = hook else {
        return Ok(());
    };
    if hook.store.durability() != StoreDurability::BeforeExecution || hook.store.is_durable(seq) {
        return Ok(());
    }
    // While the trail cannot write (the database restarts, the disk is full) or does not
    // commit (a database that hangs), the call waits for it — at most `wait` — and then ends
    // without running: never unrecorded. (With a `wait` of zero, a trail that reports it cannot
    // write ends the call at once; a commit under way is waited for.)
    let give_up = Instant::now() + hook.wait;
    let waited = || {
        format!(
            " (waited {} for it)",
            toolwarden_protocol::format_duration(hook.wait)
        )
    };
    loop {
        let done = tokio::select! {
            biased;
            () = scope.cancelled() => return Err(Unrecorded::Cancelled(scope.reason().unwrap_or(CancelReason::User))),
            done = hook.store.durable(seq) => done,
            () = tokio::time::sleep_until(give_up), if !hook.wait.is_zero() => {
                return Err(Unrecorded::Failed(format!(
                    "the audit trail did not commit the call's start{}; the call was not started, so that nothing runs unrecorded",
                    waited()
                )));
            }
        };
        let Err(e) = done else {
            return Ok(());
        };
        if Instant::now() >= give_up {
            let waited = if hook.wait.is_zero() {
                String::new()
            } else {
                waited()
            };
            return Err(Unrecorded::Failed(format!(
                "{e}{waited}; the call was not started, so that nothing runs unrecorded"
            )));
        }
        tokio::select! {
            biased;
            () = scope.cancelled() => return Err(Unrecorded::Cancelled(scope.reason().unwrap_or(CancelReason::User))),
            () = tokio::time::sleep(STORE_RECHECK.min(give_up.saturating_duration_since(Instant::now()))) => {}
        }
    }
}
