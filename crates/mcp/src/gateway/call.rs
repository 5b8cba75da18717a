//! One `tools/call`: a one-call turn in the client's session.
//!
//! The handler task of the request drives everything the call needs from the client side:
//!
//! - the engine's progress reports become `notifications/progress` under the client's own
//!   token, with a `progress` that only grows; nothing is relayed once the result is in;
//! - requests raised during the call (an approval, a server's sampling request) are sent from
//!   here, so that over Streamable HTTP they ride this call's response stream;
//! - the client's `notifications/cancelled` (`ctx.ct`) aborts the call (`user`); its response
//!   stream closing, or its session ending, aborts it as `client_disconnect`.

use std::sync::Arc;

use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use rmcp::ErrorData;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ProgressNotificationParam, ProgressToken, RequestId,
    RequestMetaObject,
};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use toolwarden_core::{CallProgress, Engine, TurnRequest};
use toolwarden_protocol::{
    CallId, CallResult, CancelReason, Principal, ProgressInfo, Scope, ToolCall, TraceParent, TurnId,
};

use super::channel::ClientChannel;
use super::options::STATUS_TOOL;
use super::session::{ClientCall, ClientSession, Job};
use super::state::GatewayState;
use super::{convert, status, upstream};

/// The request a `tools/call` came in, and the way back to its client.
pub(crate) struct CallContext {
    /// The JSON-RPC id of the request (the call's id).
    pub(crate) id: RequestId,
    /// The request's `_meta`.
    pub(crate) meta: RequestMetaObject,
    /// Where progress and the call's own requests to the client go.
    pub(crate) channel: Arc<dyn ClientChannel>,
    /// rmcp's cancellation of the request's handler (its client's `notifications/cancelled`,
    /// its closed response stream for a stateless HTTP request, or the connection's end); the
    /// gateway's own calls are stopped through the session.
    pub(crate) ct: CancellationToken,
    /// How the request reached its session.
    pub(crate) door: Door,
    /// A stateless client that declared the tasks extension: its call may become a task
    /// (`super::rounds`).
    pub(crate) tasks: bool,
}

impl CallContext {
    /// The context of a `tools/call` that came as request `id` with `meta`, answered through
    /// `channel`, by a client that reached its session through `door`: every door, era and task
    /// mode makes its call's context here. Its cancel (`ct`) is its own until the door gives it
    /// another; no tasks declared until it says so.
    pub(crate) fn new(
        id: RequestId,
        meta: RequestMetaObject,
        channel: Arc<dyn ClientChannel>,
        door: Door,
    ) -> Self {
        Self {
            id,
            meta,
            channel,
            ct: CancellationToken::new(),
            door,
            tasks: false,
        }
    }
}

/// How a request reached the session it runs in, which says why its client stopped waiting
/// when `ct` fires.
#[derive(Clone)]
pub(crate) enum Door {
    /// Through its connection, whose own session it runs in (handshake clients; stateless
    /// clients on stdio that name no session): `ct` is the client's cancel, else the
    /// connection's end.
    Connection,
    /// A stateless request on stdio, in the session it named: the connection (this session)
    /// ending ends the call too.
    Joined(Arc<ClientSession>),
    /// A stateless request over Streamable HTTP: `ct` fires when its response stream closes
    /// (the revision's cancel), or at the server's shutdown (this token).
    Stream(CancellationToken),
    /// A stateless request that may become a task (`super::tasks`): the door it came through,
    /// and the id its turn takes, chosen before it starts so that the task can name it.
    Task(Box<Door>, TurnId),
}

impl Door {
    /// Why the client stopped waiting, when `ct` fired, for a call in `session`.
    fn cancel_reason(&self, session: &ClientSession) -> CancelReason {
        match self.inner() {
            Door::Connection => session.cancel_reason(),
            Door::Joined(connection) => connection.cancel_reason(),
            Door::Stream(shutdown) if shutdown.is_cancelled() => CancelReason::Shutdown,
            Door::Stream(_) | Door::Task(..) => CancelReason::ClientDisconnect,
        }
    }

    /// The door the request came through.
    fn inner(&self) -> &Door {
        match self {
            Door::Task(inner, _) => inner,
            door => door,
        }
    }

