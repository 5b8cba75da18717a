//! The supervisor: one task per server that starts it, watches it, restarts it and shuts it down.
//!
//! States it reports: `starting` at every start attempt; `up` once the lifecycle
//! (`server/discover` or `initialize`) and `tools/list` succeeded (preceded by a `restarted` event when an earlier instance had been up
//! and went down); `down` with a detail when a start fails, the server exits or is restarted on
//! purpose, and at shutdown; `failed` when a start fails in a way that will not fix itself —
//! the command cannot be run, the process exited before the handshake, a bad definition.
//! Restarts after failures wait a capped exponential backoff; a restart for a stuck call
//! (`on_stuck = "restart"`) happens at once. A failed server is still tried again on the
//! backoff (the command may get installed), but quietly: no `starting` for those attempts, and
//! no new `failed` while it fails the same way.

use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use toolwarden_protocol::ServerStateKind;

use rmcp::model::ProtocolVersion;

use super::listen;
use super::server_core::{RestartRequest, ServerCore};
use super::session::{
    self, Child, ConnEnd, Lifecycle, Protocol, ServerEra, ServerSession, StartError, describe_exit,
};

/// Runs until the server is shut down.
pub(crate) async fn supervise(
    shared: Arc<ServerCore>,
    mut restart_rx: mpsc::UnboundedReceiver<RestartRequest>,
) {
    let endpoint = match &shared.endpoint {
        Ok(endpoint) => endpoint.clone(),
        Err(detail) => {
            // A config problem does not heal by retrying.
            shared.state.send_modify(|s| s.permanent = true);
            shared.set_state(
                ServerStateKind::Failed,
                Some(format!("bad server config: {detail}")),
                None,
            );
            shared.shutdown.cancelled().await;
            shared.state.send_modify(|s| s.shut_down = true);
            shared.set_state(ServerStateKind::Down, Some("shut down".into()), None);
            finish(&shared);
            return;
        }
    };
    let mut generation = 0u64;
    let mut failures = 0u32;
    // Why the next successful start is a restart (`None` until an instance was up).
    let mut restart_cause: Option<String> = None;
    // Why the last start failed, while the server is `failed`: its next tries are quiet.
    let mut failed: Option<String> = None;
    loop {
        if shared.shutdown.is_cancelled() {
            break;
        }
        generation += 1;
        if failed.is_some() {
            shared.state.send_modify(|s| s.starts += 1);
        } else {
            shared.set_state(ServerStateKind::Starting, None, None);
        }
        let mut child: Option<Child> = None;
        let started = tokio::select! {
            r = start(&shared, &endpoint, generation, &mut child) => Some(r),
            _ = shared.shutdown.cancelled() => None,
        };
        let delay_after: Option<String> = match started {
            None => {
                stop_child(child, false).await;
                break;
            }
            Some(Err(error)) => {
                let failure = match error {
                    StartError::Spawn(detail) => Failure {
                        cause: detail.clone(),
                        detail,
                        exited: true,
                    },
                    other => failed_child_detail(child, other.detail()).await,
                };
                if !failure.exited {
                    failed = None;
                    shared.set_state(ServerStateKind::Down, Some(failure.detail.clone()), None);
                } else if failed.as_ref() != Some(&failure.cause) {
                    // A new cause: said once (its stderr may change from one try to the next).
                    failed = Some(failure.cause.clone());
                    shared.set_state(ServerStateKind::Failed, Some(failure.detail.clone()), None);
                }
                Some(failure.detail)
            }
            Some(Ok((session, tools))) => {
                failed = None;
                let conn = session.conn.clone();
                let info = conn.peer.peer_info();
                let reached = match (conn.era, &info) {
                    (ServerEra::Handshake, Some(i)) => i.protocol_version.to_string(),
                    _ => ProtocolVersion::V_2026_07_28.to_string(),
                };
                shared.host.server_protocol(&shared.name, &reached);
                *shared.info.lock() = info.clone();
                shared.publish_tools(tools);
                if let Some(cause) = restart_cause.take() {
                    shared.event(ServerStateKind::Restarted, Some(cause));
                }
                let listens = info
                    .as_ref()
                    .is_some_and(|i| listen::worth_listening(&i.capabilities));
                if conn.era == ServerEra::Stateless && listens {
                    // Its changes come on a `subscriptions/listen` stream (`listen`).
                    shared
                        .tasks
                        .spawn(listen::run(shared.clone(), conn.clone()));
                }
                shared.set_state(ServerStateKind::Up, None, Some(conn));
                let up_since = Instant::now();
                match watch_session(&shared, session, child, &mut restart_rx).await {
                    ConnEnd::Shutdown => break,
                    ConnEnd::Restart(why) => {
                        restart_cause = Some(why);
                        failures = 0;
                        None
                    }
                    ConnEnd::Crashed(detail) | ConnEnd::Lost(detail) => {
                        restart_cause = Some(format!("after it went down: {detail}"));
                        if up_since.elapsed() >= shared.opts.backoff_reset_after {
                            failures = 0;
                        }
                        Some(detail)
                    }
                }
            }
        };
        if delay_after.is_some() {
            let delay = backoff(&shared, failures);
            failures = failures.saturating_add(1);
            tracing::info!(server = %shared.name, ?delay, "restarting MCP server after a delay");
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = shared.shutdown.cancelled() => break,
            }
        }
    }
    shared.state.send_modify(|s| s.shut_down = true);
    shared.set_state(ServerStateKind::Down, Some("shut down".into()), None);
    finish(&shared);
}

