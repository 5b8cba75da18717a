//! How to open a store: its file (by default in the platform data dir), durability, payload
//! limits, masked keys, retention and write-queue capacity.

use std::path::PathBuf;
use std::time::Duration;

use toolwarden_protocol::StoreDurability;

use crate::redact::DEFAULT_MASK_KEYS;

/// The default largest stored payload: 64 KiB.
pub const DEFAULT_MAX_PAYLOAD: usize = 64 * 1024;
/// The default age after which rows are pruned: 30 days.
pub const DEFAULT_RETAIN: Duration = Duration::from_secs(30 * 24 * 3600);
/// The default number of queued events past which new calls wait.
pub const DEFAULT_QUEUE_CAPACITY: usize = 8192;
/// The default lease of a replica sharing a PostgreSQL trail: one silent this long is dead.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(5);
/// …or the oldest has waited this long (by default: `StoreOptions::apply_after`).
pub(crate) const APPLY_AFTER: Duration = Duration::from_millis(25);
/// The file name in the platform data dir.
pub const DEFAULT_FILE: &str = "toolwarden.db";

/// How to open a store.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// The SQLite file (unused when `url` names a PostgreSQL database).
    pub path: PathBuf,
    /// A PostgreSQL database (`postgres://…`) instead of the SQLite file.
    pub url: Option<String>,
    /// This process's replica id in a shared PostgreSQL store (see [`default_replica`]).
    pub replica: String,
    /// When a call's `tool_start` must be committed.
    pub durability: StoreDurability,
    /// Payloads longer than this (bytes of JSON) are stored truncated.
    pub max_payload: usize,
    /// Keys whose values are masked (a key containing one of these words, ignoring case).
    pub mask_keys: Vec<String>,
    /// Rows older than this are pruned; `None` keeps everything.
    pub retain: Option<Duration>,
    /// Queued events past which new calls wait.
    pub queue_capacity: usize,
    /// PostgreSQL: how long this replica may go without renewing its lease before the others
    /// declare it dead and record its open calls.
    pub lease: Duration,
    /// SQLite: how long committed events may wait in the pending file before they are moved
    /// into the database (sooner when many are waiting or a read asks for them).
    pub apply_after: Duration,
}

impl StoreOptions {
    /// The defaults for a store at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            url: None,
            replica: default_replica(None),
            durability: StoreDurability::BeforeExecution,
            max_payload: DEFAULT_MAX_PAYLOAD,
            mask_keys: DEFAULT_MASK_KEYS.iter().map(|k| (*k).to_owned()).collect(),
            retain: Some(DEFAULT_RETAIN),
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
            apply_after: APPLY_AFTER,
            lease: DEFAULT_LEASE,
        }
    }
}

impl StoreOptions {
    /// The defaults for a store in the PostgreSQL database at `url`, written as `replica`.
    pub fn postgres(url: impl Into<String>, replica: impl Into<String>) -> Self {
        let mut options = Self::new(PathBuf::new());
        options.url = Some(url.into());
        options.replica = replica.into();
        options
    }
}

/// The environment variable that names this process's replica.
pub const REPLICA_ENV: &str = "TOOLWARDEN_REPLICA";

/// This process's replica id: `$TOOLWARDEN_REPLICA` when set, else the host's name and the
/// config file's absolute path (`host:/etc/toolwarden/toolwarden.toml`; the host alone without a
/// config file). It is the same every time the same replica starts on the same host, and differs
/// between two replicas on one host as long as each has its own config file.
pub fn default_replica(config_file: Option<&std::path::Path>) -> String {
    if let Some(name) = std::env::var(REPLICA_ENV)
        .ok()
        .filter(|v| !v.trim().is_empty())
    {
        return name.trim().to_owned();
    }
    let host = ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .find_map(|f| std::fs::read_to_string(f).ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
        .unwrap_or_else(|| "localhost".to_owned());
    match config_file {
        Some(file) => {
            let file = std::fs::canonicalize(file).unwrap_or_else(|_| file.to_owned());
            format!("{host}:{}", file.display())
        }
        None => host,
    }
}

/// The platform data dir's store: `$XDG_DATA_HOME/toolwarden/toolwarden.db`, else
/// `~/.local/share/toolwarden/toolwarden.db` (macOS: `~/Library/Application Support/toolwarden`).
pub fn default_path() -> Option<PathBuf> {
    let from_env = |var: &str| {
        std::env::var_os(var)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    let base = if cfg!(target_os = "macos") {
        from_env("HOME").map(|h| h.join("Library").join("Application Support"))
    } else {
        from_env("XDG_DATA_HOME")
            .or_else(|| from_env("HOME").map(|h| h.join(".local").join("share")))
    }?;
    Some(base.join("toolwarden").join(DEFAULT_FILE))
}
