//! `[redis]` as the crate takes it.

use std::time::Duration;

use toolwarden_protocol::RedisConfig;

/// How to reach Redis.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// `redis://HOST:PORT/DB`.
    pub url: String,
    /// Prepended to every key and channel.
    pub prefix: String,
    /// Longest wait for one operation.
    pub timeout: Duration,
    /// How often the watcher checks that Redis answers (and how soon a returned Redis is used
    /// again).
    pub check_every: Duration,
    /// What the replica's name starts with (its store replica id, `TOOLWARDEN_REPLICA`, when it
    /// has one); a random part made at start follows, so that no two running replicas share
    /// a name.
    pub label: Option<String>,
}

/// The default `prefix`.
pub const DEFAULT_PREFIX: &str = "toolwarden:";
/// The default `timeout`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(250);

/// A `[redis]` table that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OptionsError {
    /// `url` is missing.
    #[error("url is required (e.g. \"redis://127.0.0.1:6379/0\")")]
    NoUrl,
    /// `url` is not a Redis URL.
    #[error("not a Redis URL: {0}")]
    BadUrl(String),
    /// `timeout` is zero.
    #[error("timeout must be more than 0s: every Redis operation needs a bound")]
    ZeroTimeout,
}

impl Options {
    /// Options from `[redis]`.
    pub fn from_config(config: &RedisConfig) -> Result<Self, OptionsError> {
        let url = config.url.clone().ok_or(OptionsError::NoUrl)?;
        redis::Client::open(url.as_str()).map_err(|e| OptionsError::BadUrl(e.to_string()))?;
        let timeout = config.timeout.map_or(DEFAULT_TIMEOUT, |d| d.duration());
        if timeout.is_zero() {
            return Err(OptionsError::ZeroTimeout);
        }
        Ok(Self {
            url,
            prefix: config
                .prefix
                .clone()
                .unwrap_or_else(|| DEFAULT_PREFIX.to_owned()),
            timeout,
            check_every: Duration::from_millis(500),
            label: None,
        })
    }
}