fn finish(shared: &ServerCore) {
    shared.finished.send_replace(true);
}

fn backoff(shared: &ServerCore, failures: u32) -> Duration {
    let factor = 2u32.saturating_pow(failures.min(16));
    shared
        .opts
        .restart_backoff_initial
        .saturating_mul(factor)
        .min(shared.opts.restart_backoff_max)
}

/// One start attempt under the start-up timeout, in the server's `protocol`. With `"auto"`,
/// the handshake first (2025-11-25): a server that speaks it — one of both eras too — is
/// reached in the era that loses nothing for handshake clients (subscriptions, requests during
/// a call, logging levels), while stateless clients are served by the gateway's translation.
/// A server that refuses it, or goes away, gets `server/discover` (2026-07-28) on a new
/// connection, in the same attempt: a server of 2026-07-28 alone.
async fn start(
    shared: &ServerCore,
    endpoint: &session::Endpoint,
    generation: u64,
    child: &mut Option<Child>,
) -> Result<(ServerSession, Vec<rmcp::model::Tool>), StartError> {
    let connect = async {
        let lifecycle = match &shared.protocol {
            Protocol::Auto => {
                let handshake = Lifecycle::Handshake(ProtocolVersion::LATEST_WITH_INITIALIZE);
                let first = connect(shared, endpoint, generation, &handshake, child).await;
                // Only a server that refused the handshake (or closed the connection on it, as
                // a server of 2026-07-28 alone may) is tried again in that revision: a timeout or
                // a transport error is no sign of the other era.
                let Err(StartError::Refused(refused)) = first else {
                    return first;
                };
                let refused = failed_child_detail(child.take(), refused).await.detail;
                return match connect(shared, endpoint, generation, &Lifecycle::Discover, child)
                    .await
                {
                    Err(StartError::Refused(again) | StartError::Other(again)) => {
                        Err(StartError::Other(format!("{refused}; then {again}")))
                    }
                    other => other,
                };
            }
            Protocol::Handshake(version) => Lifecycle::Handshake(version.clone()),
            Protocol::Stateless => Lifecycle::Discover,
        };
        connect(shared, endpoint, generation, &lifecycle, child).await
    };
    match shared.startup_timeout {
        None => connect.await,
        Some(limit) => tokio::time::timeout(limit, connect).await.unwrap_or_else(|_| {
            Err(StartError::Other(format!(
                "did not start within {} (startup_timeout: spawn or connect, initialize and tools/list)",
                toolwarden_protocol::format_duration(limit)
            )))
        }),
    }
}

