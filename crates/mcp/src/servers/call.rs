//! One attempt of a `tools/call`, following the stop contract of `toolwarden_core::backend`.
//!
//! 1. Wait for the server to be up: while it starts or restarts, at most its `startup_timeout`
//!    (a server down for good, or past that wait, fails with a transport error).
//! 2. Send the request and register it (its progress token routes progress to the heartbeat).
//!    A 2026-07-28 server may answer `input_required`: its input requests are asked of the
//!    client across the link (`input`), and the call is sent again with the answers, as a new
//!    request; at most `input::MAX_ROUNDS` times.
//! 3. Wait for the answer, a bad frame naming it, the connection's end — or the cancel.
//! 4. On cancel: send `notifications/cancelled` for this request with the reason, and keep
//!    listening. An answer before the forced stop is a late answer (reported with
//!    `late_result`); the work is over: `Cooperative`.
//! 5. On the forced stop: if nothing arrived for the request since its cancel (after a short
//!    settling window for messages that crossed the cancel on the wire), the server honoured
//!    it: `Cooperative`. Otherwise it is stuck and `on_stuck` decides: `Abandoned` (a watcher
//!    keeps the request counted until its late answer or the server's exit) or, for a stdio
//!    server, `Restarted` (its process group is killed and the server started again).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rmcp::ServiceError;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, ClientRequest, GetMeta as _, RequestMetaObject,
    ServerJsonRpcMessage, ServerResult,
};
use rmcp::service::PeerRequestOptions;
use tokio::sync::oneshot;
use tokio::time::Instant;
use toolwarden_core::{Attempt, AttemptEnd, AttemptError, AttemptMeta};
use toolwarden_protocol::{OnStuck, StopHow};

use super::call_table::Registration;
use super::convert::{arguments, service_error, tool_output};
use super::frame::DirectAnswer;
use super::input;
use super::server_core::{RestartRequest, ServerCore};
use super::session::{Conn, ConnEnd};
use super::task;

/// How long an attempt whose request failed with a closed transport waits to learn why the
/// connection ended (the supervisor needs a moment to see the exit status).
const END_REASON_WAIT: Duration = Duration::from_secs(3);

/// A request's answer; `None` when its connection closed first.
type RequestAnswer = Option<Result<ServerResult, ServiceError>>;

/// Where a request's answer comes from.
enum Receiver {
    /// rmcp's service loop.
    Rmcp(oneshot::Receiver<Result<ServerResult, ServiceError>>),
    /// The frame guard, for a request sent past rmcp (see `frame`).
    Direct(DirectAnswer),
}

impl Future for Receiver {
    type Output = RequestAnswer;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<RequestAnswer> {
        match self.get_mut() {
            Receiver::Rmcp(rx) => Pin::new(rx).poll(cx).map(Result::ok),
            Receiver::Direct(rx) => Pin::new(rx).poll(cx).map(|answer| {
                answer.map(|message| match message {
                    ServerJsonRpcMessage::Response(response) => Ok(response.result),
                    ServerJsonRpcMessage::Error(error) => Err(ServiceError::McpError(error.error)),
                    // The guard hands over answers only.
                    _ => Err(ServiceError::UnexpectedResponse),
                })
            }),
        }
    }
}

/// Puts the attempt's trace context in the request's `_meta.traceparent` (rmcp adds its
/// `progressToken` beside it, keeping the other keys).
fn add_trace_context(params: &mut CallToolRequestParams, meta: &AttemptMeta) {
    if let Some(tp) = meta.traceparent {
        params
            .meta
            .get_or_insert_with(RequestMetaObject::new)
            .0
            .set_traceparent(tp.to_string());
    }
}

/// A `tools/call`'s parameters for `tool` with `input` as its arguments and the attempt's trace
/// context in `_meta`.
fn call_params(
    tool: &str,
    input: &serde_json::Value,
    meta: &AttemptMeta,
) -> Result<CallToolRequestParams, AttemptError> {
    let mut params = CallToolRequestParams::new(tool.to_owned());
    if let Some(args) = arguments(input)? {
        params = params.with_arguments(args);
    }
    add_trace_context(&mut params, meta);
    Ok(params)
}

