//! The writer thread and its queue: group commit, durability notices, back-pressure, health,
//! retries, and pruning by age.

use std::fs::File;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use rusqlite::Connection;
use tokio::sync::{Notify, watch};
use toolwarden_core::backend::BoxFuture;
use toolwarden_core::{StoreCommits, StoreHealth, StoreUnavailable};
use toolwarden_protocol::{Event, TaskRecord, Timestamp};

use crate::apply::{Fact, Prepared, Rows, apply};
use crate::pending::{PendingFile, Unapplied};

use crate::options::StoreOptions;
use crate::redact::Redactor;

/// How often old rows are pruned.
const PRUNE_EVERY_MS: i64 = 3600 * 1000;
/// Rows deleted per transaction when pruning (so that commits of new events are not held up).
const PRUNE_CHUNK: i64 = 5000;
/// How long recording a task waits for the write connection (a commit takes milliseconds; a
/// prune or a failing database holds it longer) before giving up on making the task.
const PUT_TASK_WAIT: Duration = Duration::from_secs(1);
/// Waits between attempts to write after a failure: doubling up to the last.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);

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
struct Queue {
    events: Vec<Arc<Event>>,
    closing: bool,
    /// The writer sleeps on the condvar and must be woken.
    idle: bool,
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
    queue: Mutex<Queue>,
    wake: Condvar,
    /// Events enqueued and not yet committed.
    depth: AtomicUsize,
    capacity: usize,
    durable_seq: AtomicU64,
    /// Transactions of events committed, and the events they wrote.
    commits: AtomicU64,
    events_committed: AtomicU64,
    failing: AtomicBool,
    committed: watch::Sender<Committed>,
    room: Notify,
    health: Mutex<StoreHealth>,
    closed: watch::Sender<bool>,
    /// The write connection; `None` once the store is closed.
    state: Mutex<Option<Conn>>,
}

