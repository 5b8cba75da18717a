//! One attempt of a `tools/call`, following the stop contract of `toolwarden_core::backend`.
//!
//! 1. Wait for the server to be up: while it starts or restarts, at most its `startup_timeout`
//!    (a server down for good, or past that wait, fails with a transport error).
//! 2. Send the request and register it (its progress token routes progress to the heartbeat).
//! 3. Wait for the answer, a bad frame naming it, the connection's end — or the cancel.
//! 4. On cancel: send `notifications/cancelled` for this request with the reason, and keep
//!    listening. An answer before the forced stop is a late answer (reported with
//!    `late_result`); the work is over: `Cooperative`.
//! 5. On the forced stop: if nothing arrived for the request since its cancel (after a short
//!    settling window for messages that crossed the cancel on the wire), the server honoured
//!    it: `Cooperative`. Otherwise it is stuck and `on_stuck` decides: `Abandoned` (a watcher
//!    keeps the request counted until its late answer or the server's exit) or, for a stdio
//!    server, `Restarted` (its process group is killed and the server started again).

use std::sync::Arc;
use std::time::Duration;

use rmcp::ServiceError;
use rmcp::model::{CallToolRequest, CallToolRequestParams, ClientRequest, ServerResult};
use rmcp::service::PeerRequestOptions;
use tokio::sync::oneshot;
use tokio::time::Instant;
use toolwarden_core::{Attempt, AttemptEnd, AttemptError, AttemptMeta};
use toolwarden_protocol::{OnStuck, StopHow};

use super::convert::{arguments, service_error, tool_output};
use super::router::Registration;
use super::session::{Conn, ConnEnd, send_cancel};
use super::shared::{RestartRequest, Shared};

/// How long an attempt whose request failed with a closed transport waits to learn why the
/// connection ended (the supervisor needs a moment to see the exit status).
const END_REASON_WAIT: Duration = Duration::from_secs(3);

type Answer = Result<Result<ServerResult, ServiceError>, oneshot::error::RecvError>;

/// Runs one attempt to its end.
pub(super) async fn run(shared: Arc<Shared>, attempt: Attempt) -> AttemptEnd {
    let Attempt {
        tool,
        input,
        meta,
        stop,
        heartbeat,
        on_stuck,
        ..
    } = attempt;
    let conn = tokio::select! {
        biased;
        _ = stop.cancelled() => return AttemptEnd::Stopped(StopHow::Cooperative),
        conn = shared.ready_conn() => match conn {
            Ok(conn) => conn,
            Err(e) => return AttemptEnd::Done(Err(e)),
        },
    };
    let args = match arguments(&input) {
        Ok(args) => args,
        Err(e) => return AttemptEnd::Done(Err(e)),
    };
    let mut params = CallToolRequestParams::new(tool.to_string());
    if let Some(args) = args {
        params = params.with_arguments(args);
    }
    let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
    // Queue and register under the send lock, so that no progress can overtake the
    // registration (see `router`).
    let (reg, mut rx) = {
        let _queued = conn.router.send_lock.lock().await;
        match conn
            .peer
            .send_request_with_option(request, PeerRequestOptions::no_options())
            .await
        {
            Ok(handle) => {
                let reg = conn.router.register(
                    handle.id.clone(),
                    handle.progress_token.clone(),
                    heartbeat.clone(),
                );
                (reg, handle.rx)
            }
            Err(e) => return AttemptEnd::Done(Err(request_failed(&conn, &shared, &e).await)),
        }
    };
    let call = reg.call.clone();
    tokio::select! {
        biased;
        error = call.failed() => return AttemptEnd::Done(Err(error)),
        answer = &mut rx => return AttemptEnd::Done(answered(&conn, &shared, answer).await),
        end = conn.ended() => return AttemptEnd::Done(Err(end_error(&shared, end))),
        _ = stop.cancelled() => {}
    }

    // Cancelled: tell the server, keep listening.
    let cancelled_at = Instant::now();
    call.mark_cancelled(cancelled_at);
    let reason = stop
        .reason()
        .map(|r| r.as_str())
        .unwrap_or("cancelled")
        .to_owned();
    let peer = conn.peer.clone();
    let cancel = send_cancel(&peer, call.id.clone(), &reason);
    let mut cancel = std::pin::pin!(cancel);
    let mut cancel_sent = false;
    loop {
        tokio::select! {
            biased;
            _ = call.failed() => {
                // It answered, if badly: its work is over.
                report_late(&shared, &meta, &tool, true, cancelled_at);
                return AttemptEnd::Stopped(StopHow::Cooperative);
            }
            answer = &mut rx => {
                return match late_answer(answer) {
                    Some(is_error) => {
                        report_late(&shared, &meta, &tool, is_error, cancelled_at);
                        AttemptEnd::Stopped(StopHow::Cooperative)
                    }
                    None => stopped_by_end(&conn).await,
                };
            }
            _ = conn.ended() => return stopped_by_end(&conn).await,
            _ = stop.forced() => break,
            _ = &mut cancel, if !cancel_sent => cancel_sent = true,
        }
    }

    // Forced: was it quiet since the cancel?
    let now = Instant::now();
    let settle =
        ((now - cancelled_at) / 4).clamp(Duration::from_millis(50), Duration::from_millis(500));
    let stuck = call
        .active_after_cancel()
        .is_some_and(|t| t > cancelled_at + settle);
    if !stuck {
        return AttemptEnd::Stopped(StopHow::Cooperative);
    }
    tracing::warn!(server = %shared.name, tool = %tool, call = %meta.call_id, id = %call.id,
        ?on_stuck, "the server ignored a cancel past the grace period");
    if on_stuck == OnStuck::Restart && conn.stdio {
        let reason = format!(
            "tool {tool:?} (call {}) ignored its cancel past the grace period",
            meta.call_id
        );
        restart(&shared, &conn, reason).await;
        return AttemptEnd::Stopped(StopHow::Restarted);
    }
    abandon(shared, conn, reg, rx, meta, tool, cancelled_at);
    AttemptEnd::Stopped(StopHow::Abandoned)
}

