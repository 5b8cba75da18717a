//! The audit trail in PostgreSQL (`store.url = "postgres://…"`), which several replicas share.
//!
//! It behaves as the SQLite store does — one writer thread with group commit, readers on their
//! own connections, versioned migrations on start, recovery, retention, redaction — with two
//! differences that come from sharing:
//!
//! - **Every row names its replica**, and recovery on start closes only this replica's open
//!   calls; two processes with the same replica id are refused (a session advisory lock, the
//!   counterpart of the SQLite lock file).
//! - **`seq` is per replica**: each replica numbers its own events, continuing after its own
//!   last one, so its `/v1/events` stream and `Last-Event-ID` mean what they mean on one
//!   machine. The trail's order over all replicas is `pos` (commit order), which pages
//!   `GET /v1/audit` and `toolwarden audit --follow`.
//!
//! The client is the synchronous `postgres` crate (tokio-postgres underneath): the writer is a
//! thread of its own, as with SQLite, so a blocking client keeps the two stores' shape the same.
//! A blocking client must not run on the async runtime's threads, so opening, reading and
//! dropping connections happen on threads of their own.

mod connect;
mod liveness;
mod read;
mod recover;
mod schema;
mod tasks;
mod write;

use std::sync::Arc;

use parking_lot::Mutex;
use postgres::Client;
use toolwarden_core::StoreReadError;
use toolwarden_core::backend::BoxFuture;
use toolwarden_protocol::{
    AuditPage, AuditQuery, CallsPage, ReplicaRecord, TaskRecord, Timestamp, TurnId, TurnRecord,
};

use crate::OpenError;
use crate::options::StoreOptions;
use crate::redact::Redactor;
use crate::trail::{Reads, Trail};
use crate::writer::{self, TrailBackend as _};

pub use connect::shown_url;
pub use liveness::{Liveness, OnRejoin, Survivor, Takeover};
pub use schema::LATEST as PG_SCHEMA_VERSION;

use connect::{Connector, describe, off_runtime};

/// How often, and how far apart, opening tries to take this replica's lock.
const LOCK_TRIES: u32 = 20;
const LOCK_RETRY: std::time::Duration = std::time::Duration::from_millis(100);

/// Connections for readers, kept between reads; a connection that failed is dropped.
#[derive(Clone)]
struct Readers {
    connector: Connector,
    idle: Arc<Mutex<Vec<Client>>>,
}

impl Readers {
    /// Runs `f` on an idle connection (or a new one). A kept connection the server dropped
    /// (it restarted, the network went away) shows only when used: then `f` runs once more on
    /// a new connection.
    fn run<T>(&self, mut f: impl FnMut(&mut Client) -> Result<T, String>) -> Result<T, String> {
        let popped = self.idle.lock().pop();
        let kept = popped.is_some();
        let mut client = match popped {
            Some(client) if !client.is_closed() => client,
            _ => self.connector.connect().map_err(|e| describe(&e))?,
        };
        let mut out = f(&mut client);
        if out.is_err() && client.is_closed() && kept {
            client = self.connector.connect().map_err(|e| describe(&e))?;
            out = f(&mut client);
        }
        if !client.is_closed() {
            self.idle.lock().push(client);
        }
        out
    }
}

impl Drop for Readers {
    fn drop(&mut self) {
        if Arc::strong_count(&self.idle) == 1 {
            let idle = std::mem::take(&mut *self.idle.lock());
            if !idle.is_empty() {
                off_runtime(move || drop(idle));
            }
        }
    }
}

/// The PostgreSQL audit trail.
pub type PgStore = Trail<PgReads>;

/// The PostgreSQL trail's reads (this replica's `seq` for events): connections of their own,
/// kept between reads.
pub struct PgReads {
    connector: Connector,
    readers: Readers,
    liveness: Arc<Liveness>,
}

