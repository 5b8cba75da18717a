//! The toolwarden audit trail (docs/AUDIT.md): every event of the engine in an SQLite file, committed
//! before a call's backend runs, recovered after a crash, masked and truncated, pruned by age.
//!
//! The key design choice: **one writer thread, many events per transaction.** The engine hands
//! events over without waiting ([`toolwarden_core::AuditStore::append`] only enqueues); the writer
//! takes everything queued, writes it in one transaction and commits, then tells every waiter up to
//! the highest committed `seq` at once (group commit). A call that must not start before its
//! `tool_start` is durable waits for one commit it shares with every other call started meanwhile,
//! so the cost of a commit is spread over all of them. The database is in WAL mode: readers
//! (`GET /v1/audit`, `toolwarden audit`) use their own connections and never block the writer.
//!
//! Everything SQLite-specific sits behind [`toolwarden_core::AuditStore`], implemented once by
//! [`Trail`] — the writer thread and a database's [`Reads`]. The PostgreSQL store ([`PgStore`],
//! `store.url`) is the same handle with PostgreSQL's reads, sharing the writer thread, the
//! redaction and the recovery rules, with its own schema and a replica id on every row.
#![deny(missing_docs)]

mod apply;
mod options;
mod pg;
mod read;
mod recover;
mod redact;
mod schema;
mod trail;
mod writer;

use std::fs::File;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rusqlite::{Connection, OpenFlags};
use toolwarden_core::AuditStore;
use toolwarden_core::StoreReadError;
use toolwarden_core::backend::BoxFuture;
use toolwarden_protocol::{AuditPage, AuditQuery, CallsPage, Timestamp, TurnId, TurnRecord};

pub use options::{
    DEFAULT_FILE, DEFAULT_MAX_PAYLOAD, DEFAULT_QUEUE_CAPACITY, DEFAULT_RETAIN, REPLICA_ENV,
    StoreOptions, default_path, default_replica,
};
pub use pg::{PG_SCHEMA_VERSION, PgReader, PgReads, PgStore, shown_url};
pub use read::RUNNING;
pub use redact::{DEFAULT_MASK_KEYS, MASKED, Redactor};
pub use schema::LATEST as SCHEMA_VERSION;
pub use trail::{Reads, Trail};

/// Why a store could not be opened. Every message names the file.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The directory of the file cannot be created.
    #[error("cannot create the directory {} for the audit trail {}: {source}", dir.display(), path.display())]
    CreateDir {
        /// The file.
        path: PathBuf,
        /// Its directory.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file (or its lock file) cannot be opened or created.
    #[error("cannot open the audit trail {}: {detail}", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// Why.
        detail: String,
    },
    /// Another process writes this store.
    #[error("the audit trail {} is in use by another toolwarden process{}; stop it, run the call through it (`call --url`), or give this one its own [store] path", path.display(), pid.map(|p| format!(" (pid {p})")).unwrap_or_default())]
    InUse {
        /// The file.
        path: PathBuf,
        /// The process holding it, when known.
        pid: Option<u32>,
    },
    /// Not an SQLite database, or a damaged one.
    #[error("{} is not a readable toolwarden audit trail (it is corrupted or not an SQLite database: {detail}); it was left untouched — move it away or set [store] path to another file", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What SQLite said.
        detail: String,
    },
    /// An SQLite database of something else.
    #[error("{} is an SQLite database but not a toolwarden audit trail; it was left untouched — set [store] path to another file", path.display())]
    Foreign {
        /// The file.
        path: PathBuf,
    },
    /// Written by a newer toolwarden.
    #[error("{} was written by a newer toolwarden (audit schema version {found}; this one knows up to {supported}); it was left untouched — use the newer toolwarden, or set [store] path to another file", path.display())]
    Newer {
        /// The file.
        path: PathBuf,
        /// Its schema version.
        found: u32,
        /// The newest this build knows.
        supported: u32,
    },
    /// The PostgreSQL database cannot be reached or used.
    #[error("cannot open the PostgreSQL audit trail at {url}: {detail}")]
    Postgres {
        /// The database's URL, without its password.
        url: String,
        /// Why.
        detail: String,
    },
    /// A PostgreSQL trail written by a newer toolwarden.
    #[error(
        "the PostgreSQL audit trail at {url} was written by a newer toolwarden (audit schema version {found}; this one knows up to {supported}); it was left untouched — use the newer toolwarden, or set [store] url to another database"
    )]
    PostgresNewer {
        /// The database's URL, without its password.
        url: String,
        /// Its schema version.
        found: u32,
        /// The newest this build knows.
        supported: u32,
    },
    /// Another process writes as this replica.
    #[error("replica {replica:?} of the PostgreSQL audit trail at {url} is in use by another toolwarden process; give each replica its own id (${env} or its own config file)", env = options::REPLICA_ENV)]
    ReplicaInUse {
        /// The database's URL, without its password.
        url: String,
        /// The replica id.
        replica: String,
    },
    /// Reading a PostgreSQL trail that does not exist.
    #[error(
        "there is no audit trail in the PostgreSQL database at {url} yet (it is created by the first `toolwarden serve`, `mcp` or `call` that records)"
    )]
    PostgresMissing {
        /// The database's URL, without its password.
        url: String,
    },
    /// Reading a store that does not exist.
    #[error("there is no audit trail at {} yet (it is created by the first `toolwarden serve`, `mcp` or `call` that records)", path.display())]
    Missing {
        /// The file.
        path: PathBuf,
    },
}

