//! The writer thread and its queue: group commit, durability notices, back-pressure, health,
//! retries, and pruning by age.
//!
//! Where the commits are made depends on the database. PostgreSQL's are transactions over the
//! network: the writer thread makes them all, and a call waiting for one waits for that thread.
//! SQLite's are appends to a local file (`pending.rs`): a call that needs its `tool_start`
//! committed appends everything queued itself, on its own thread, in one `write` — no hand-over
//! to another thread and back — while the writer thread commits what nobody waits for every few
//! milliseconds and moves committed events into the database.

use std::fs::File;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use tokio::sync::{Notify, watch};
use toolwarden_core::backend::BoxFuture;
use toolwarden_core::{StoreCommits, StoreHealth, StoreUnavailable};
use toolwarden_protocol::{Event, TaskRecord, Timestamp};

use crate::sqlite::pending::{PendingLog, Unapplied};

use crate::options::StoreOptions;
use crate::redact::{RedactedEvent, Redactor};

/// How often old rows are pruned.
const PRUNE_EVERY_MS: i64 = 3600 * 1000;
/// How long recording a task waits for the write connection (a commit takes milliseconds; a
/// prune or a failing database holds it longer) before giving up on making the task.
const PUT_TASK_WAIT: Duration = Duration::from_secs(1);
/// Waits between attempts to write after a failure: doubling up to the last.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(1);
/// With a pending log: how long the writer thread lets events nobody waits for gather before it
/// commits them (and looks whether the committed ones are due to be moved into the database)…
const LINGER: Duration = Duration::from_millis(5);
/// …unless this many are queued.
const COMMIT_AT: usize = 1024;

/// What has been committed, as waiters see it.
#[derive(Clone, Debug, Default)]
struct Committed {
    /// Every event up to this `seq` is committed.
    seq: u64,
    /// Every event up to this `seq` can be read (SQLite: it is in the database, not only in the
    /// pending file).
    readable: u64,
    /// Why the last write failed, while it fails.
    failed: Option<Arc<str>>,
}

#[derive(Default)]
struct EventQueue {
    events: Vec<Arc<Event>>,
    closing: bool,
    /// The writer sleeps on the condvar until an event is appended, which wakes it.
    idle: bool,
    /// The writer waits on the condvar, idle or lingering: a read or a full queue wakes it.
    waiting: bool,
    /// A read waits for the events up to this `seq` to be readable.
    read_upto: u64,
}

/// Resolves once `reached` of what is committed is at least `seq`, or with the error while the
/// store cannot write.
fn wait_until(
    mut rx: watch::Receiver<Committed>,
    seq: u64,
    reached: fn(&Committed) -> u64,
) -> BoxFuture<Result<(), StoreUnavailable>> {
    Box::pin(async move {
        let state = rx
            .wait_for(|c| reached(c) >= seq || c.failed.is_some())
            .await
            .map(|c| c.clone())
            .map_err(|_| StoreUnavailable("the store was closed".to_owned()))?;
        if reached(&state) >= seq {
            Ok(())
        } else {
            Err(StoreUnavailable(
                state.failed.as_deref().unwrap_or("unknown").to_owned(),
            ))
        }
    })
}

/// What the store and its writer thread share.
pub(crate) struct Shared {
    queue: Mutex<EventQueue>,
    wake: Condvar,
    /// Events enqueued and not yet committed.
    depth: AtomicUsize,
    capacity: usize,
    durable_seq: AtomicU64,
    /// The last event appended (committed or not).
    appended_seq: AtomicU64,
    /// Transactions of events committed, and the events they wrote.
    commits: AtomicU64,
    events_committed: AtomicU64,
    failing: AtomicBool,
    committed: watch::Sender<Committed>,
    room: Notify,
    health: Mutex<StoreHealth>,
    closed: watch::Sender<bool>,
    /// The write connection; `None` once the store is closed.
    state: Mutex<Option<Box<dyn TrailBackend>>>,
    /// Where commits go when whoever needs one makes it (SQLite: the pending files); `None`:
    /// the writer thread commits to the backend.
    log: Option<Arc<Mutex<PendingLog>>>,
    redactor: Redactor,
}

