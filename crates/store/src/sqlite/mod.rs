//! The audit trail in an SQLite file (the default): one process writes it, its commits appended
//! to pending files (`pending.rs`) and moved into the database thousands at a time; readers use
//! connections of their own (WAL mode) and never block the writer.

mod apply;
mod file;
pub(crate) mod pending;
mod read;
mod recover;
mod schema;
mod tasks;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use rusqlite::Connection;
use toolwarden_core::StoreReadError;
use toolwarden_core::backend::BoxFuture;
use toolwarden_protocol::{
    AuditPage, AuditQuery, CallsPage, TaskRecord, Timestamp, TurnId, TurnRecord,
};

use crate::error::{OpenError, sqlite_error};
use crate::options::StoreOptions;
use crate::redact::Redactor;
use crate::trail::{Reads, Trail};

pub use schema::LATEST as SCHEMA_VERSION;

fn schema_error(path: &Path, e: schema::SqliteSchemaError) -> OpenError {
    match e {
        schema::SqliteSchemaError::Newer(found) => OpenError::Newer {
            path: path.to_owned(),
            found,
            supported: schema::LATEST,
        },
        schema::SqliteSchemaError::Foreign => OpenError::Foreign {
            path: path.to_owned(),
        },
        schema::SqliteSchemaError::Sqlite(e) => sqlite_error(path, e),
    }
}

/// The SQLite audit trail.
pub type SqliteStore = Trail<SqliteReads>;

/// The SQLite file's reads: read-only connections of their own, kept between reads.
pub struct SqliteReads {
    path: PathBuf,
    readers: Arc<Mutex<Vec<Connection>>>,
}

impl std::fmt::Debug for SqliteReads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteReads")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Trail<SqliteReads> {
    /// Opens (creating it if needed) the store at `options.path`: takes the writer's lock, checks
    /// the schema (refusing a newer one or a damaged file untouched), runs the migrations,
    /// records `interrupted` for what a dead process left open, prunes old rows, and starts the
    /// writer thread.
    pub fn open(options: StoreOptions) -> Result<SqliteStore, OpenError> {
        let path = options.path.clone();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| OpenError::CreateDir {
                path: path.clone(),
                dir: dir.to_owned(),
                source,
            })?;
        }
        let lock = file::lock(&path)?;
        file::check_header(&path)?;
        let mut conn = file::writer_connection(&path)?;
        let version = schema::check(&conn).map_err(|e| schema_error(&path, e))?;
        file::configure_writer(&path, &conn)?;
        schema::migrate(&mut conn, version).map_err(|e| sqlite_error(&path, e))?;
        let pending_paths = pending::paths_for(&path);
        replay_pending(&path, &pending_paths, &mut conn)?;
        let redactor = Redactor::new(&options.mask_keys, options.max_payload);
        let interrupted = recover::recover(&mut conn, &redactor, Timestamp::now())
            .map_err(|e| sqlite_error(&path, e))?;
        let last_seq = read::last_seq(&conn).map_err(|e| sqlite_error(&path, e))?;
        // Expired tasks go whatever `retain` says (zero keeps every other row).
        let retain = options.retain.unwrap_or_default();
        writer::prune(&conn, retain, Timestamp::now()).map_err(|e| sqlite_error(&path, e))?;
        let log =
            pending::PendingLog::open(pending_paths.clone()).map_err(|e| OpenError::Open {
                path: path.clone(),
                detail: format!(
                    "cannot open its pending files {} and {}: {e}",
                    pending_paths[0].display(),
                    pending_paths[1].display()
                ),
            })?;
        let log = Arc::new(Mutex::new(log));
        let backend = writer::SqliteWriter {
            conn,
            rows: apply::Rows::default(),
            log: log.clone(),
            sealed: None,
        };
        let shared = crate::writer::start(
            Box::new(backend),
            Some(log),
            Some(lock),
            redactor,
            &options,
            last_seq,
        )
        .map_err(|e| OpenError::Open {
            path: path.clone(),
            detail: format!("cannot start its writer thread: {e}"),
        })?;
        Ok(Trail {
            durability: options.durability,
            last_seq,
            interrupted,
            shared,
            reads: SqliteReads {
                path,
                readers: Arc::default(),
            },
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.reads.path
    }
}

