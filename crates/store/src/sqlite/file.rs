//! The SQLite file: its header check, its lock, and the connections of the writer and the
//! readers.

use std::fs::File;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use crate::error::{OpenError, sqlite_error};

/// Refuses a file that is not empty and does not start like an SQLite database, before SQLite
/// touches it.
pub(crate) fn check_header(path: &Path) -> Result<(), OpenError> {
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
pub(crate) fn lock(path: &Path) -> Result<File, OpenError> {
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
pub(crate) fn writer_connection(path: &Path) -> Result<Connection, OpenError> {
    let conn = Connection::open(path).map_err(|e| sqlite_error(path, e))?;
    conn.busy_timeout(Duration::from_secs(1))
        .map_err(|e| sqlite_error(path, e))?;
    Ok(conn)
}

pub(crate) fn configure_writer(path: &Path, conn: &Connection) -> Result<(), OpenError> {
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
pub(crate) fn reader_connection(path: &Path) -> Result<Connection, OpenError> {
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
