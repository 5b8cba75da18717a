//! The toolwarden audit trail (docs/AUDIT.md): every event of the engine, committed before a
//! call's backend runs, recovered after a crash, masked and truncated, pruned by age — in an
//! SQLite file by default (`sqlite/`), or in PostgreSQL, which several replicas share (`pg/`).
//! This root is a facade: what both databases share sits beside it, each database in its folder.
//!
//! The key design choice: **one writer thread, many events per commit.** The engine hands events
//! over without waiting ([`toolwarden_core::AuditStore::append`] only enqueues); the writer takes
//! everything queued and commits it, then tells every waiter up to the highest committed `seq` at
//! once (group commit). A call that must not start before its `tool_start` is durable waits for
//! one commit it shares with every other call started meanwhile. With SQLite a commit is one append
//! to the pending file (`sqlite/pending.rs`); its events reach the database thousands at a time,
//! in one transaction, moments later or as soon as a read asks for them.
//!
//! Both databases sit behind [`toolwarden_core::AuditStore`], implemented once by [`Trail`] — the
//! writer thread and a database's [`Reads`]. The PostgreSQL store ([`PgStore`], `store.url`) is
//! the same handle with PostgreSQL's reads, sharing the writer thread, the redaction and the
//! recovery rules, with its own schema, a replica id on every row, and the replicas' leases.
#![deny(missing_docs)]

mod error;
mod options;
mod pg;
mod recover;
mod redact;
mod sqlite;
mod trail;
mod writer;

use std::sync::Arc;

use toolwarden_core::AuditStore;
use toolwarden_protocol::{AuditPage, AuditQuery, CallsPage};

pub use error::OpenError;
pub use options::{
    DEFAULT_FILE, DEFAULT_LEASE, DEFAULT_MAX_PAYLOAD, DEFAULT_QUEUE_CAPACITY, DEFAULT_RETAIN,
    REPLICA_ENV, StoreOptions, default_path, default_replica,
};
pub use pg::{
    Liveness, OnRejoin, PG_SCHEMA_VERSION, PgReader, PgReads, PgStore, Survivor, Takeover,
    shown_url,
};
pub use redact::{DEFAULT_MASK_KEYS, MASKED, Redactor};
pub use sqlite::{AuditReader, SCHEMA_VERSION, SqliteReads, SqliteStore};
pub use trail::{RUNNING, Reads, Trail};

/// A store of either kind, opened.
pub struct Opened {
    /// The store.
    pub store: Arc<dyn AuditStore>,
    /// Where it is: the SQLite file, or the PostgreSQL URL (without password) and replica id.
    pub location: String,
    /// How many calls recovery recorded as `interrupted` when it opened.
    pub interrupted: usize,
    /// A PostgreSQL trail's lease of this replica.
    pub liveness: Option<Arc<Liveness>>,
}

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opened")
            .field("location", &self.location)
            .finish_non_exhaustive()
    }
}

/// Opens the store `options` name: PostgreSQL when `options.url` is set, else the SQLite file.
pub fn open(options: StoreOptions) -> Result<Opened, OpenError> {
    if options.url.is_some() {
        let store = PgStore::open(options)?;
        Ok(Opened {
            location: format!("{} (replica {:?})", store.url(), store.replica()),
            interrupted: store.interrupted(),
            liveness: Some(store.liveness().clone()),
            store: Arc::new(store),
        })
    } else {
        let store = SqliteStore::open(options)?;
        Ok(Opened {
            location: store.path().display().to_string(),
            interrupted: store.interrupted(),
            liveness: None,
            store: Arc::new(store),
        })
    }
}

/// The trail read-only, for `toolwarden audit`, whichever database holds it.
// One per command, never moved in a hot loop: its size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum TrailReader {
    /// An SQLite file.
    Sqlite(AuditReader),
    /// A PostgreSQL database.
    Postgres(PgReader),
}

impl TrailReader {
    /// Opens the trail `options` name, read-only.
    pub fn open(options: &StoreOptions) -> Result<TrailReader, OpenError> {
        match &options.url {
            Some(url) => PgReader::open(url).map(TrailReader::Postgres),
            None => AuditReader::open(&options.path).map(TrailReader::Sqlite),
        }
    }

    /// A page of calls, newest first.
    pub fn calls(&self, query: &AuditQuery) -> Result<CallsPage, OpenError> {
        match self {
            TrailReader::Sqlite(r) => r.calls(query),
            TrailReader::Postgres(r) => r.calls(query),
        }
    }

    /// A page of events, in the trail's order.
    pub fn events(&self, query: &AuditQuery) -> Result<AuditPage, OpenError> {
        match self {
            TrailReader::Sqlite(r) => r.events(query),
            TrailReader::Postgres(r) => r.events(query),
        }
    }

    /// Where the trail ends now: the cursor `after` goes on from.
    pub fn head(&self) -> Result<u64, OpenError> {
        match self {
            TrailReader::Sqlite(r) => r.last_seq(),
            TrailReader::Postgres(r) => r.last_pos(),
        }
    }
}

/// Checks a trail written before principals, migrated when read: its call, its event and its
/// turn `t_old` are `local`'s, and `alice` has none of them.
#[cfg(test)]
pub(crate) fn assert_reads_as_local(reader: &TrailReader) {
    let query = |principal: &str| AuditQuery {
        principal: Some(principal.into()),
        ..AuditQuery::default()
    };
    let calls = reader.calls(&query("local")).unwrap().calls;
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].principal, "local");
    assert_eq!(reader.events(&query("local")).unwrap().events.len(), 1);
    let turn = match reader {
        TrailReader::Sqlite(r) => r.turn(&"t_old".into()),
        TrailReader::Postgres(r) => r.turn(&"t_old".into()),
    };
    assert_eq!(turn.unwrap().unwrap().principal, "local");
    assert!(reader.calls(&query("alice")).unwrap().calls.is_empty());
    assert!(reader.events(&query("alice")).unwrap().events.is_empty());
}
