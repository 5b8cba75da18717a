//! The one handle of both stores: [`Trail`] is the writer thread (shared by SQLite and
//! PostgreSQL: group commit, back-pressure, health) and a database's reads. The engine's
//! [`AuditStore`] is implemented once, here; each database brings only its reads ([`Reads`]) and
//! its own way of opening.

use std::sync::Arc;

use serde_json::value::RawValue;
use toolwarden_core::backend::BoxFuture;
use toolwarden_core::{AuditStore, StoreCommits, StoreHealth, StoreReadError, StoreUnavailable};
use toolwarden_protocol::{
    AuditPage, AuditQuery, CallsPage, Event, ReplicaRecord, StoreDurability, TaskRecord, Timestamp,
    TurnId, TurnRecord, TurnRunState,
};

use crate::writer;

/// The status filter that selects calls without an outcome yet.
pub const RUNNING: &str = "running";

/// A turn's row, as either database reads it.
pub(crate) struct TurnRow {
    pub(crate) principal: String,
    pub(crate) session_id: Option<String>,
    pub(crate) started_at: i64,
    pub(crate) ended_at: Option<i64>,
    pub(crate) outcome: Option<String>,
    /// The body of its `turn_end` event, when it has one.
    pub(crate) end: Option<String>,
}

impl TurnRow {
    /// The record of turn `turn_id`, with the results its `turn_end` lists.
    pub(crate) fn into_record(self, turn_id: &TurnId) -> TurnRecord {
        let results = self.end.and_then(|body| {
            #[derive(serde::Deserialize)]
            struct End {
                results: Box<RawValue>,
            }
            serde_json::from_str::<End>(&body).ok().map(|e| e.results)
        });
        TurnRecord {
            turn_id: turn_id.clone(),
            principal: self.principal,
            session_id: self.session_id.map(Into::into),
            state: if self.ended_at.is_some() {
                TurnRunState::Ended
            } else {
                TurnRunState::Running
            },
            started_at: Timestamp::from_unix_millis(self.started_at),
            ended_at: self.ended_at.map(Timestamp::from_unix_millis),
            outcome: self.outcome,
            results,
        }
    }
}

/// How long past its ttl a task whose turn is not in the trail is kept.
pub(crate) const ORPHAN_GRACE_MS: i64 = 24 * 3600 * 1000;

/// Runs a blocking read `run` off the async runtime's threads (on its blocking pool), or right
/// here when there is no runtime.
pub(crate) async fn read_blocking<T: Send + 'static>(
    run: impl FnOnce() -> Result<T, StoreReadError> + Send + 'static,
) -> Result<T, StoreReadError> {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => handle
            .spawn_blocking(run)
            .await
            .map_err(|e| StoreReadError(e.to_string()))?,
        Err(_) => run(),
    }
}

/// A database's reads of the trail, run off the caller's thread.
pub trait Reads: std::fmt::Debug + Send + Sync + 'static {
    /// A page of events.
    fn events(&self, query: AuditQuery) -> BoxFuture<Result<AuditPage, StoreReadError>>;
    /// A page of calls, newest first.
    fn calls(&self, query: AuditQuery) -> BoxFuture<Result<CallsPage, StoreReadError>>;
    /// A turn's record.
    fn turn(&self, turn_id: TurnId) -> BoxFuture<Result<Option<TurnRecord>, StoreReadError>>;
    /// A task's record.
    fn task(&self, task_id: String) -> BoxFuture<Result<Option<TaskRecord>, StoreReadError>>;
    /// The replicas sharing the trail (`None`: a trail of one process).
    fn replicas(&self) -> BoxFuture<Result<Option<Vec<ReplicaRecord>>, StoreReadError>> {
        Box::pin(async { Ok(None) })
    }
}

/// An open audit trail: its writer thread and its database's reads.
pub struct Trail<R> {
    pub(crate) durability: StoreDurability,
    pub(crate) last_seq: u64,
    pub(crate) interrupted: usize,
    pub(crate) shared: Arc<writer::Shared>,
    pub(crate) reads: R,
}

impl<R: Reads> std::fmt::Debug for Trail<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trail")
            .field("reads", &self.reads)
            .field("durability", &self.durability)
            .finish_non_exhaustive()
    }
}

impl<R> Trail<R> {
    /// How many calls recovery recorded as `interrupted` when the store opened.
    pub fn interrupted(&self) -> usize {
        self.interrupted
    }
}

impl<R: Reads> AuditStore for Trail<R> {
    fn durability(&self) -> StoreDurability {
        self.durability
    }

    fn last_seq(&self) -> u64 {
        self.last_seq
    }

    fn append(&self, event: &Arc<Event>) {
        self.shared.append(event);
    }

    fn is_durable(&self, seq: u64) -> bool {
        self.shared.is_durable(seq)
    }

    fn durable(&self, seq: u64) -> BoxFuture<Result<(), StoreUnavailable>> {
        self.shared.durable(seq)
    }

    fn readable(&self, seq: Option<u64>) -> BoxFuture<Result<(), StoreUnavailable>> {
        self.shared.readable(seq)
    }

    fn has_room(&self) -> bool {
        self.shared.has_room()
    }

    fn room(&self) -> BoxFuture<()> {
        self.shared.room()
    }

    fn queue_depth(&self) -> usize {
        self.shared.depth()
    }

    fn commits(&self) -> StoreCommits {
        self.shared.commits()
    }

    fn health(&self) -> StoreHealth {
        self.shared.health()
    }

    fn events(&self, query: AuditQuery) -> BoxFuture<Result<AuditPage, StoreReadError>> {
        self.reads.events(query)
    }

    fn calls(&self, query: AuditQuery) -> BoxFuture<Result<CallsPage, StoreReadError>> {
        self.reads.calls(query)
    }

    fn turn(&self, turn_id: TurnId) -> BoxFuture<Result<Option<TurnRecord>, StoreReadError>> {
        self.reads.turn(turn_id)
    }

    fn put_task(&self, task: TaskRecord) -> BoxFuture<Result<(), StoreUnavailable>> {
        self.shared.put_task(task)
    }

    fn task(&self, task_id: String) -> BoxFuture<Result<Option<TaskRecord>, StoreReadError>> {
        self.reads.task(task_id)
    }

    fn replicas(&self) -> BoxFuture<Result<Option<Vec<ReplicaRecord>>, StoreReadError>> {
        self.reads.replicas()
    }

    fn close(&self) -> BoxFuture<()> {
        self.shared.close()
    }
}

impl<R> Drop for Trail<R> {
    fn drop(&mut self) {
        // The writer commits what is queued, then ends (and lets go of its lock: the SQLite lock
        // file, or the PostgreSQL replica's advisory lock).
        self.shared.request_close();
    }
}