async fn connect(
    shared: &ServerCore,
    endpoint: &session::Endpoint,
    generation: u64,
    lifecycle: &Lifecycle,
    child: &mut Option<Child>,
) -> Result<(ServerSession, Vec<rmcp::model::Tool>), StartError> {
    session::connect(
        endpoint,
        &shared.name,
        generation,
        lifecycle,
        &shared.opts,
        shared.link.clone(),
        child,
    )
    .await
}

/// A failed start.
struct Failure {
    /// What went wrong, with how the process exited and what it said last on stderr.
    detail: String,
    /// The same without the stderr tail (it may change from one try to the next).
    cause: String,
    /// The process exited by itself (or never ran): a server that exits before its handshake
    /// will do so again.
    exited: bool,
}

/// Kills and reaps a child whose start failed, and completes the failure's detail with how it
/// exited and what it said last on stderr.
async fn failed_child_detail(child: Option<Child>, detail: String) -> Failure {
    let Some(mut child) = child else {
        return Failure {
            cause: detail.clone(),
            detail,
            exited: false,
        };
    };
    let exited = tokio::time::timeout(Duration::from_millis(300), child.proc.wait()).await;
    let (exit, by_itself) = match exited {
        Ok(Ok(status)) => {
            child.settle_stderr().await;
            (format!(" (the server {})", describe_exit(status)), true)
        }
        _ => (String::new(), false),
    };
    let note = child.stderr_note();
    stop_child(Some(child), false).await;
    Failure {
        detail: format!("{detail}{exit}{note}"),
        cause: format!("{detail}{exit}"),
        exited: by_itself,
    }
}

/// Kills the child's whole process group and reaps the leader. With `grace`, first waits a
/// moment for it to exit by itself (its stdin was closed).
async fn stop_child(child: Option<Child>, grace: bool) {
    let Some(mut child) = child else { return };
    if grace {
        let _ = tokio::time::timeout(Duration::from_millis(500), child.proc.wait()).await;
    }
    // The group may outlive its leader: kill it in any case.
    let _ = child.proc.kill();
    if tokio::time::timeout(Duration::from_secs(5), child.proc.wait())
        .await
        .is_err()
    {
        tracing::error!(
            pgid = child.proc.pgid(),
            "MCP server did not die after SIGKILL"
        );
    }
}