fn sqlite_error(path: &Path, e: rusqlite::Error) -> OpenError {
    use rusqlite::ErrorCode;
    match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => OpenError::Corrupt {
            path: path.to_owned(),
            detail: e.to_string(),
        },
        _ => OpenError::Open {
            path: path.to_owned(),
            detail: e.to_string(),
        },
    }
}

fn schema_error(path: &Path, e: schema::SchemaError) -> OpenError {
    match e {
        schema::SchemaError::Newer(found) => OpenError::Newer {
            path: path.to_owned(),
            found,
            supported: schema::LATEST,
        },
        schema::SchemaError::Foreign => OpenError::Foreign {
            path: path.to_owned(),
        },
        schema::SchemaError::Sqlite(e) => sqlite_error(path, e),
    }
}

/// Refuses a file that is not empty and does not start like an SQLite database, before SQLite
/// touches it.
fn check_header(path: &Path) -> Result<(), OpenError> {
    let mut head = [0u8; 16];
    let Ok(mut file) = File::open(path) else {
        return Ok(());
    };
    let n = file.read(&mut head).unwrap_or(0);
    if n == 0 || (n == 16 && head == *b"SQLite format 3\0") {
        return Ok(());
    }
    Err(OpenError::Corrupt {
        path: path.to_owned(),
        detail: "the file does not start with the SQLite header".to_owned(),
    })
}

/// `FILE.lock` beside the database, held for as long as the store writes.
fn lock(path: &Path) -> Result<File, OpenError> {
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    let lock_path = PathBuf::from(name);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_path)
        .map_err(|e| OpenError::Open {
            path: path.to_owned(),
            detail: format!("cannot open its lock file {}: {e}", lock_path.display()),
        })?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut text = String::new();
            let _ = file.read_to_string(&mut text);
            return Err(OpenError::InUse {
                path: path.to_owned(),
                pid: text.trim().parse().ok(),
            });
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(OpenError::Open {
                path: path.to_owned(),
                detail: format!("cannot lock {}: {e}", lock_path.display()),
            });
        }
    }
    let _ = file.set_len(0);
    let _ = writeln!(file, "{}", std::process::id());
    Ok(file)
}

/// Opens a connection with the writer's settings (WAL, commits that survive a process crash).
fn writer_connection(path: &Path) -> Result<Connection, OpenError> {
    let conn = Connection::open(path).map_err(|e| sqlite_error(path, e))?;
    conn.busy_timeout(Duration::from_secs(1))
        .map_err(|e| sqlite_error(path, e))?;
    Ok(conn)
}

fn configure_writer(path: &Path, conn: &Connection) -> Result<(), OpenError> {
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .map_err(|e| sqlite_error(path, e))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(OpenError::Open {
            path: path.to_owned(),
            detail: format!("cannot switch it to WAL mode (it stays in {mode} mode)"),
        });
    }
    // NORMAL in WAL mode: a commit is in the WAL file (the OS has it) when it returns, so it
    // survives the process being killed; only a power loss can take the last commits.
    // Checkpoints run in the writer's commits, every 1,000 pages of WAL (SQLite's default): on
    // this project's machine, a checkpointing thread beside the writer cost more than it saved.
    conn.execute_batch(
        "PRAGMA synchronous = NORMAL; PRAGMA temp_store = MEMORY; PRAGMA cache_size = -16000; \
         PRAGMA journal_size_limit = 67108864;",
    )
    .map_err(|e| sqlite_error(path, e))
}