impl std::fmt::Debug for PgReads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgReads")
            .field("url", &self.connector.shown)
            .field("replica", &self.connector.replica)
            .finish_non_exhaustive()
    }
}

impl Trail<PgReads> {
    /// Opens the store at `options.url` as replica `options.replica`: takes the replica's lock,
    /// runs the migrations (refusing a newer schema untouched), records `interrupted` for what
    /// this replica left open, prunes old rows, and starts the writer thread.
    pub fn open(options: StoreOptions) -> Result<PgStore, OpenError> {
        off_runtime(|| Self::open_here(&options))
    }

    fn open_here(options: &StoreOptions) -> Result<PgStore, OpenError> {
        let url = options.url.as_deref().unwrap_or_default();
        let connector = Connector::parse(url, &options.replica)?;
        let mut client = connector.connect().map_err(|e| connector.pg_error(&e))?;
        schema::migrate(&mut client).map_err(|e| connector.schema_error(e))?;
        let mut writer_client = connector.connect().map_err(|e| connector.pg_error(&e))?;
        // A process of this replica that has just stopped frees the lock when the server has
        // seen its connection close: give that a moment.
        let mut locked = false;
        for _ in 0..LOCK_TRIES {
            locked = connector
                .lock_replica(&mut writer_client)
                .map_err(|e| connector.pg_error(&e))?;
            if locked {
                break;
            }
            #[allow(
                clippy::disallowed_methods,
                reason = "open_here runs on a thread of its own (off_runtime): no runtime worker waits"
            )]
            std::thread::sleep(LOCK_RETRY);
        }
        if !locked {
            return Err(OpenError::ReplicaInUse {
                url: connector.shown.clone(),
                replica: connector.replica.clone(),
            });
        }
        let fence =
            liveness::Fence::register(&mut writer_client, &connector.replica, options.lease)
                .map_err(|e| {
                    connector.error(format!("cannot register this replica's lease: {e}"))
                })?;
        let liveness = liveness::Liveness::renewing(connector.clone(), fence.clone())
            .map_err(|e| connector.error(format!("cannot start its lease's thread: {e}")))?;
        let mut writer = write::PgWriter::new(connector.clone(), fence, writer_client)
            .map_err(|e| connector.pg_error(&e))?;
        let redactor = Redactor::new(&options.mask_keys, options.max_payload);
        let now = Timestamp::now();
        let (interrupted, last_seq) =
            recover::recover(&mut client, &mut writer, &connector.replica, &redactor, now)
                .map_err(|e| connector.error(format!("recovery failed: {e}")))?;
        // Expired tasks go whatever `retain` says (zero keeps every other row).
        writer
            .prune(options.retain.unwrap_or_default(), now)
            .map_err(|e| connector.error(format!("pruning failed: {e}")))?;
        let shared = writer::start(Box::new(writer), None, None, redactor, options, last_seq)
            .map_err(|e| connector.error(format!("cannot start its writer thread: {e}")))?;
        liveness
            .start_takeovers(shared.clone())
            .map_err(|e| connector.error(format!("cannot start its takeover thread: {e}")))?;
        Ok(Trail {
            durability: options.durability,
            last_seq,
            interrupted,
            shared,
            reads: PgReads {
                readers: Readers {
                    connector: connector.clone(),
                    idle: Arc::new(Mutex::new(vec![client])),
                },
                connector,
                liveness: Arc::new(liveness),
            },
        })
    }

    /// This replica's lease: give it a survivor (and its name) to take dead replicas over.
    pub fn liveness(&self) -> &Arc<Liveness> {
        &self.reads.liveness
    }

    /// The database's URL, without its password.
    pub fn url(&self) -> &str {
        &self.reads.connector.shown
    }

    /// This process's replica id.
    pub fn replica(&self) -> &str {
        &self.reads.connector.replica
    }
}

