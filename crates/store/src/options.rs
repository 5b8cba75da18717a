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
/// The file name in the platform data dir.
pub const DEFAULT_FILE: &str = "toolwarden.db";

/// How to open a store.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// The SQLite file.
    pub path: PathBuf,
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
}

impl StoreOptions {
    /// The defaults for a store at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            durability: StoreDurability::BeforeExecution,
            max_payload: DEFAULT_MAX_PAYLOAD,
            mask_keys: DEFAULT_MASK_KEYS.iter().map(|k| (*k).to_owned()).collect(),
            retain: Some(DEFAULT_RETAIN),
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
        }
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