/// A read-only connection (readers never block the writer). A WAL database nobody has open has
/// no shared-memory file, which a read-only connection cannot make: then the connection is
/// opened for writing but told to write nothing (`query_only`).
fn reader_connection(path: &Path) -> Result<Connection, OpenError> {
    let read_only = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .and_then(|c| {
        c.query_row("SELECT count(*) FROM sqlite_master", [], |_| Ok(()))?;
        Ok(c)
    });
    let conn = match read_only {
        Ok(conn) => conn,
        Err(e) if e.sqlite_error_code() == Some(rusqlite::ErrorCode::CannotOpen) => {
            let conn = Connection::open_with_flags(
                path,
                OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )
            .map_err(|e| sqlite_error(path, e))?;
            conn.pragma_update(None, "query_only", true)
                .map_err(|e| sqlite_error(path, e))?;
            conn
        }
        Err(e) => return Err(sqlite_error(path, e)),
    };
    conn.busy_timeout(Duration::from_secs(5))
        .map_err(|e| sqlite_error(path, e))?;
    Ok(conn)
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
        let lock = lock(&path)?;
        check_header(&path)?;
        let mut conn = writer_connection(&path)?;
        let version = schema::check(&conn).map_err(|e| schema_error(&path, e))?;
        configure_writer(&path, &conn)?;
        schema::migrate(&mut conn, version).map_err(|e| sqlite_error(&path, e))?;
        let redactor = Redactor::new(&options.mask_keys, options.max_payload);
        let interrupted = recover::recover(&mut conn, &redactor, Timestamp::now())
            .map_err(|e| sqlite_error(&path, e))?;
        let last_seq = read::last_seq(&conn).map_err(|e| sqlite_error(&path, e))?;
        if let Some(retain) = options.retain {
            writer::prune(&conn, retain, Timestamp::now()).map_err(|e| sqlite_error(&path, e))?;
        }
        let backend = writer::SqliteWriter {
            conn,
            rows: apply::Rows::default(),
        };
        let shared = writer::start(Box::new(backend), Some(lock), redactor, &options, last_seq)
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
                    None => reader_connection(&path).map_err(|e| StoreReadError(e.to_string()))?,
                };
                let out = f(&conn).map_err(|e| StoreReadError(e.to_string()));
                readers.lock().push(conn);
                out
            };
            match tokio::runtime::Handle::try_current() {
                Ok(handle) => handle
                    .spawn_blocking(run)
                    .await
                    .map_err(|e| StoreReadError(e.to_string()))?,
                Err(_) => run(),
            }
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
    /// Opens the store at `path` read-only; refuses a missing, damaged or newer one.
    pub fn open(path: &Path) -> Result<AuditReader, OpenError> {
        if !path.exists() {
            return Err(OpenError::Missing {
                path: path.to_owned(),
            });
        }
        check_header(path)?;
        let conn = reader_connection(path)?;
        let version = schema::check(&conn).map_err(|e| schema_error(path, e))?;
        if version < schema::LATEST {
            // Written by an older toolwarden, not migrated yet: the next writer migrates it.
            if version == 0 {
                return Err(OpenError::Missing {
                    path: path.to_owned(),
                });
            }
        }
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

/// A store of either kind, opened.
pub struct Opened {
    /// The store.
    pub store: Arc<dyn AuditStore>,
    /// Where it is: the SQLite file, or the PostgreSQL URL (without password) and replica id.
    pub location: String,
    /// How many calls recovery recorded as `interrupted` when it opened.
    pub interrupted: usize,
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
            store: Arc::new(store),
        })
    } else {
        let store = SqliteStore::open(options)?;
        Ok(Opened {
            location: store.path().display().to_string(),
            interrupted: store.interrupted(),
            store: Arc::new(store),
        })
    }
}

/// The trail read-only, for `toolwarden audit`, whichever database holds it.
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