impl PgReads {
    fn read<T: Send + 'static>(
        &self,
        f: impl Fn(&mut Client, &str) -> Result<T, String> + Send + 'static,
    ) -> BoxFuture<Result<T, StoreReadError>> {
        let readers = self.readers.clone();
        Box::pin(async move {
            let run = move || {
                let replica = readers.connector.replica.clone();
                readers
                    .run(|client| f(client, &replica))
                    .map_err(StoreReadError)
            };
            crate::trail::read_blocking(run).await
        })
    }
}

impl Reads for PgReads {
    fn events(&self, query: AuditQuery) -> BoxFuture<Result<AuditPage, StoreReadError>> {
        self.read(move |client, replica| read::events(client, replica, &query))
    }

    fn calls(&self, query: AuditQuery) -> BoxFuture<Result<CallsPage, StoreReadError>> {
        self.read(move |client, _| read::calls(client, &query))
    }

    fn turn(&self, turn_id: TurnId) -> BoxFuture<Result<Option<TurnRecord>, StoreReadError>> {
        self.read(move |client, _| read::turn(client, &turn_id))
    }

    fn task(&self, task_id: String) -> BoxFuture<Result<Option<TaskRecord>, StoreReadError>> {
        self.read(move |client, _| tasks::read(client, &task_id))
    }

    fn replicas(&self) -> BoxFuture<Result<Option<Vec<ReplicaRecord>>, StoreReadError>> {
        let read = self.read(liveness::list);
        Box::pin(async move { read.await.map(Some) })
    }
}

/// The PostgreSQL trail read-only, for `toolwarden audit`: every replica's rows.
pub struct PgReader {
    readers: Readers,
}

impl std::fmt::Debug for PgReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgReader")
            .field("url", &self.readers.connector.shown)
            .finish_non_exhaustive()
    }
}

impl PgReader {
    /// Connects to the trail at `url`; refuses a database with no trail or a newer one, and
    /// migrates an older one.
    pub fn open(url: &str) -> Result<PgReader, OpenError> {
        let connector = Connector::parse(url, "")?;
        off_runtime(|| {
            let mut client = connector.connect().map_err(|e| connector.pg_error(&e))?;
            match schema::check(&mut client).map_err(|e| connector.schema_error(e))? {
                0 => Err(OpenError::PostgresMissing {
                    url: connector.shown.clone(),
                }),
                version => {
                    if version < schema::LATEST {
                        // Written by an older toolwarden and not opened by this one since:
                        // migrated here, as a replica starting would.
                        schema::migrate(&mut client).map_err(|e| connector.schema_error(e))?;
                    }
                    Ok(PgReader {
                        readers: Readers {
                            connector: connector.clone(),
                            idle: Arc::new(Mutex::new(vec![client])),
                        },
                    })
                }
            }
        })
    }

    /// The database's URL, without its password.
    pub fn url(&self) -> &str {
        &self.readers.connector.shown
    }

    fn run<T: Send>(
        &self,
        f: impl Fn(&mut Client) -> Result<T, String> + Send + Sync,
    ) -> Result<T, OpenError> {
        off_runtime(|| self.readers.run(f)).map_err(|e| self.readers.connector.error(e))
    }

    /// A page of events over every replica, by position.
    pub fn events(&self, query: &AuditQuery) -> Result<AuditPage, OpenError> {
        self.run(|c| read::events(c, "", query))
    }

    /// A page of calls, newest first.
    pub fn calls(&self, query: &AuditQuery) -> Result<CallsPage, OpenError> {
        self.run(|c| read::calls(c, query))
    }

    /// A turn's record.
    pub fn turn(&self, turn_id: &TurnId) -> Result<Option<TurnRecord>, OpenError> {
        self.run(|c| read::turn(c, turn_id))
    }

    /// The trail's last position (what `after` pages from).
    pub fn last_pos(&self) -> Result<u64, OpenError> {
        self.run(read::last_pos)
    }
}