/// Starts the writer thread over `backend` (the thread holds `lock`, if any, until it ends);
/// commits go to `log` when there is one, else to the backend.
pub(crate) fn start(
    backend: Box<dyn TrailBackend>,
    log: Option<Arc<Mutex<PendingLog>>>,
    lock: Option<File>,
    redactor: Redactor,
    options: &StoreOptions,
    last_seq: u64,
) -> std::io::Result<Arc<Shared>> {
    let shared = Arc::new(Shared {
        queue: Mutex::new(EventQueue::default()),
        wake: Condvar::new(),
        depth: AtomicUsize::new(0),
        capacity: options.queue_capacity.max(1),
        durable_seq: AtomicU64::new(last_seq),
        appended_seq: AtomicU64::new(last_seq),
        commits: AtomicU64::new(0),
        events_committed: AtomicU64::new(0),
        failing: AtomicBool::new(false),
        committed: watch::Sender::new(Committed {
            seq: last_seq,
            readable: last_seq,
            failed: None,
        }),
        room: Notify::new(),
        health: Mutex::new(StoreHealth::Ok),
        closed: watch::Sender::new(false),
        state: Mutex::new(Some(backend)),
        log,
        redactor,
    });
    let writer = Writer {
        shared: shared.clone(),
        _lock: lock,
        retain: options.retain,
        last_prune: Timestamp::now().unix_millis(),
        apply_after: options.apply_after,
    };
    std::thread::Builder::new()
        .name("toolwarden-store".into())
        .spawn(move || writer.run())?;
    Ok(shared)
}

/// Where the writer thread writes: one implementation per database.
pub(crate) trait TrailBackend: Send {
    /// Commits `items` (a store without a pending log). On an error nothing of them is
    /// committed (the backend forgets what it cached about rows the transaction made).
    fn write(&mut self, items: &[RedactedEvent<'_>]) -> Result<(), String>;
    /// Events committed but not readable yet (SQLite: in the pending files); `None` when every
    /// committed event can be read (PostgreSQL commits into the tables themselves).
    fn unapplied(&self) -> Option<Unapplied> {
        None
    }
    /// Makes the events committed so far readable (commits made meanwhile may stay to be moved
    /// next time); says up to which `seq`, if anything was moved. On an error they stay
    /// committed, to be moved again.
    fn apply_pending(&mut self) -> Result<Option<u64>, String> {
        Ok(None)
    }
    /// Deletes rows older than `retain`, and tasks past their `ttl_ms`.
    fn prune(&mut self, retain: Duration, now: Timestamp) -> Result<(), String>;
    /// Writes one task and commits.
    fn put_task(&mut self, task: &TaskRecord) -> Result<(), String>;
    /// The store is closing: leaves the database tidy for readers.
    fn close(&mut self);
}

/// Masks and truncates each event's body for the trail.
fn prepare<'a>(redactor: &Redactor, batch: &'a [Arc<Event>]) -> Vec<RedactedEvent<'a>> {
    batch
        .iter()
        .map(|event| RedactedEvent {
            event,
            body: redactor.body(event),
        })
        .collect()
}

impl Shared {
    pub(crate) fn append(&self, event: &Arc<Event>) {
        let mut q = self.queue.lock();
        q.events.push(event.clone());
        self.appended_seq.store(event.seq, Ordering::Release);
        self.depth.fetch_add(1, Ordering::AcqRel);
        if q.idle || q.events.len() == COMMIT_AT {
            self.wake_locked(&mut q);
        }
    }

    pub(crate) fn depth(&self) -> usize {
        self.depth.load(Ordering::Acquire)
    }