/// Runs one attempt to its end.
pub(super) async fn run(shared: Arc<ServerCore>, attempt: Attempt) -> AttemptEnd {
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
    // Rounds: a 2026-07-28 server may answer `input_required`; the call is then sent again
    // with the client's answers, as a new request. Each round's request is made from the
    // input and moved into the send: a call of one round converts its arguments once.
    let mut rounds = 0;
    let mut answers = None;
    let (reg, mut rx) = loop {
        let mut params = match call_params(&tool, &input, &meta) {
            Ok(params) => params,
            Err(e) => return AttemptEnd::Done(Err(e)),
        };
        if let Some(retry) = answers.take() {
            let input::Retry {
                responses,
                request_state,
            } = retry;
            params.input_responses = responses;
            params.request_state = request_state;
        }
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let (reg, mut rx) = match send(&conn, request, &heartbeat).await {
            Ok(sent) => sent,
            Err(e) => return AttemptEnd::Done(Err(request_failed(&conn, &shared, &e).await)),
        };
        let call = reg.call.clone();
        let asked = tokio::select! {
            biased;
            error = call.failed() => return AttemptEnd::Done(Err(error)),
            answer = &mut rx => match answer {
                Some(Ok(ServerResult::InputRequiredResult(asked))) => asked,
                Some(Ok(ServerResult::CreateTaskResult(created))) => {
                    // The registration stays: progress for the request still beats.
                    let attempt = TaskAttempt { shared: &shared, conn: &conn, meta: &meta,
                        tool: &tool, on_stuck, stop: &stop, heartbeat: &heartbeat };
                    return attempt.follow(created.task).await;
                }
                answer => return AttemptEnd::Done(answered(&conn, &shared, answer).await),
            },
            end = conn.ended() => return AttemptEnd::Done(Err(end_error(&shared, end))),
            _ = stop.cancelled() => break (reg, rx),
        };
        drop(reg);
        rounds += 1;
        if rounds > input::MAX_ROUNDS {
            return AttemptEnd::Done(Err(AttemptError::Transport(format!(
                "MCP server {:?} still asked for input after {} rounds",
                shared.name,
                input::MAX_ROUNDS
            ))));
        }
        // Nothing runs on the server while its client is asked: a cancel ends it here.
        let retry = tokio::select! {
            biased;
            _ = stop.cancelled() => return AttemptEnd::Stopped(StopHow::Cooperative),
            retry = input::fulfil(&shared.link, &shared.name, asked) => retry,
        };
        match retry {
            Ok(retry) => {
                heartbeat.beat();
                answers = Some(retry);
            }
            Err(e) => return AttemptEnd::Done(Err(e)),
        }
    };
    let call = reg.call.clone();

    // Cancelled: tell the server, keep listening.
    let cancelled_at = Instant::now();
    call.mark_cancelled(cancelled_at);
    let reason = stop
        .reason()
        .map(|r| r.as_str())
        .unwrap_or("cancelled")
        .to_owned();
    if conn.cancel_closes_stream() {
        // Streamable HTTP from 2026-07-28 on: closing the request's stream is the cancel, and
        // nothing more can arrive for it, so there is nothing to wait for.
        conn.send_cancel(call.id.clone(), &reason).await;
        return AttemptEnd::Stopped(StopHow::Cooperative);
    }
    let canceller = conn.clone();
    let id = call.id.clone();
    let cancel = async move { canceller.send_cancel(id, &reason).await };
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

/// An attempt answered with a task (see `task`).
struct TaskAttempt<'a> {
    shared: &'a Arc<ServerCore>,
    conn: &'a Arc<Conn>,
    meta: &'a AttemptMeta,
    tool: &'a Arc<str>,
    on_stuck: OnStuck,
    stop: &'a toolwarden_core::StopSignals,
    heartbeat: &'a toolwarden_core::Heartbeat,
}

impl TaskAttempt<'_> {
    async fn follow(self, created: rmcp::model::Task) -> AttemptEnd {
        let id = created.task_id.clone();
        let asker = task::Asker {
            link: &self.shared.link,
            server: &self.shared.name,
        };
        let followed = tokio::select! {
            biased;
            end = self.conn.ended() => return match self.stop.reason() {
                Some(_) => stopped_by_end(self.conn).await,
                None => AttemptEnd::Done(Err(end_error(self.shared, end))),
            },
            followed = task::follow(&self.conn.peer, asker, created, self.stop, self.heartbeat)
                => followed,
        };
        match followed {
            task::Followed::Done(result) => AttemptEnd::Done(result),
            task::Followed::Stopped { late, since } => {
                if let Some(is_error) = late {
                    report_late(self.shared, self.meta, self.tool, is_error, since);
                }
                AttemptEnd::Stopped(StopHow::Cooperative)
            }
            task::Followed::Stuck => {
                tracing::warn!(server = %self.shared.name, tool = %self.tool,
                    call = %self.meta.call_id, task = %id, on_stuck = ?self.on_stuck,
                    "the server's task ignored tasks/cancel past the grace period");
                if self.on_stuck == OnStuck::Restart && self.conn.stdio {
                    let reason = format!(
                        "tool {:?} (call {}) kept running its task past the grace period",
                        self.tool, self.meta.call_id
                    );
                    restart(self.shared, self.conn, reason).await;
                    return AttemptEnd::Stopped(StopHow::Restarted);
                }
                abandon_task(self.shared.clone(), self.conn.clone(), id);
                AttemptEnd::Stopped(StopHow::Abandoned)
            }
        }
    }
}