    /// Resolves with the reason when the connection of a joined request ends.
    async fn connection_ended(&self) -> CancelReason {
        match self.inner() {
            Door::Joined(connection) => {
                connection.ended().await;
                connection
                    .end_reason()
                    .unwrap_or(CancelReason::ClientDisconnect)
            }
            _ => std::future::pending().await,
        }
    }
}

/// Over Streamable HTTP, a `traceparent` header is the trace context of a request whose
/// `_meta` has none (`_meta.traceparent` wins: it is the request's own).
pub(crate) fn trace_from_header(headers: &http::HeaderMap, meta: &mut RequestMetaObject) {
    if meta.0.get_traceparent().is_some() {
        return;
    }
    const TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");
    let mut values = headers.get_all(TRACEPARENT).iter();
    // Two `traceparent` headers are no valid context.
    if let (Some(value), None) = (values.next(), values.next())
        && let Ok(value) = value.to_str()
    {
        meta.0.set_traceparent(value);
    }
}

/// The JSON-RPC error of a request its principal lacks a scope for (HTTP answers 403).
pub(crate) fn forbidden(principal: &Principal, scope: Scope, to: &str) -> ErrorData {
    ErrorData::new(
        FORBIDDEN,
        format!(
            "forbidden: principal {:?} lacks scope `{scope}`, which it needs to {to}",
            principal.name
        ),
        Some(serde_json::json!({"toolwarden/missing_scope": scope.as_str()})),
    )
}

/// Refuses a request that has a server do work (read a resource, get a prompt, complete an
/// argument, subscribe) unless the session's principal holds `call`: `read` lists what the
/// servers offer, it does not use it.
pub(crate) fn needs_call(session: &ClientSession, to: &str) -> Result<(), ErrorData> {
    if session.principal.may(Scope::Call) {
        Ok(())
    } else {
        Err(forbidden(&session.principal, Scope::Call, to))
    }
}

/// The JSON-RPC error code of a request its principal lacks a scope for.
pub(crate) const FORBIDDEN: rmcp::model::ErrorCode = rmcp::model::ErrorCode(-32003);

/// A `tools/call`'s result, as the engine gave it (or the gateway's own status).
pub(crate) enum CallEnd {
    Governed(Arc<CallResult>),
    Status(CallToolResult),
}

impl CallEnd {
    /// As MCP's `CallToolResult`.
    pub(crate) fn into_result(self) -> CallToolResult {
        match self {
            CallEnd::Governed(result) => convert::call_result(&result),
            CallEnd::Status(result) => result,
        }
    }
}

/// Runs one `tools/call` to its result.
pub(crate) async fn call_tool(
    gw: &Arc<GatewayState>,
    session: &Arc<ClientSession>,
    params: CallToolRequestParams,
    ctx: CallContext,
) -> Result<CallToolResult, ErrorData> {
    answer_call(gw, session, params, ctx)
        .await
        .map(CallEnd::into_result)
}