/// Moves what a dead process left in the pending files into the database — the file whose
/// records come first, first (one was being moved into the database while commits went to the
/// other) — then empties them.
fn replay_pending(
    path: &Path,
    pending_paths: &[PathBuf; 2],
    conn: &mut Connection,
) -> Result<(), OpenError> {
    let mut left = Vec::new();
    for pending_path in pending_paths {
        let bytes = pending::read_left(pending_path).map_err(|e| OpenError::Open {
            path: path.to_owned(),
            detail: format!("cannot read {}: {e}", pending_path.display()),
        })?;
        if !bytes.is_empty() {
            left.push((pending_path, bytes));
        }
    }
    left.sort_by_key(|(_, bytes)| {
        pending::Records::new(bytes)
            .next()
            .map_or(u64::MAX, |(fact, _)| fact.seq)
    });
    for (pending_path, bytes) in left {
        replay_file(path, pending_path, &bytes, conn)?;
    }
    Ok(())
}

/// Moves one pending file's records into the database (those the database already has, by
/// `seq`, are skipped), then empties the file. A damaged file's readable records are moved and
/// the file is kept as `….damaged`, with a warning; nothing is deleted.
fn replay_file(
    path: &Path,
    pending_path: &Path,
    bytes: &[u8],
    conn: &mut Connection,
) -> Result<(), OpenError> {
    let last = read::last_seq(conn).map_err(|e| sqlite_error(path, e))?;
    let mut records = pending::Records::new(bytes);
    let tx = conn.transaction().map_err(|e| sqlite_error(path, e))?;
    let mut rows = apply::Rows::default();
    let mut writes = apply::Writes::new(&tx);
    let batch: Vec<(apply::Fact<'_>, &str)> = records
        .by_ref()
        .filter(|(fact, _)| fact.seq > last)
        .collect();
    apply::apply_batch(&mut writes, &mut rows, &batch).map_err(|e| sqlite_error(path, e))?;
    let moved = batch.len();
    drop(writes);
    tx.commit().map_err(|e| sqlite_error(path, e))?;
    if let Some(pending::EarlyEnd::Damaged { at, why }) = records.stop() {
        let kept = pending::damaged_path(pending_path);
        std::fs::rename(pending_path, &kept).map_err(|e| OpenError::Corrupt {
            path: path.to_owned(),
            detail: format!(
                "{} is damaged at byte {at} ({why}) and cannot be set aside as {}: {e}",
                pending_path.display(),
                kept.display()
            ),
        })?;
        tracing::warn!(
            file = %pending_path.display(),
            kept = %kept.display(),
            byte = at,
            "the audit trail's pending file is damaged ({why}): the {moved} events before that byte were recovered, the file is kept"
        );
    } else {
        if moved > 0 {
            tracing::info!(
                events = moved,
                file = %pending_path.display(),
                "recovered the events a stopped process had committed to the audit trail's pending file"
            );
        }
        std::fs::write(pending_path, b"").map_err(|e| OpenError::Open {
            path: path.to_owned(),
            detail: format!("cannot empty {}: {e}", pending_path.display()),
        })?;
    }
    Ok(())
}

/// Takes an older trail at `path` (schema `version`) to this build's schema, under the writer's
/// lock: a writer running now (an older toolwarden's) is named in the error.
fn migrate_older(path: &Path, version: u32) -> Result<(), OpenError> {
    let lock = file::lock(path)?;
    let mut conn = file::writer_connection(path)?;
    schema::migrate(&mut conn, version).map_err(|e| sqlite_error(path, e))?;
    drop(conn);
    drop(lock);
    Ok(())
}

/// For a reader: when no process writes the store and one that did left events in its pending
/// file, moves them into the database (as the next writer would) so that they can be read. A
/// running writer moves them itself within moments.
fn settle_pending(path: &Path) {
    let pending_paths = pending::paths_for(path);
    if pending_paths
        .iter()
        .all(|p| std::fs::metadata(p).map_or(true, |m| m.len() == 0))
    {
        return;
    }
    let lock = match file::lock(path) {
        Ok(lock) => lock,
        Err(OpenError::InUse { .. }) => return,
        Err(e) => {
            tracing::warn!(error = %e, file = %pending_paths[0].display(), "the events in the audit trail's pending files are read once toolwarden next opens the store");
            return;
        }
    };
    let settled = file::writer_connection(path)
        .and_then(|mut conn| replay_pending(path, &pending_paths, &mut conn));
    if let Err(e) = settled {
        tracing::warn!(error = %e, file = %pending_paths[0].display(), "the events in the audit trail's pending files are read once toolwarden next opens the store");
    }
    drop(lock);
}

impl SqliteReads {
    fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> BoxFuture<Result<T, StoreReadError>> {
        let readers = self.readers.clone();
        let path = self.path.clone();
        Box::pin(async move {
            let run = move || {
                let conn = match readers.lock().pop() {
                    Some(conn) => conn,
                    None => {
                        file::reader_connection(&path).map_err(|e| StoreReadError(e.to_string()))?
                    }
                };
                let out = f(&conn).map_err(|e| StoreReadError(e.to_string()));
                readers.lock().push(conn);
                out
            };
            crate::trail::read_blocking(run).await
        })
    }
}

impl Reads for SqliteReads {
    fn events(&self, query: AuditQuery) -> BoxFuture<Result<AuditPage, StoreReadError>> {
        self.read(move |conn| read::events(conn, &query))
    }

    fn calls(&self, query: AuditQuery) -> BoxFuture<Result<CallsPage, StoreReadError>> {
        self.read(move |conn| read::calls(conn, &query))
    }

    fn turn(&self, turn_id: TurnId) -> BoxFuture<Result<Option<TurnRecord>, StoreReadError>> {
        self.read(move |conn| read::turn(conn, &turn_id))
    }

    fn task(&self, task_id: String) -> BoxFuture<Result<Option<TaskRecord>, StoreReadError>> {
        self.read(move |conn| tasks::read(conn, &task_id))
    }
}

/// The trail read-only, for `toolwarden audit`: works whether or not a process writes it.
pub struct AuditReader {
    path: PathBuf,
    conn: Connection,
}

impl std::fmt::Debug for AuditReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditReader")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl AuditReader {
    /// Opens the store at `path` read-only; refuses a missing, damaged or newer one, and
    /// migrates an older one (unless a writer has it open).
    pub fn open(path: &Path) -> Result<AuditReader, OpenError> {
        if !path.exists() {
            return Err(OpenError::Missing {
                path: path.to_owned(),
            });
        }
        file::check_header(path)?;
        let conn = file::reader_connection(path)?;
        let version = schema::check(&conn).map_err(|e| schema_error(path, e))?;
        if version == 0 {
            return Err(OpenError::Missing {
                path: path.to_owned(),
            });
        }
        if version < schema::LATEST {
            // Written by an older toolwarden and not opened by this one since: migrated here
            // (the migrations add tables and columns, they rewrite no row), unless a writer
            // holds the file.
            migrate_older(path, version)?;
        }
        settle_pending(path);
        Ok(AuditReader {
            path: path.to_owned(),
            conn,
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn err(&self, e: rusqlite::Error) -> OpenError {
        sqlite_error(&self.path, e)
    }

    /// A page of events, ascending `seq`.
    pub fn events(&self, query: &AuditQuery) -> Result<AuditPage, OpenError> {
        read::events(&self.conn, query).map_err(|e| self.err(e))
    }

    /// A page of calls, newest first.
    pub fn calls(&self, query: &AuditQuery) -> Result<CallsPage, OpenError> {
        read::calls(&self.conn, query).map_err(|e| self.err(e))
    }

    /// A turn's record.
    pub fn turn(&self, turn_id: &TurnId) -> Result<Option<TurnRecord>, OpenError> {
        read::turn(&self.conn, turn_id).map_err(|e| self.err(e))
    }

    /// The highest `seq` stored.
    pub fn last_seq(&self) -> Result<u64, OpenError> {
        read::last_seq(&self.conn).map_err(|e| self.err(e))
    }
}
