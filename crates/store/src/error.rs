//! Why a store could not be opened, and SQLite's errors in those terms.

use std::path::{Path, PathBuf};

use crate::options;

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
    #[error("the audit trail {} is in use by another toolwarden process{}", path.display(), pid.map(|p| format!(" (pid {p})")).unwrap_or_default())]
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

pub(crate) fn sqlite_error(path: &Path, e: rusqlite::Error) -> OpenError {
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
