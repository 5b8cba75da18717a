//! What a backend can be tuned with beyond the config file, and how waiting for it fails: the
//! types a caller of [`McpServer`](super::McpServer) names, kept apart from the machinery.

use std::time::Duration;

/// Default cap of a server's start-up (spawn or connect, `initialize`, `tools/list`).
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(20);

/// Tunables of the backend that the config file does not expose.
#[derive(Clone, Debug)]
pub struct McpOptions {
    /// First delay before restarting a server that crashed or failed to start (default 1 s).
    pub restart_backoff_initial: Duration,
    /// Cap of the restart delay, which doubles per consecutive failure (default 30 s).
    pub restart_backoff_max: Duration,
    /// A server that stayed up this long starts its backoff afresh after a crash (default 60 s).
    pub backoff_reset_after: Duration,
    /// Largest message accepted from a server (default 16 MiB, rmcp's own line limit); a
    /// larger one fails the call it answers.
    pub max_message_bytes: usize,
    /// Tell servers that their client supports sampling, elicitation (form and URL) and roots
    /// (default `true`), so that the [`Gateway`](crate::Gateway) can forward those requests to
    /// its own clients. With no gateway client able to answer, such a request gets a JSON-RPC
    /// error saying so. Set it to `false` for servers that no gateway serves.
    pub forward_client_features: bool,
}

impl Default for McpOptions {
    fn default() -> Self {
        Self {
            restart_backoff_initial: Duration::from_secs(1),
            restart_backoff_max: Duration::from_secs(30),
            backoff_reset_after: Duration::from_secs(60),
            max_message_bytes: 16 * 1024 * 1024,
            forward_client_features: true,
        }
    }
}

/// Why [`McpServer::wait_ready`](super::McpServer::wait_ready) gave up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadyError {
    /// The start-up attempt failed (the server keeps being retried in the background).
    #[error("MCP server {server:?} failed to start: {detail}")]
    Down {
        /// The server.
        server: String,
        /// Why.
        detail: String,
    },
    /// The server was still starting when the wait timed out.
    #[error("MCP server {server:?} was not up within {timeout:?}")]
    Timeout {
        /// The server.
        server: String,
        /// How long was waited.
        timeout: Duration,
    },
    /// The server was shut down.
    #[error("MCP server {server:?} is shut down")]
    ShutDown {
        /// The server.
        server: String,
    },
}