/// Runs one `tools/call` to its result, as the engine gives it: for a door that writes the
/// answer itself (`super::dispatch`), straight from it.
pub(crate) async fn answer_call(
    gw: &Arc<GatewayState>,
    session: &Arc<ClientSession>,
    params: CallToolRequestParams,
    ctx: CallContext,
) -> Result<CallEnd, ErrorData> {
    if !session.principal.may(Scope::Call) {
        return Err(forbidden(&session.principal, Scope::Call, "call tools"));
    }
    if params.name == STATUS_TOOL {
        return Ok(CallEnd::Status(status::result(&gw.engine, &session.key())));
    }
    if session.is_ended() {
        return Err(ErrorData::internal_error("the MCP session has ended", None));
    }
    let call_id = ctx.id.to_string();
    let input = Value::Object(params.arguments.unwrap_or_default());
    let mut call = ToolCall::new(call_id.as_str(), params.name.to_string(), input);
    call.timeout_ms = hint_ms(&ctx.meta, &["timeout_ms", "toolwarden/timeout_ms"]);
    call.idle_timeout_ms = hint_ms(&ctx.meta, &["toolwarden/idle_timeout_ms"]);

    let token = ctx.meta.get_progress_token();
    let (progress_tx, mut progress_rx) = mpsc::unbounded_channel::<ProgressInfo>();
    let progress: Option<CallProgress> = token.as_ref().map(|_| {
        Arc::new(move |_: &CallId, info: &ProgressInfo| {
            let _ = progress_tx.send(info.clone());
        }) as CallProgress
    });
    // The turn runs right here, in this request's handler task; its id is chosen now so that a
    // cancel can abort it by id while it runs.
    let turn_id = match &ctx.door {
        Door::Task(_, turn_id) => turn_id.clone(),
        _ => Engine::new_turn_id(),
    };
    let request = TurnRequest {
        principal: session.principal.clone(),
        session_id: Some(session.id.clone()),
        turn_id: Some(turn_id.clone()),
        calls: vec![call],
        progress,
        traceparent: ctx.meta.0.get_traceparent().and_then(TraceParent::parse),
        ..TurnRequest::default()
    };
    // Registered before the turn starts: an approval may be asked at once, and goes through
    // this handler.
    let server = gw.backend_of(&params.name);
    let (jobs_tx, mut jobs_rx) = mpsc::unbounded_channel::<Job>();
    let seq = gw.next_seq();
    // A connection's ids are its own; the requests of a stateless session come from many
    // clients, whose ids may meet: there, the call is known by its turn.
    let slot = match ctx.door {
        Door::Connection => call_id.clone(),
        _ => turn_id.to_string(),
    };
    session.add_call(
        &slot,
        ClientCall {
            server: server.clone(),
            seq,
            jobs: jobs_tx,
        },
    );
    let _registered = Registered {
        session,
        call_id: &slot,
    };
    if let Some(server) = &server {
        upstream::note_client(gw, server, session);
    }
    let open = session.request_started_as(match ctx.door {
        Door::Connection => ctx.id.to_string(),
        _ => slot.clone(),
    });
    let stop = &open.stop;
    let mut relay = token.map(Relay::new);
    let mut outbound = FuturesUnordered::new();
    let mut aborted = false;
    let finish = gw.engine.run_turn(request);
    tokio::pin!(finish);
    let output = loop {
        tokio::select! {
            biased;
            output = &mut finish => {
                // Reports that came before the result still go out, before it.
                while let Ok(info) = progress_rx.try_recv() {
                    if let Some(relay) = relay.as_mut() {
                        let _ = ctx.channel.notify_progress(relay.next(&info)).await;
                    }
                }
                break output;
            }
            Some(info) = progress_rx.recv() => {
                if let Some(relay) = relay.as_mut() {
                    let param = relay.next(&info);
                    if let Err(e) = ctx.channel.notify_progress(param).await {
                        tracing::debug!(session = %session.id, error = %e, "relaying progress failed");
                    }
                }
            }
            Some(job) = jobs_rx.recv() => outbound.push(job(ctx.channel.clone())),
            Some(()) = outbound.next(), if !outbound.is_empty() => {}
            _ = ctx.ct.cancelled(), if !aborted => {
                aborted = true;
                // rmcp fires this on the client's notifications/cancelled, and when the
                // connection's loop ends (its session ended, or the server shuts down).
                abort(gw, &turn_id, &call_id, ctx.door.cancel_reason(session));
            }
            reason = ctx.door.connection_ended(), if !aborted => {
                aborted = true;
                abort(gw, &turn_id, &call_id, reason);
            }
            reason = stop.stopped(), if !aborted => {
                aborted = true;
                abort(gw, &turn_id, &call_id, session.end_reason().unwrap_or(reason));
            }
        }
    };
    let output = output
        .map_err(|e| ErrorData::invalid_params(format!("the call was refused: {e}"), None))?;
    let result = output.results.first().cloned();
    drop(outbound);
    match result {
        Some(result) => Ok(CallEnd::Governed(result)),
        None => Err(ErrorData::internal_error(
            "the engine returned no result for the call",
            None,
        )),
    }
}

fn abort(gw: &GatewayState, turn_id: &TurnId, call_id: &str, reason: CancelReason) {
    tracing::debug!(%turn_id, call_id, reason = reason.as_str(), "aborting a gateway call");
    // NotFound: it already has its outcome.
    let _ = gw
        .engine
        .abort_call(turn_id, &CallId::from(call_id), reason);
}