/// Starts the writer thread over `backend` (the thread holds `lock`, if any, until it ends).
pub(crate) fn start(
    backend: Box<dyn Backend>,
    lock: Option<File>,
    redactor: Redactor,
    options: &StoreOptions,
    last_seq: u64,
) -> std::io::Result<Arc<Shared>> {
    let shared = Arc::new(Shared {
        queue: Mutex::new(Queue::default()),
        wake: Condvar::new(),
        depth: AtomicUsize::new(0),
        capacity: options.queue_capacity.max(1),
        durable_seq: AtomicU64::new(last_seq),
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
        state: Mutex::new(None),
    });
    *shared.state.lock() = Some(Conn { backend, redactor });
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
pub(crate) trait Backend: Send {
    /// Commits `items`. On an error nothing of them is committed (the backend forgets what it
    /// cached about rows the transaction made).
    fn write(&mut self, items: &[Prepared<'_>]) -> Result<(), String>;
    /// Events committed but not readable yet (SQLite: in the pending file); `None` when every
    /// committed event can be read (PostgreSQL commits into the tables themselves).
    fn unapplied(&self) -> Option<Unapplied> {
        None
    }
    /// Makes every committed event readable. On an error they stay committed, to be moved again.
    fn apply_pending(&mut self) -> Result<(), String> {
        Ok(())
    }
    /// Deletes rows older than `retain`, and tasks past their `ttl_ms`.
    fn prune(&mut self, retain: Duration, now: Timestamp) -> Result<(), String>;
    /// Writes one task and commits.
    fn put_task(&mut self, task: &TaskRecord) -> Result<(), String>;
    /// The store is closing: leaves the database tidy for readers.
    fn close(&mut self);
}

/// The SQLite writer: its connection, the rows it remembers, and the pending file its commits go
/// to (`pending.rs`).
pub(crate) struct SqliteWriter {
    pub(crate) conn: Connection,
    pub(crate) rows: Rows,
    pub(crate) pending: PendingFile,
}

impl Backend for SqliteWriter {
    fn write(&mut self, items: &[Prepared<'_>]) -> Result<(), String> {
        self.pending
            .append(
                items
                    .iter()
                    .map(|item| (Fact::of(item.event), item.body.as_str())),
            )
            .map_err(|e| format!("cannot write {}: {e}", self.pending.path().display()))
    }

    fn unapplied(&self) -> Option<Unapplied> {
        self.pending.unapplied()
    }

    fn apply_pending(&mut self) -> Result<(), String> {
        if self.pending.unapplied().is_none() {
            return Ok(());
        }
        let result = (|| {
            let tx = self.conn.transaction()?;
            for (fact, body) in self.pending.records() {
                apply(&tx, &mut self.rows, &fact, body)?;
            }
            tx.commit()
        })();
        result.map_err(|e| {
            self.rows.clear();
            e.to_string()
        })?;
        // Should emptying the file fail, its records are in the database: moved again when the
        // store next opens, they are skipped by their `seq`.
        self.pending
            .applied()
            .map_err(|e| format!("cannot empty {}: {e}", self.pending.path().display()))
    }

    fn prune(&mut self, retain: Duration, now: Timestamp) -> Result<(), String> {
        prune(&self.conn, retain, now).map_err(|e| e.to_string())
    }

    fn put_task(&mut self, task: &TaskRecord) -> Result<(), String> {
        crate::tasks::write(&self.conn, task).map_err(|e| e.to_string())
    }

    fn close(&mut self) {
        if let Err(e) = self.apply_pending() {
            tracing::error!(error = %e, "the audit trail's pending events stay in {} until it next opens", self.pending.path().display());
        }
        // Let readers see a clean database: checkpoint the WAL into it.
        let _ = self.conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);");
    }
}

/// The write backend and what goes with it, used by the writer thread.
pub(crate) struct Conn {
    backend: Box<dyn Backend>,
    redactor: Redactor,
}

impl Conn {
    fn write(&mut self, items: &[Prepared<'_>]) -> Result<(), String> {
        self.backend.write(items)
    }

    fn apply_pending(&mut self) -> Result<(), String> {
        self.backend.apply_pending()
    }

    fn prepare<'a>(&self, batch: &'a [Arc<Event>]) -> Vec<Prepared<'a>> {
        batch
            .iter()
            .map(|event| Prepared {
                event,
                body: self.redactor.body(event),
            })
            .collect()
    }
}

impl Shared {
    pub(crate) fn append(&self, event: &Arc<Event>) {
        let mut q = self.queue.lock();
        q.events.push(event.clone());
        self.depth.fetch_add(1, Ordering::AcqRel);
        if q.idle {
            q.idle = false;
            self.wake.notify_one();
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

    /// Waits until `seq` is committed (by the writer thread: a waiting call never writes on the
    /// async runtime's threads, so a slow disk never stalls other calls).
    pub(crate) fn durable(self: &Arc<Self>, seq: u64) -> BoxFuture<Result<(), StoreUnavailable>> {
        if self.is_durable(seq) {
            return Box::pin(std::future::ready(Ok(())));
        }
        wait_until(self.committed.subscribe(), seq, |c| c.seq)
    }

    /// Resolves once every event up to `seq` (`None`: every event committed so far) can be read,
    /// asking the writer to make them readable now rather than at its next turn.
    pub(crate) fn readable(
        self: &Arc<Self>,
        seq: Option<u64>,
    ) -> BoxFuture<Result<(), StoreUnavailable>> {
        let seq = seq.unwrap_or_else(|| self.durable_seq.load(Ordering::Acquire));
        if self.readable_seq() >= seq {
            return Box::pin(std::future::ready(Ok(())));
        }
        let rx = self.committed.subscribe();
        {
            let mut q = self.queue.lock();
            q.read_upto = q.read_upto.max(seq);
            if q.idle {
                q.idle = false;
                self.wake.notify_one();
            }
        }
        wait_until(rx, seq, |c| c.readable)
    }

    pub(crate) fn health(&self) -> StoreHealth {
        self.health.lock().clone()
    }

    pub(crate) fn request_close(&self) {
        let mut q = self.queue.lock();
        q.closing = true;
        q.idle = false;
        self.wake.notify_one();
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
                Some(conn) => conn
                    .backend
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

    /// Commits `batch`, retrying (every event kept) until it commits or the store is closed.
    fn commit_retrying(&self, conn: &mut Conn, batch: &[Arc<Event>]) {
        let items = conn.prepare(batch);
        if self.retrying(conn, |conn| conn.write(&items)) {
            let last = items.last().map_or(0, |i| i.event.seq);
            let readable = conn.backend.unapplied().is_none();
            self.committed_batch(items.len(), last, readable);
        } else {
            tracing::error!(
                events = items.len(),
                "the audit trail could not be written before closing"
            );
        }
    }

    /// Makes the committed events up to `last` readable, retrying like a commit.
    fn apply_retrying(&self, conn: &mut Conn, last: u64) {
        if self.retrying(conn, Conn::apply_pending) {
            self.recovered();
            self.committed.send_modify(|c| {
                c.readable = c.readable.max(last);
                c.failed = None;
            });
        } else {
            tracing::error!(
                "the audit trail's pending events could not be moved into the database before closing"
            );
        }
    }

    /// Runs `write` until it succeeds — after a failure the store is degraded and waits, 100 ms
    /// doubling up to 5 s, between tries — or, once the store is closing, one more try has
    /// failed (then `false`).
    fn retrying(
        &self,
        conn: &mut Conn,
        mut write: impl FnMut(&mut Conn) -> Result<(), String>,
    ) -> bool {
        let mut wait = RETRY_FIRST;
        loop {
            match write(conn) {
                Ok(()) => return true,
                Err(e) => {
                    self.failed(&e);
                    let mut q = self.queue.lock();
                    if q.closing {
                        drop(q);
                        std::thread::park_timeout(wait);
                        return write(conn).is_ok();
                    }
                    q.idle = true;
                    self.wake.wait_for(&mut q, wait);
                    q.idle = false;
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
    /// `readable`: they can be read already (nothing pending).
    fn committed_batch(&self, n: usize, last: u64, readable: bool) {
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.events_committed.fetch_add(n as u64, Ordering::Relaxed);
        self.durable_seq.fetch_max(last, Ordering::AcqRel);
        self.recovered();
        self.committed.send_modify(|c| {
            c.seq = c.seq.max(last);
            if readable {
                c.readable = c.readable.max(last);
            }
            c.failed = None;
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
        // Committed events not yet readable, as of the last write.
        let mut unapplied: Option<Unapplied> = None;
        loop {
            let (closing, read_upto) = {
                let mut q = self.shared.queue.lock();
                loop {
                    if !q.events.is_empty()
                        || q.closing
                        || (unapplied.is_some() && q.read_upto > self.shared.readable_seq())
                    {
                        break;
                    }
                    // Pending events are made readable within their time; otherwise the writer
                    // wakes at least once a minute, to prune.
                    let now = tokio::time::Instant::now();
                    let wait = match &unapplied {
                        Some(u) if u.due(now, self.apply_after) => break,
                        Some(u) => (u.since + self.apply_after).saturating_duration_since(now),
                        None => Duration::from_secs(60),
                    };
                    q.idle = true;
                    let timed_out = self.shared.wake.wait_for(&mut q, wait).timed_out();
                    q.idle = false;
                    if timed_out && unapplied.is_none() && q.events.is_empty() && !q.closing {
                        drop(q);
                        self.maybe_prune();
                        q = self.shared.queue.lock();
                    }
                }
                (q.closing, q.read_upto)
            };
            {
                let mut guard = self.shared.state.lock();
                if let Some(conn) = guard.as_mut() {
                    let batch = self.shared.take();
                    if !batch.is_empty() {
                        self.shared.commit_retrying(conn, &batch);
                    }
                    unapplied = conn.backend.unapplied();
                    if let Some(u) = unapplied
                        && (closing
                            || read_upto > self.shared.readable_seq()
                            || u.due(tokio::time::Instant::now(), self.apply_after))
                    {
                        self.shared.apply_retrying(conn, u.last_seq);
                        unapplied = None;
                    }
                }
            }
            if closing && self.shared.queue.lock().events.is_empty() {
                break;
            }
            if unapplied.is_none() {
                self.maybe_prune();
            }
        }
        // The connection and the lock go before anyone hears that the store is closed, so that
        // the next writer can open it at once.
        if let Some(mut conn) = self.shared.state.lock().take() {
            conn.backend.close();
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
        if let Some(conn) = guard.as_mut()
            && let Err(e) = conn.backend.prune(retain, now)
        {
            tracing::warn!(error = %e, "pruning the audit trail failed");
        }
    }
}

/// Deletes tasks past their `ttl_ms`, and rows older than `retain` (events, ended calls and
/// turns, minute marks), in chunks.
pub(crate) fn prune(conn: &Connection, retain: Duration, now: Timestamp) -> rusqlite::Result<()> {
    crate::tasks::prune(conn, now)?;
    if retain.is_zero() {
        return Ok(());
    }
    let cutoff = now.unix_millis() - retain.as_millis().min(i64::MAX as u128) as i64;
    let minute = cutoff.div_euclid(60_000);
    // The first event, call and turn at or after the cutoff's minute; everything before goes.
    let bound: Option<(i64, i64, i64)> = conn
        .query_row(
            "SELECT seq, call_row, turn_row FROM marks WHERE minute >= ?1 ORDER BY minute LIMIT 1",
            [minute],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .ok();
    let (seq, call_row, turn_row) = match bound {
        Some(b) => b,
        None => {
            // Nothing since the cutoff: every row is older, unless there are none.
            let newest: Option<i64> =
                conn.query_row("SELECT max(ts) FROM events", [], |r| r.get(0))?;
            if newest.is_none_or(|ts| ts >= cutoff) {
                return Ok(());
            }
            (i64::MAX, i64::MAX, i64::MAX)
        }
    };
    let chunked = |sql: &str, bound: i64| -> rusqlite::Result<()> {
        loop {
            let n = conn.execute(sql, rusqlite::params![bound, PRUNE_CHUNK])?;
            if n < PRUNE_CHUNK as usize {
                return Ok(());
            }
        }
    };
    chunked(
        "DELETE FROM events WHERE seq IN (SELECT seq FROM events WHERE seq < ?1 ORDER BY seq LIMIT ?2)",
        seq,
    )?;
    chunked(
        "DELETE FROM calls WHERE id IN (SELECT id FROM calls WHERE id < ?1 AND status IS NOT NULL \
         ORDER BY id LIMIT ?2)",
        call_row,
    )?;
    chunked(
        "DELETE FROM turns WHERE id IN (SELECT id FROM turns WHERE id < ?1 AND ended_at IS NOT NULL \
         ORDER BY id LIMIT ?2)",
        turn_row,
    )?;
    conn.execute("DELETE FROM marks WHERE minute < ?1", [minute])?;
    Ok(())
}
