//! Calls for a server that is starting or restarting wait for it. Right after start, a server's
//! tools are not listed yet: a call that names one (by its `SERVER__` prefix, or any call when
//! tools are not prefixed) waits — within the server's `startup_timeout`, and the call's own
//! deadline hint when it gave one — until the server lists the tool (the call runs), comes up
//! without it (`invalid`, unknown tool), stays down past the wait (`error{transport}`: nothing
//! ran, it may be retried), or is found unable to start (`failed`: the call ends at once).
//!
//! The tool's configured `timeout` does not bound the wait: like every deadline of a call it
//! counts from the call's first attempt. A server whose first start takes minutes (compiled or
//! downloaded on first use) is given its `startup_timeout` for that, and a call made meanwhile
//! runs once it is up.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, sleep_until};
use toolwarden_protocol::{Policy, ServerStateKind, format_duration};

use crate::cancel::CancelScope;
use crate::registry::{Registry, ToolEntry};
use crate::servers::{AwaitedServer, Servers};
use crate::text::cannot_start;

/// A call's tool whose server is not up yet.
pub(crate) struct PendingTool {
    pub(crate) name: String,
    pub(crate) server: AwaitedServer,
    /// The tool's policy from the config alone (the server has not described the tool yet).
    pub(crate) policy: Policy,
    pub(crate) registry: Arc<Registry>,
    pub(crate) servers: Arc<Servers>,
}

/// How the wait for a pending tool ended.
pub(crate) enum Resolved {
    /// The server listed it.
    Tool(Arc<ToolEntry>),
    /// The server is up and does not list it; the suggestion names close tools.
    Unknown(Option<String>),
    /// The server did not come up in time, or cannot start.
    Down(String),
    /// The call was cancelled while it waited.
    Cancelled,
}

impl PendingTool {
    /// Waits for the server, at most its `startup_timeout` and `hint` (the call's own deadline
    /// hint, `0` = none), from `arrived`.
    pub(crate) async fn resolve(
        &self,
        scope: &CancelScope,
        arrived: Instant,
        hint: Option<Duration>,
    ) -> Resolved {
        // A server without a `startup_timeout` is still waited for no longer than the tool may
        // run (its `timeout`, else its `max_timeout`): nothing waits forever.
        let fallback = [self.policy.timeout, self.policy.max_timeout]
            .into_iter()
            .find(|d| !d.is_zero());
        let limits = [
            hint.filter(|h| !h.is_zero()),
            self.server.startup_timeout.or(fallback),
        ];
        let wait = limits.into_iter().flatten().min();
        let deadline = wait.map(|w| arrived + w);
        let mut tools = self.registry.subscribe();
        let mut servers = self.servers.watch();
        loop {
            tools.mark_unchanged();
            servers.mark_unchanged();
            if let Some(entry) = self.registry.get(&self.name) {
                return Resolved::Tool(entry);
            }
            let status = self.servers.status(&self.server.name);
            match status.as_ref().map(|s| s.state) {
                Some(ServerStateKind::Up) => {
                    return Resolved::Unknown(self.registry.suggest(&self.name));
                }
                Some(ServerStateKind::Failed) => {
                    let why = status.and_then(|s| s.detail).unwrap_or_default();
                    return Resolved::Down(cannot_start(&self.server.name, &why));
                }
                _ => {}
            }
            tokio::select! {
                biased;
                () = scope.cancelled() => return Resolved::Cancelled,
                _ = tools.changed() => {}
                _ = servers.changed() => {}
                () = sleep_until_opt(deadline) => {
                    let why = status
                        .and_then(|s| s.detail)
                        .map(|d| format!(": {d}"))
                        .unwrap_or_default();
                    return Resolved::Down(format!(
                        "MCP server {:?} was not up within {}{why}",
                        self.server.name,
                        wait.map_or_else(|| "the call's deadline".to_owned(), format_duration),
                    ));
                }
            }
        }
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => sleep_until(at).await,
        None => std::future::pending().await,
    }
}