    pub(crate) fn commits(&self) -> StoreCommits {
        StoreCommits {
            commits: self.commits.load(Ordering::Relaxed),
            events: self.events_committed.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn has_room(&self) -> bool {
        self.depth() < self.capacity
    }

    pub(crate) fn room(self: &Arc<Self>) -> BoxFuture<()> {
        let shared = self.clone();
        Box::pin(async move {
            loop {
                let notified = shared.room.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if shared.has_room() || shared.failing.load(Ordering::Acquire) {
                    return;
                }
                notified.await;
            }
        })
    }

    pub(crate) fn is_durable(&self, seq: u64) -> bool {
        self.durable_seq.load(Ordering::Acquire) >= seq
    }

    /// Resolves once `seq` is committed. With a pending log the caller commits it: everything
    /// queued — other calls' events too — is appended in one `write` on the caller's thread (a
    /// call finding another one appending waits for it, and usually finds its own event carried
    /// by that write). Without one, the writer thread commits and the caller waits for it.
    pub(crate) fn durable(self: &Arc<Self>, seq: u64) -> BoxFuture<Result<(), StoreUnavailable>> {
        if self.is_durable(seq) {
            return Box::pin(std::future::ready(Ok(())));
        }
        match self.commit_for(seq) {
            Some(done) => Box::pin(std::future::ready(done)),
            None => wait_until(self.committed.subscribe(), seq, |c| c.seq),
        }
    }

    /// Commits everything queued to the pending log, on this thread, so that `seq` is committed;
    /// `None` without a pending log, or if `seq` was not queued yet (never so for a call's own
    /// event): then the writer commits it.
    fn commit_for(&self, seq: u64) -> Option<Result<(), StoreUnavailable>> {
        let log = self.log.as_ref()?;
        // While the store cannot write, nothing new is committed (the writer retries).
        if let Some(why) = self.committed.borrow().failed.clone() {
            return Some(Err(StoreUnavailable(why.to_string())));
        }
        let mut log = log.lock();
        if log.is_closed() {
            return Some(Err(StoreUnavailable(
                "the audit trail is closed".to_owned(),
            )));
        }
        let result = if self.is_durable(seq) {
            Ok(())
        } else {
            // A call's commit leaves the store's failure, if any, to the writer's retries.
            self.commit_to_log(&mut log, false)
        };
        drop(log);
        match result {
            Ok(()) => self.is_durable(seq).then_some(Ok(())),
            Err(why) => {
                self.failed(&why);
                self.wake_writer();
                Some(Err(StoreUnavailable(why)))
            }
        }
    }

    /// Appends everything queued to the pending log (whose lock the caller holds) in one write.
    /// On an error the events go back to the head of the queue, to be committed again, and
    /// nothing of them counts as committed.
    fn commit_to_log(&self, log: &mut PendingLog, clear_failure: bool) -> Result<(), String> {
        let batch = self.take();
        let Some(last) = batch.last().map(|e| e.seq) else {
            return Ok(());
        };
        let items = prepare(&self.redactor, &batch);
        let file = log.active();
        let written = file.append(&items);
        drop(items);
        match written {
            Ok(()) => {
                self.committed_batch(batch.len(), last, false, clear_failure);
                Ok(())
            }
            Err(e) => {
                let why = format!("cannot write {}: {e}", file.path().display());
                let mut q = self.queue.lock();
                let newer = std::mem::replace(&mut q.events, batch);
                q.events.extend(newer);
                Err(why)
            }
        }
    }

    /// Wakes the writer thread, sleeping or lingering.
    fn wake_writer(&self) {
        self.wake_locked(&mut self.queue.lock());
    }

    /// Wakes the writer thread if it waits on the condvar (`q` is the queue, locked).
    fn wake_locked(&self, q: &mut EventQueue) {
        if q.waiting {
            q.idle = false;
            q.waiting = false;
            self.wake.notify_one();
        }
    }

    /// Resolves once every event up to `seq` (`None`: every event appended so far, committed or
    /// not) can be read, asking the writer to commit them and make them readable now rather
    /// than at its next turn.
    pub(crate) fn readable(
        self: &Arc<Self>,
        seq: Option<u64>,
    ) -> BoxFuture<Result<(), StoreUnavailable>> {
        let seq = seq.unwrap_or_else(|| self.appended_seq.load(Ordering::Acquire));
        if self.readable_seq() >= seq {
            return Box::pin(std::future::ready(Ok(())));
        }
        let rx = self.committed.subscribe();
        {
            let mut q = self.queue.lock();
            q.read_upto = q.read_upto.max(seq);
            self.wake_locked(&mut q);
        }
        wait_until(rx, seq, |c| c.readable)
    }

    pub(crate) fn health(&self) -> StoreHealth {
        self.health.lock().clone()
    }

    pub(crate) fn request_close(&self) {
        let mut q = self.queue.lock();
        q.closing = true;
        self.wake_locked(&mut q);
    }

    /// Writes `task` on the write connection, off the caller's thread, between two batches of
    /// events; resolves once it is committed.
    pub(crate) fn put_task(
        self: &Arc<Self>,
        task: TaskRecord,
    ) -> BoxFuture<Result<(), StoreUnavailable>> {
        let shared = self.clone();
        // A failing store retries its batch while holding the connection: a task is not made
        // then (its request keeps waiting for the call), rather than waiting for the database.
        let write = move || {
            if shared.failing.load(Ordering::Acquire) {
                let why = match &*shared.health.lock() {
                    StoreHealth::Degraded(why) => why.clone(),
                    StoreHealth::Ok => "the store cannot write".to_owned(),
                };
                return Err(StoreUnavailable(format!(
                    "the task was not recorded: {why}"
                )));
            }
            let Some(mut state) = shared.state.try_lock_for(PUT_TASK_WAIT) else {
                return Err(StoreUnavailable(
                    "the task was not recorded: the writer was busy for too long".to_owned(),
                ));
            };
            match state.as_mut() {
                Some(backend) => backend
                    .put_task(&task)
                    .map_err(|e| StoreUnavailable(format!("the task was not recorded: {e}"))),
                None => Err(StoreUnavailable("the audit trail is closed".to_owned())),
            }
        };
        Box::pin(async move {
            match tokio::runtime::Handle::try_current() {
                Ok(handle) => handle
                    .spawn_blocking(write)
                    .await
                    .map_err(|e| StoreUnavailable(e.to_string()))?,
                Err(_) => write(),
            }
        })
    }

    pub(crate) fn close(self: &Arc<Self>) -> BoxFuture<()> {
        self.request_close();
        let mut rx = self.closed.subscribe();
        Box::pin(async move {
            let _ = rx.wait_for(|closed| *closed).await;
        })
    }

    /// Everything queued, in `seq` order.
    fn take(&self) -> Vec<Arc<Event>> {
        std::mem::take(&mut self.queue.lock().events)
    }

    /// Commits everything queued, retrying (every event kept) until it commits or the store is
    /// closed.
    fn commit_retrying(&self, backend: &mut dyn TrailBackend) {
        let committed = match &self.log {
            // Each try takes the log anew: waiting between tries never holds it.
            Some(log) => self.retrying(|| self.commit_to_log(&mut log.lock(), true)),
            None => {
                let batch = self.take();
                let Some(last) = batch.last().map(|e| e.seq) else {
                    return;
                };
                let items = prepare(&self.redactor, &batch);
                let committed = self.retrying(|| backend.write(&items));
                if committed {
                    let readable = backend.unapplied().is_none();
                    self.committed_batch(items.len(), last, readable, true);
                }
                committed
            }
        };
        if !committed {
            tracing::error!(
                events = self.queue.lock().events.len(),
                "the audit trail could not be written before closing"
            );
        }
    }

    /// Makes the committed events readable, retrying like a commit.
    fn apply_retrying(&self, backend: &mut dyn TrailBackend) {
        let mut readable = None;
        let applied = self.retrying(|| {
            readable = backend.apply_pending()?;
            Ok(())
        });
        if applied {
            self.recovered();
            self.committed.send_modify(|c| {
                if let Some(last) = readable {
                    c.readable = c.readable.max(last);
                }
                c.failed = None;
            });
        } else {
            tracing::error!(
                "the audit trail's pending events could not be moved into the database before closing"
            );
        }
    }

    /// Runs `write` until it succeeds — after a failure the store is degraded and waits, 100 ms
    /// doubling up to 1 s, between tries — or, once the store is closing, one more try has
    /// failed (then `false`).
    fn retrying(&self, mut write: impl FnMut() -> Result<(), String>) -> bool {
        let mut wait = RETRY_FIRST;
        loop {
            match write() {
                Ok(()) => return true,
                Err(e) => {
                    self.failed(&e);
                    let mut q = self.queue.lock();
                    if q.closing {
                        drop(q);
                        std::thread::park_timeout(wait);
                        return write().is_ok();
                    }
                    q.waiting = true;
                    self.wake.wait_for(&mut q, wait);
                    q.waiting = false;
                    wait = (wait * 2).min(RETRY_MAX);
                }
            }
        }
    }

    /// A write failed: the store is degraded; waiters hear why.
    fn failed(&self, e: &str) {
        let why: Arc<str> = e.into();
        if !self.failing.swap(true, Ordering::AcqRel) {
            tracing::error!(error = %why, "the audit trail cannot be written; retrying");
        }
        *self.health.lock() = StoreHealth::Degraded(why.to_string());
        self.committed.send_modify(|c| c.failed = Some(why));
        self.room.notify_waiters();
    }

    /// Every event up to this `seq` can be read.
    fn readable_seq(&self) -> u64 {
        self.committed.borrow().readable
    }

    /// A write went through: the store is healthy again if it was not.
    fn recovered(&self) {
        if self.failing.swap(false, Ordering::AcqRel) {
            *self.health.lock() = StoreHealth::Ok;
            tracing::info!("the audit trail can be written again");
        }
    }

    /// `n` events up to `last` are committed: tells the waiters, makes room.
    /// `readable`: they can be read already (nothing pending); `clear_failure`: the store, if
    /// it was failing, is healthy again.
    fn committed_batch(&self, n: usize, last: u64, readable: bool, clear_failure: bool) {
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.events_committed.fetch_add(n as u64, Ordering::Relaxed);
        self.durable_seq.fetch_max(last, Ordering::AcqRel);
        if clear_failure {
            self.recovered();
        }
        self.committed.send_modify(|c| {
            c.seq = c.seq.max(last);
            if readable {
                c.readable = c.readable.max(last);
            }
            if clear_failure {
                c.failed = None;
            }
        });
        let before = self.depth.fetch_sub(n, Ordering::AcqRel);
        if before - n < self.capacity {
            self.room.notify_waiters();
        }
    }
}

struct Writer {
    shared: Arc<Shared>,
    _lock: Option<File>,
    retain: Option<Duration>,
    last_prune: i64,
    /// How long committed events may wait before they are made readable.
    apply_after: Duration,
}

impl Writer {
    fn run(mut self) {
        // With a pending log, calls that wait commit for themselves: the writer lets what
        // nobody waits for gather for a few milliseconds instead of waking for every event.
        let lingers = self.shared.log.is_some();
        loop {
            let (closing, read_upto) = {
                let mut q = self.shared.queue.lock();
                loop {
                    if q.closing {
                        break;
                    }
                    let readable = self.shared.readable_seq();
                    let unread = self.shared.durable_seq.load(Ordering::Acquire) > readable;
                    // A read waits, and not everything appended can be read yet.
                    let asked = q.read_upto > readable
                        && self.shared.appended_seq.load(Ordering::Acquire) > readable;
                    if asked && (unread || !q.events.is_empty()) {
                        break;
                    }
                    if q.events.len() >= if lingers { COMMIT_AT } else { 1 } {
                        break;
                    }
                    // (A read may ask for events a call is committing right now: they are
                    // there at the next look.)
                    if unread || asked || !q.events.is_empty() {
                        // Lingering: committed events are made readable within their time.
                        q.waiting = true;
                        self.shared.wake.wait_for(&mut q, LINGER);
                        q.waiting = false;
                        break;
                    }
                    // Nothing to do until an event comes; the writer wakes at least once a
                    // minute, to prune.
                    q.idle = true;
                    q.waiting = true;
                    let timed_out = self
                        .shared
                        .wake
                        .wait_for(&mut q, Duration::from_secs(60))
                        .timed_out();
                    q.idle = false;
                    q.waiting = false;
                    if timed_out && q.events.is_empty() && !q.closing {
                        drop(q);
                        self.maybe_prune();
                        q = self.shared.queue.lock();
                    }
                }
                (q.closing, q.read_upto)
            };
            let mut settled = true;
            {
                let mut guard = self.shared.state.lock();
                if let Some(backend) = guard.as_mut() {
                    self.shared.commit_retrying(backend.as_mut());
                    if let Some(u) = backend.unapplied() {
                        if closing
                            || read_upto > self.shared.readable_seq()
                            || u.due(tokio::time::Instant::now(), self.apply_after)
                        {
                            self.shared.apply_retrying(backend.as_mut());
                        } else {
                            settled = false;
                        }
                    }
                }
            }
            if closing && self.shared.queue.lock().events.is_empty() {
                break;
            }
            if settled {
                self.maybe_prune();
            }
        }
        // The connection and the lock go before anyone hears that the store is closed, so that
        // the next writer can open it at once.
        if let Some(mut backend) = self.shared.state.lock().take() {
            backend.close();
        }
        let Writer { shared, _lock, .. } = self;
        drop(_lock);
        shared.closed.send_replace(true);
    }

    fn maybe_prune(&mut self) {
        // Expired tasks go whatever `retain` says; zero keeps every other row.
        let retain = self.retain.unwrap_or(Duration::ZERO);
        let now = Timestamp::now();
        if now.unix_millis() - self.last_prune < PRUNE_EVERY_MS {
            return;
        }
        self.last_prune = now.unix_millis();
        let mut guard = self.shared.state.lock();
        if let Some(backend) = guard.as_mut()
            && let Err(e) = backend.prune(retain, now)
        {
            tracing::warn!(error = %e, "pruning the audit trail failed");
        }
    }
}