/// Unregisters a call however the handler ends.
struct Registered<'a> {
    session: &'a ClientSession,
    call_id: &'a str,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.session.remove_call(self.call_id);
    }
}

/// A per-call hint in `_meta`, in milliseconds (a non-negative number; fractions are cut).
pub(crate) fn hint_ms(meta: &RequestMetaObject, keys: &[&str]) -> Option<u64> {
    keys.iter().find_map(|key| match meta.get(*key)? {
        Value::Number(n) => n
            .as_u64()
            .or_else(|| n.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64)),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    })
}

/// Relays a call's progress under the client's token with a `progress` that only grows.
pub(crate) struct Relay {
    token: ProgressToken,
    last: Option<f64>,
}

impl Relay {
    pub(crate) fn new(token: ProgressToken) -> Self {
        Self { token, last: None }
    }

    /// The notification for a progress report. A report without a number (e.g. a line of
    /// `exec` output), or one that does not exceed the last value sent (a retry starting
    /// over), is sent as the last value + 1; `total` is dropped when it no longer holds.
    pub(crate) fn next(&mut self, info: &ProgressInfo) -> ProgressNotificationParam {
        let value = match (info.progress, self.last) {
            (Some(p), None) if p.is_finite() => p,
            (Some(p), Some(last)) if p.is_finite() && p > last => p,
            (_, last) => last.unwrap_or(0.0) + 1.0,
        };
        self.last = Some(value);
        let mut param = ProgressNotificationParam::new(self.token.clone(), value);
        if let Some(total) = info.total.filter(|t| *t >= value) {
            param = param.with_total(total);
        }
        if let Some(message) = &info.message {
            param = param.with_message(message.clone());
        }
        param
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use rmcp::model::NumberOrString;

    fn info(progress: Option<f64>, total: Option<f64>, message: Option<&str>) -> ProgressInfo {
        ProgressInfo {
            progress,
            total,
            message: message.map(str::to_owned),
        }
    }

    fn check(reports: &[ProgressInfo], expected: &[(f64, Option<f64>)]) {
        let mut relay = Relay::new(ProgressToken(NumberOrString::String("t".into())));
        let sent: Vec<(f64, Option<f64>)> = reports
            .iter()
            .map(|r| {
                let p = relay.next(r);
                (p.progress, p.total)
            })
            .collect();
        assert_eq!(sent, expected);
    }

    #[test]
    fn progress_only_grows() {
        // Backend numbers pass through.
        check(
            &[
                info(Some(1.0), Some(3.0), None),
                info(Some(2.0), Some(3.0), None),
            ],
            &[(1.0, Some(3.0)), (2.0, Some(3.0))],
        );
        // Reports without a number are counted.
        check(
            &[info(None, None, Some("a")), info(None, None, Some("b"))],
            &[(1.0, None), (2.0, None)],
        );
        // A retry starting over keeps growing, and drops a total it passed.
        check(
            &[
                info(Some(2.0), Some(3.0), None),
                info(Some(1.0), Some(3.0), None),
                info(Some(1.5), Some(3.0), None),
                info(Some(2.0), Some(3.0), None),
            ],
            &[(2.0, Some(3.0)), (3.0, Some(3.0)), (4.0, None), (5.0, None)],
        );
    }

    #[test]
    fn hints_come_from_meta() {
        let mut meta = RequestMetaObject::new();
        assert_eq!(hint_ms(&meta, &["timeout_ms"]), None);
        meta.insert("toolwarden/timeout_ms".into(), serde_json::json!(250));
        assert_eq!(
            hint_ms(&meta, &["timeout_ms", "toolwarden/timeout_ms"]),
            Some(250)
        );
        meta.insert("timeout_ms".into(), serde_json::json!(99.9));
        assert_eq!(
            hint_ms(&meta, &["timeout_ms", "toolwarden/timeout_ms"]),
            Some(99)
        );
        meta.insert("timeout_ms".into(), serde_json::json!(-1));
        assert_eq!(hint_ms(&meta, &["timeout_ms"]), None);
    }
}