/// How long an abandoned task of a server is watched, at most: past it, it is no longer
/// counted (and no longer polled), whatever the server says of it.
const WATCH_ABANDONED_TASK: Duration = Duration::from_secs(3600);

/// Keeps a stuck task counted as abandoned until it reaches a final status, the server forgets
/// it, the connection ends, or [`WATCH_ABANDONED_TASK`] has passed.
fn abandon_task(shared: Arc<ServerCore>, conn: Arc<Conn>, id: String) {
    shared.add_abandoned(1);
    let watcher = shared.clone();
    shared.tasks.spawn(async move {
        let give_up = tokio::time::sleep(WATCH_ABANDONED_TASK);
        tokio::pin!(give_up);
        loop {
            tokio::select! {
                _ = conn.ended() => break,
                () = &mut give_up => {
                    tracing::warn!(server = %watcher.name, task = %id,
                        "an abandoned task still runs after an hour: no longer watched");
                    break;
                }
                _ = tokio::time::sleep(task::DEFAULT_POLL_INTERVAL) => {}
            }
            match task::TaskServer::get(&conn.peer, &id).await {
                Ok(got) if !got.task.status().is_terminal() => {}
                _ => break,
            }
        }
        watcher.add_abandoned(-1);
    });
}

/// Queues `request` and registers it so that no progress can overtake the registration: past
/// rmcp, registered before it is queued; through rmcp (which picks the progress token as it
/// queues it), under the send lock (see `call_table`).
async fn send(
    conn: &Conn,
    mut request: ClientRequest,
    heartbeat: &toolwarden_core::Heartbeat,
) -> Result<(Registration, Receiver), ServiceError> {
    if let Some(direct) = &conn.direct {
        let (id, token) = direct.next_id();
        request.get_meta_mut().set_progress_token(token.clone());
        let reg = conn.calls.register(id.clone(), token, heartbeat.clone());
        return match direct.send(id, request).await {
            Ok(answer) => Ok((reg, Receiver::Direct(answer))),
            Err(e) => {
                tracing::debug!(server = %conn.calls.server, error = %e,
                    "sending a call to the server failed");
                Err(ServiceError::TransportClosed)
            }
        };
    }
    let _queued = conn.calls.send_lock.lock().await;
    let handle = conn
        .peer
        .send_request_with_option(request, PeerRequestOptions::no_options())
        .await?;
    let reg = conn.calls.register(
        handle.id.clone(),
        handle.progress_token.clone(),
        heartbeat.clone(),
    );
    Ok((reg, Receiver::Rmcp(handle.rx)))
}

/// The outcome of an answer that arrived before any stop.
async fn answered(
    conn: &Conn,
    shared: &ServerCore,
    answer: RequestAnswer,
) -> Result<toolwarden_core::ToolOutput, AttemptError> {
    match answer {
        Some(Ok(result)) => tool_output(result),
        Some(Err(e)) => Err(request_failed(conn, shared, &e).await),
        None => Err(closed_error(conn, shared).await),
    }
}

/// A request that failed without an answer: a closed connection is classified by why it
/// ended; anything else by the error itself.
async fn request_failed(conn: &Conn, shared: &ServerCore, e: &ServiceError) -> AttemptError {
    if !conn.stdio
        && matches!(
            e,
            ServiceError::TransportSend(_) | ServiceError::TransportClosed
        )
    {
        // An HTTP server has no process to watch: have the supervisor check it is alive.
        conn.calls.suspect.notify_one();
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

async fn closed_error(conn: &Conn, shared: &ServerCore) -> AttemptError {
    if !conn.stdio {
        conn.calls.suspect.notify_one();
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

fn end_error(shared: &ServerCore, end: ConnEnd) -> AttemptError {
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
fn late_answer(answer: RequestAnswer) -> Option<bool> {
    match answer {
        Some(Ok(result)) => Some(tool_output(result).map_or(true, |o| o.is_error)),
        Some(Err(ServiceError::McpError(_))) => Some(true),
        Some(Err(_)) | None => None,
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

fn report_late(
    shared: &ServerCore,
    meta: &AttemptMeta,
    tool: &str,
    is_error: bool,
    since: Instant,
) {
    shared
        .host
        .late_result(meta, tool, is_error, since.elapsed());
}

/// Asks the supervisor to kill and restart the server; returns once the old group is dead.
async fn restart(shared: &ServerCore, conn: &Conn, reason: String) {
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
    shared: Arc<ServerCore>,
    conn: Arc<Conn>,
    reg: Registration,
    rx: Receiver,
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