/// Watches a live session until it ends, serving tool-list refreshes and restart requests, then
/// tears it down. Returns why it ended.
async fn watch_session(
    shared: &Arc<ServerCore>,
    session: ServerSession,
    mut child: Option<Child>,
    restart_rx: &mut mpsc::UnboundedReceiver<RestartRequest>,
) -> ConnEnd {
    let ServerSession { conn, ct, service } = session;
    let mut waiting = pin!(service.waiting());
    // Whether rmcp's service loop already finished (its future must not be polled again).
    let mut loop_done = false;
    let mut pending_restart: Option<RestartRequest> = None;
    // A liveness probe of an HTTP server, after a call hit a transport failure.
    let mut probe: Option<tokio::task::JoinHandle<Result<(), String>>> = None;
    let mut probing = false;
    let end = loop {
        let probed = async {
            match probe.as_mut() {
                Some(handle) => handle.await.unwrap_or_else(|e| Err(e.to_string())),
                None => std::future::pending().await,
            }
        };
        let child_exit = async {
            match child.as_mut() {
                Some(c) => c.proc.wait().await.ok(),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = shared.shutdown.cancelled() => break ConnEnd::Shutdown,
            Some(request) = restart_rx.recv() => {
                if request.generation != conn.generation {
                    // That instance is gone already.
                    let _ = request.done.send(());
                    continue;
                }
                let why = request.reason.clone();
                pending_restart = Some(request);
                break ConnEnd::Restart(why);
            }
            status = child_exit => {
                let exit = status.map_or_else(|| "exited".to_owned(), describe_exit);
                let note = match child.as_mut() {
                    Some(c) => { c.settle_stderr().await; c.stderr_note() }
                    None => String::new(),
                };
                break ConnEnd::Crashed(format!("the server {exit}{note}"));
            }
            _ = &mut waiting => {
                loop_done = true;
                break match child.as_mut() {
                    Some(c) => {
                        // The pipe closed; an exit usually follows at once.
                        match tokio::time::timeout(Duration::from_millis(500), c.proc.wait()).await {
                            Ok(Ok(status)) => {
                                c.settle_stderr().await;
                                ConnEnd::Crashed(format!("the server {}{}", describe_exit(status), c.stderr_note()))
                            }
                            _ => ConnEnd::Crashed(format!("the server closed its stdout{}", c.stderr_note())),
                        }
                    }
                    None => ConnEnd::Lost("the HTTP session ended".into()),
                };
            }
            _ = conn.calls.tools_changed.notified() => {
                tokio::spawn(refresh_tools(shared.clone(), conn.clone()));
            }
            _ = conn.calls.suspect.notified(), if !probing => {
                probing = true;
                probe = Some(tokio::spawn(ping(conn.peer.clone())));
            }
            result = probed => {
                probing = false;
                probe = None;
                if let Err(e) = result {
                    break ConnEnd::Lost(format!("the server stopped answering: {e}"));
                }
            }
        }
    };
    if let Some(probe) = probe {
        probe.abort();
    }
    if end == ConnEnd::Shutdown {
        // Tell the server to stop what it was doing before the connection goes.
        let ids = conn.calls.in_flight();
        let cancels = futures::future::join_all(
            ids.iter()
                .map(|id| conn.send_cancel(id.clone(), "shutdown")),
        );
        let _ = tokio::time::timeout(Duration::from_millis(500), cancels).await;
    }
    // Calls in flight learn why before the process dies (a restart is not a crash), and the
    // state says down before the teardown's waits.
    conn.end_with(end.clone());
    match &end {
        ConnEnd::Shutdown => {}
        ConnEnd::Restart(why) => shared.set_state(
            ServerStateKind::Down,
            Some(format!("restarting: {why}")),
            None,
        ),
        ConnEnd::Crashed(detail) | ConnEnd::Lost(detail) => {
            shared.set_state(ServerStateKind::Down, Some(detail.clone()), None)
        }
    }
    ct.cancel();
    stop_child(child, end == ConnEnd::Shutdown).await;
    if !loop_done
        && tokio::time::timeout(Duration::from_secs(5), &mut waiting)
            .await
            .is_err()
    {
        tracing::warn!(server = %shared.name, "rmcp's service loop did not finish within 5s");
    }
    if let Some(request) = pending_restart {
        let _ = request.done.send(());
    }
    end
}

/// Whether the server still answers a `ping` (within 5 s).
async fn ping(peer: rmcp::service::Peer<rmcp::service::RoleClient>) -> Result<(), String> {
    let request = rmcp::model::ClientRequest::PingRequest(Default::default());
    match tokio::time::timeout(Duration::from_secs(5), peer.send_request(request)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no answer to ping within 5s".into()),
    }
}

/// Re-reads the tool list after `notifications/tools/list_changed`.
async fn refresh_tools(shared: Arc<ServerCore>, conn: Arc<session::Conn>) {
    let limit = shared.startup_timeout.unwrap_or(Duration::from_secs(60));
    match tokio::time::timeout(limit, conn.peer.list_all_tools()).await {
        Ok(Ok(tools)) if conn.end().is_none() => {
            shared.publish_tools(tools);
        }
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            tracing::warn!(server = %shared.name, error = %e, "tools/list after list_changed failed")
        }
        Err(_) => {
            tracing::warn!(server = %shared.name, "tools/list after list_changed timed out")
        }
    }
}