/// The outcome of an answer that arrived before any stop.
async fn answered(
    conn: &Conn,
    shared: &Shared,
    answer: Answer,
) -> Result<toolwarden_core::ToolOutput, AttemptError> {
    match answer {
        Ok(Ok(result)) => tool_output(result),
        Ok(Err(e)) => Err(request_failed(conn, shared, &e).await),
        Err(_) => Err(closed_error(conn, shared).await),
    }
}

/// A request that failed without an answer: a closed connection is classified by why it
/// ended; anything else by the error itself.
async fn request_failed(conn: &Conn, shared: &Shared, e: &ServiceError) -> AttemptError {
    if !conn.stdio
        && matches!(
            e,
            ServiceError::TransportSend(_) | ServiceError::TransportClosed
        )
    {
        // An HTTP server has no process to watch: have the supervisor check it is alive.
        conn.router.suspect.notify_one();
    }
    match e {
        ServiceError::TransportClosed => closed_error(conn, shared).await,
        ServiceError::TransportSend(_) if conn.stdio => {
            // A write to a stdio server fails when it died: say so if we learn it in time.
            match tokio::time::timeout(Duration::from_millis(500), conn.ended()).await {
                Ok(end) => end_error(shared, end),
                Err(_) => service_error(e),
            }
        }
        other => service_error(other),
    }
}

async fn closed_error(conn: &Conn, shared: &Shared) -> AttemptError {
    if !conn.stdio {
        conn.router.suspect.notify_one();
    }
    match tokio::time::timeout(END_REASON_WAIT, conn.ended()).await {
        Ok(end) => end_error(shared, end),
        Err(_) if conn.stdio => AttemptError::Crashed(format!(
            "MCP server {:?} closed the connection",
            shared.name
        )),
        Err(_) => AttemptError::Transport(format!(
            "MCP server {:?}: the response stream closed before the answer",
            shared.name
        )),
    }
}

fn end_error(shared: &Shared, end: ConnEnd) -> AttemptError {
    match end {
        ConnEnd::Crashed(detail) => {
            AttemptError::Crashed(format!("MCP server {:?}: {detail}", shared.name))
        }
        ConnEnd::Restart(why) => AttemptError::ServerRestart(format!(
            "MCP server {:?} was restarted: {why}",
            shared.name
        )),
        ConnEnd::Shutdown => {
            AttemptError::Transport(format!("MCP server {:?} is shutting down", shared.name))
        }
        ConnEnd::Lost(detail) => {
            AttemptError::Transport(format!("MCP server {:?}: {detail}", shared.name))
        }
    }
}

/// `Some(is_error)` when the answer came from the server, `None` when the connection closed.
fn late_answer(answer: Answer) -> Option<bool> {
    match answer {
        Ok(Ok(result)) => Some(tool_output(result).map_or(true, |o| o.is_error)),
        Ok(Err(ServiceError::McpError(_))) => Some(true),
        Ok(Err(_)) | Err(_) => None,
    }
}

/// How a cancelled attempt ended when its connection went away before the forced stop.
async fn stopped_by_end(conn: &Conn) -> AttemptEnd {
    let end = tokio::time::timeout(END_REASON_WAIT, conn.ended()).await;
    AttemptEnd::Stopped(match end {
        // We restarted the server (for another stuck call): that stopped this one too.
        Ok(ConnEnd::Restart(_)) => StopHow::Restarted,
        // Shutdown kills the process group.
        Ok(ConnEnd::Shutdown) => StopHow::Killed,
        // The server exited on its own while stopping: its work is over.
        Ok(ConnEnd::Crashed(_)) => StopHow::Cooperative,
        // The HTTP session was lost: nobody can say whether the remote work stopped.
        Ok(ConnEnd::Lost(_)) | Err(_) => StopHow::Abandoned,
    })
}

fn report_late(shared: &Shared, meta: &AttemptMeta, tool: &str, is_error: bool, since: Instant) {
    shared
        .host
        .late_result(meta, tool, is_error, since.elapsed());
}

/// Asks the supervisor to kill and restart the server; returns once the old group is dead.
async fn restart(shared: &Shared, conn: &Conn, reason: String) {
    let (done, killed) = oneshot::channel();
    let request = RestartRequest {
        generation: conn.generation,
        reason,
        done,
    };
    if shared.restart_tx.send(request).is_ok() {
        // Bounded: the supervisor answers after SIGKILL and reaping, or drops the request.
        let _ = tokio::time::timeout(Duration::from_secs(10), killed).await;
    }
}

/// Stops waiting for a stuck request but keeps it counted until its late answer arrives or its
/// connection ends.
fn abandon(
    shared: Arc<Shared>,
    conn: Arc<Conn>,
    reg: Registration,
    rx: oneshot::Receiver<Result<ServerResult, ServiceError>>,
    meta: AttemptMeta,
    tool: Arc<str>,
    cancelled_at: Instant,
) {
    shared.add_abandoned(1);
    let watcher = shared.clone();
    shared.tasks.spawn(async move {
        let call = reg.call.clone();
        let late = tokio::select! {
            answer = rx => late_answer(answer),
            _ = call.failed() => Some(true),
            _ = conn.ended() => None,
        };
        if let Some(is_error) = late {
            report_late(&watcher, &meta, &tool, is_error, cancelled_at);
        }
        drop(reg);
        watcher.add_abandoned(-1);
    });
}
