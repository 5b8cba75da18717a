//! One dispatch for every POST at `/mcp`: the message is read once (`super::incoming`), and
//! sent to the handler of its method — the gateway's own for what it answers itself, rmcp's
//! `StreamableHttpService` for everything else.
//!
//! The gateway answers itself:
//!
//! - a `tools/call` of a handshake session (`Mcp-Session-Id`), with `params.task` too when the
//!   session declared the 2025-11-25 tasks (`super::handshake_tasks`);
//! - a stateless (2026-07-28) `tools/call`: `Mcp-Protocol-Version: 2026-07-28`, `Mcp-Method:
//!   tools/call` and `Mcp-Name` equal to the tool, each once; its `_meta` carries the envelope
//!   (and no other key of the protocol's own); a tool whose schema maps no argument to a header.
//!   A new call, or the next round of one that asked something (`inputResponses`,
//!   `requestState`), through `super::rounds`;
//! - a client's answer to a request the gateway sent on a call's response;
//! - `tools/list` and the `tasks/*` requests of a session that declared the 2025-11-25 tasks.
//!
//! A call runs on the request's own task, with the same code as under rmcp
//! (`super::call::call_tool`), and its answer goes back as one `application/json` body when
//! nothing else has to go first (`super::respond`). Whatever has to reach the client during the
//! call (progress under its token, an approval question, a server's sampling or elicitation
//! request) turns the response into an event stream and rides it; the client's answers to
//! those requests come back as POSTs, which are caught here. Closing the response stops the
//! call as a client disconnect.
//!
//! rmcp serves anything else, reading it itself: another method, a batch, an unknown member,
//! another key of the protocol's own in `_meta`, an `Origin`, a `Host` that is not plainly
//! allowed, a session rmcp would refuse. Only a message whose bytes say it may be the gateway's
//! (`super::incoming::may_be_ours`) is read here first; `initialize` is read here only when it
//! names the 2025-11-25 tasks, whose capability rmcp drops.

use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use http::header::{ACCEPT, CONTENT_TYPE, HOST, ORIGIN};
use http::{HeaderMap, HeaderName, Response, StatusCode};
use rmcp::ErrorData;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelledNotificationParam, ClientResult,
    JsonRpcError, JsonRpcRequest, ProgressNotificationParam, ProtocolVersion, RequestId,
    ServerRequest, ServerResult,
};
use tokio::sync::mpsc;
use toolwarden_hosts::AllowedHosts;
use toolwarden_protocol::{CancelReason, Principal};

use super::call::{self, CallContext, CallEnd, Door, trace_from_header};
use super::channel::{ClientChannel, Sent};
use super::convert::ResultJson;
use super::handler::{identity_session, named_session};
use super::handshake_tasks;
use super::http_sessions::HttpSessions;
use super::incoming::{CallParams, Incoming, may_be_ours};
use super::options::{ANSWER_ID_PREFIX, versions};
use super::respond::{Answering, BoxBody, Out, respond};
use super::rounds::{self, Round};
use super::session::ClientSession;
use super::state::GatewayState;

/// The headers of a session, of its protocol version, and the standard headers of a
/// stateless request (names made once, not parsed at every lookup).
pub(crate) const MCP_SESSION_ID: HeaderName = HeaderName::from_static("mcp-session-id");
pub(crate) const MCP_PROTOCOL_VERSION: HeaderName = HeaderName::from_static("mcp-protocol-version");
const MCP_METHOD: HeaderName = HeaderName::from_static("mcp-method");
const MCP_NAME: HeaderName = HeaderName::from_static("mcp-name");

/// The `Mcp-*` headers of a plain handshake request, and of a plain stateless call.
const HANDSHAKE_HEADERS: &[&str] = &["mcp-session-id", "mcp-protocol-version"];
const STATELESS_HEADERS: &[&str] = &["mcp-protocol-version", "mcp-method", "mcp-name"];

/// Where a POST goes.
pub(crate) enum Routed {
    /// The gateway answered it.
    Answered(Response<BoxBody>),
    /// rmcp serves it; `declares_tasks`: it is an `initialize` that declares the 2025-11-25
    /// tasks capability, which rmcp drops (the handler learns it from a mark on the request).
    Rmcp { declares_tasks: bool },
}

const RMCP: Routed = Routed::Rmcp {
    declares_tasks: false,
};

/// Reads the POST's body once and sends it where its method is served.
pub(crate) async fn dispatch(
    gw: &Arc<GatewayState>,
    sessions: &HttpSessions,
    answering: &Answering,
    principal: &Principal,
    headers: &HeaderMap,
    body: &Bytes,
) -> Routed {
    if let Some(session_id) = headers.get(MCP_SESSION_ID) {
        let Some((session_id, session)) = handshake_session(gw, answering, headers, session_id)
        else {
            return RMCP;
        };
        if !may_be_ours(body, session.handshake_tasks()) {
            return RMCP;
        }
        let Some(message) = Incoming::parse(body) else {
            return RMCP;
        };
        return match handshake(
            gw, sessions, answering, session_id, session, headers, message,
        )
        .await
        {
            Some(response) => Routed::Answered(response),
            None => RMCP,
        };
    }
    // A stateless call says so in its headers, read in the same one pass that tells whether
    // they are plain.
    let mcp = plain_headers(headers, &answering.hosts, STATELESS_HEADERS);
    if let Some(mcp) = mcp.filter(|mcp| mcp.method == Some(b"tools/call")) {
        return match stateless(gw, answering, principal, headers, mcp, body).await {
            Some(response) => Routed::Answered(response),
            None => RMCP,
        };
    }
    Routed::Rmcp {
        declares_tasks: handshake_tasks::declares_tasks(body),
    }
}

/// The session a request with plain headers names, if the gateway may answer it itself.
fn handshake_session<'h>(
    gw: &GatewayState,
    answering: &Answering,
    headers: &'h HeaderMap,
    id: &'h http::HeaderValue,
) -> Option<(&'h str, Arc<ClientSession>)> {
    plain_headers(headers, &answering.hosts, HANDSHAKE_HEADERS)?;
    let id = id.to_str().ok()?;
    let session = gw.http_session(id)?;
    (!session.is_ended()).then_some((id, session))
}

/// A message of a handshake session: a call, an answer to one of the gateway's requests, or
/// (a session that declared tasks) a task request or `tools/list`. `None`: rmcp's.
async fn handshake(
    gw: &Arc<GatewayState>,
    sessions: &HttpSessions,
    answering: &Answering,
    session_id: &str,
    session: Arc<ClientSession>,
    headers: &HeaderMap,
    mut message: Incoming<'_>,
) -> Option<Response<BoxBody>> {
    let id = message.id.clone()?;
    let touch = |session: &ClientSession| {
        sessions.touch(session_id);
        session.touch();
    };
    match message.method {
        None => {
            // The client's answer to one of the gateway's own requests (others go to rmcp).
            let answer = answer_of(&message, &id)?;
            touch(&session);
            let key = id.to_string();
            if !session.answer(&key, answer) {
                tracing::debug!(session = %session.id, request = %key,
                    "an answer to a request nobody waits for any more");
            }
            Some(accepted())
        }
        Some("tools/call") => {
            let params = message.call_params()?;
            // Another era's members: rmcp's (it drops `task` unless the session declared tasks,
            // and the call is held as always).
            if params.meta.envelope.is_some()
                || params.input_responses.is_some()
                || params.request_state.is_some()
                || (params.task.is_some() && !session.handshake_tasks())
            {
                return None;
            }
            touch(&session);
            let task = params.task.is_some();
            let mut meta = params.meta.rest;
            trace_from_header(headers, &mut meta);
            let mut call = CallToolRequestParams::new(params.name);
            call.arguments = params.arguments;
            if task {
                return Some(
                    handshake_tasks::serve_call(gw, session, answering, call, id, meta).await,
                );
            }
            let (out, rx) = mpsc::unbounded_channel();
            let channel = Arc::new(CallResponse {
                session: session.clone(),
                out: out.clone(),
            });
            let context = CallContext::new(id.clone(), meta, channel, Door::Connection);
            let (gw2, session2) = (gw.clone(), session.clone());
            let result = async move {
                Ok(
                    match call::answer_call(&gw2, &session2, call, context).await? {
                        // Written straight from the engine's result (`convert::ResultJson`).
                        CallEnd::Governed(result) => Reply::Governed(result, false),
                        CallEnd::Status(result) => {
                            let mut result = ServerResult::CallToolResult(result);
                            result.strip_result_type_for_legacy_peer();
                            Reply::Made(Box::new(result))
                        }
                    },
                )
            };
            let request = id.clone();
            let closed = move || {
                let key = request.to_string();
                tracing::debug!(session = %session.id, request = %key,
                    "the client closed a call's response before its answer");
                session.stop_request(&key, CancelReason::ClientDisconnect);
            };
            let run = run(result, id, out, closed);
            Some(respond(gw, Box::pin(run), rx, answering).await)
        }
        Some("tools/list") if session.handshake_tasks() && message.is_request() => {
            touch(&session);
            Some(handshake_tasks::serve_list(gw, &session, &id, &message.meta()).await)
        }
        Some(method)
            if session.handshake_tasks()
                && handshake_tasks::METHODS.contains(&method)
                && message.is_request() =>
        {
            touch(&session);
            let params = message
                .params_value()
                .map_err(|e| ErrorData::invalid_params(format!("malformed params: {e}"), None));
            Some(handshake_tasks::serve_method(gw, session, answering, method, id, params).await)
        }
        Some(_) => None,
    }
}

/// The client's answer to one of the gateway's own requests; `None` for any other message.
fn answer_of(message: &Incoming<'_>, id: &RequestId) -> Option<Result<ClientResult, ErrorData>> {
    let RequestId::String(key) = id else {
        return None;
    };
    if !key.starts_with(ANSWER_ID_PREFIX)
        || !matches!(message.params, super::incoming::Params::Absent)
    {
        return None;
    }
    match (message.result, message.error) {
        (Some(result), None) => Some(serde_json::from_str::<ClientResult>(result.get()).map_err(
            |e| {
                ErrorData::internal_error(format!("the client's answer is not a result: {e}"), None)
            },
        )),
        (None, Some(error)) => Some(Err(serde_json::from_str::<ErrorData>(error.get())
            .unwrap_or_else(|e| {
                ErrorData::internal_error(format!("the client's error is malformed: {e}"), None)
            }))),
        _ => None,
    }
}

/// A stateless `tools/call` (its `Mcp-Method` says so) with plain headers (`mcp`). `None`:
/// rmcp's.
async fn stateless(
    gw: &Arc<GatewayState>,
    answering: &Answering,
    principal: &Principal,
    headers: &HeaderMap,
    mcp: McpHeaders<'_>,
    body: &Bytes,
) -> Option<Response<BoxBody>> {
    // `plain_headers` saw a protocol version the gateway speaks, but not that it is 2026-07-28;
    // each of the standard headers must come once.
    if mcp.repeated || mcp.version != Some(ProtocolVersion::V_2026_07_28.as_str().as_bytes()) {
        return None;
    }
    let name_header = mcp.name?;
    let mut message = Incoming::parse(body)?;
    let CallParams {
        name,
        arguments,
        meta,
        task,
        input_responses,
        request_state,
    } = message.call_params()?;
    let envelope = meta.envelope?;
    if name.as_bytes() != name_header || task.is_some() || gw.maps_headers(&name) {
        return None;
    }
    let id = message.id?;
    let mut meta = meta.rest;
    let session_id = match named_session(&meta) {
        Some(name) => toolwarden_protocol::SessionId::new(name),
        None => identity_session(&gw.identities, headers, envelope.client_name.as_deref()),
    };
    let session = gw.stateless_session(principal, session_id, &answering.shutdown);
    let tasks = envelope.capabilities.supports_tasks();
    session.declare(envelope.capabilities);
    session.touch();
    trace_from_header(headers, &mut meta);
    let first = input_responses.is_none() && request_state.is_none() && !tasks;
    let mut call = CallToolRequestParams::new(name);
    call.arguments = arguments;
    call.input_responses = input_responses;
    call.request_state = request_state;
    let (out, rx) = mpsc::unbounded_channel();
    let mut context = CallContext::new(
        id.clone(),
        meta,
        Arc::new(Progress(out.clone())),
        Door::Stream(answering.shutdown.clone()),
    );
    context.tasks = tasks;
    // The request's cancel: the client closing its response (below).
    let ct = context.ct.clone();
    let gw2 = gw.clone();
    let result = async move {
        // The token fires below only while the answer is awaited: a new call that cannot
        // become a task is driven right here (`rounds::first_round`).
        let made = |response| Reply::Made(Box::new(ServerResult::from(response)));
        if !first {
            return rounds::call_tool(&gw2, &session, call, context)
                .await
                .map(made);
        }
        Ok(
            match rounds::first_round(&gw2, &session, call, context).await? {
                // Written straight from the engine's result (`convert::ResultJson`).
                Round::Ended(CallEnd::Governed(result)) => Reply::Governed(result, true),
                Round::Ended(CallEnd::Status(result)) => made(CallToolResponse::Complete(result)),
                Round::Answered(response) => made(response),
            },
        )
    };
    // The revision's cancel: the client closed the request's response.
    let run = run(result, id, out, move || ct.cancel());
    Some(respond(gw, Box::pin(run), rx, answering).await)
}

/// A call's result, as its answer carries it.
enum Reply {
    /// A governed call's, written straight from the engine's result; with `resultType` for a
    /// stateless client.
    Governed(Arc<toolwarden_protocol::CallResult>, bool),
    Made(Box<ServerResult>),
}

impl serde::Serialize for Reply {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Reply::Governed(result, complete) => ResultJson {
                result,
                complete: *complete,
            }
            .serialize(serializer),
            Reply::Made(result) => result.serialize(serializer),
        }
    }
}

/// The JSON-RPC answer to request `id`.
#[derive(serde::Serialize)]
struct Answered<'a> {
    jsonrpc: &'static str,
    id: &'a RequestId,
    result: &'a Reply,
}

/// The call's task: runs it, does `closed` when the client closes the response before the
/// answer, and sends the answer last (an event stream keeps itself alive: `respond`).
async fn run(
    result: impl Future<Output = Result<Reply, ErrorData>>,
    id: RequestId,
    out: mpsc::UnboundedSender<Out>,
    closed: impl FnOnce(),
) {
    tokio::pin!(result);
    let mut closed = Some(closed);
    let result = loop {
        tokio::select! {
            biased;
            result = &mut result => break result,
            () = out.closed(), if closed.is_some() => {
                if let Some(closed) = closed.take() {
                    closed();
                }
            }
        }
    };
    let answer = match result {
        Ok(result) => serde_json::to_vec(&Answered {
            jsonrpc: "2.0",
            id: &id,
            result: &result,
        }),
        Err(error) => serde_json::to_vec(&JsonRpcError::new(Some(id), error)),
    };
    match answer {
        Ok(answer) => {
            let _ = out.send(Out::Answer(answer.into()));
        }
        Err(e) => tracing::error!(error = %e, "cannot serialize a call's answer"),
    }
}

/// The response of a handshake call the gateway serves itself, as the call's handler sees it:
/// what is sent goes on it, before the answer; the client's answers to requests come back as
/// POSTs the gateway catches ([`dispatch`]).
struct CallResponse {
    session: Arc<ClientSession>,
    out: mpsc::UnboundedSender<Out>,
}

/// Sends one JSON-RPC message on a call's response.
fn send_json(
    out: &mpsc::UnboundedSender<Out>,
    message: &impl serde::Serialize,
) -> Result<(), String> {
    let bytes = serde_json::to_vec(message).map_err(|e| e.to_string())?;
    out.send(Out::Message(bytes.into()))
        .map_err(|_| "the client closed the call's response".to_owned())
}

/// A progress notification, as it goes on a call's response.
fn progress_message(param: ProgressNotificationParam) -> serde_json::Value {
    serde_json::json!({
        "jsonrpc": "2.0",
        "method": "notifications/progress",
        "params": param,
    })
}

impl ClientChannel for CallResponse {
    fn notify_progress(
        &self,
        param: ProgressNotificationParam,
    ) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(std::future::ready(send_json(
            &self.out,
            &progress_message(param),
        )))
    }

    fn send_request(&self, request: ServerRequest) -> BoxFuture<'_, Result<Sent, ErrorData>> {
        let (id, answer) = self.session.expect_answer();
        let id = RequestId::String(id.into());
        if let Err(e) = send_json(&self.out, &JsonRpcRequest::new(id.clone(), request)) {
            self.session.forget_answer(&id.to_string());
            return Box::pin(std::future::ready(Err(ErrorData::internal_error(
                format!("the MCP client is gone: {e}"),
                None,
            ))));
        }
        let answer = async {
            answer.await.unwrap_or_else(|_| {
                Err(ErrorData::internal_error(
                    "the MCP client connection closed",
                    None,
                ))
            })
        };
        Box::pin(std::future::ready(Ok(Sent {
            id,
            answer: Box::pin(answer),
        })))
    }

    fn withdraw(&self, param: CancelledNotificationParam) {
        if let Some(id) = &param.request_id {
            self.session.forget_answer(&id.to_string());
        }
        let _ = send_json(
            &self.out,
            &serde_json::json!({
                "jsonrpc": "2.0",
                "method": "notifications/cancelled",
                "params": param,
            }),
        );
    }
}

/// A stateless call's response, as `super::rounds` sees it: progress goes on it. Nothing else
/// may reach a stateless client but the answer; a question is asked through `input_required`
/// (`super::rounds` never sends one here).
struct Progress(mpsc::UnboundedSender<Out>);

impl ClientChannel for Progress {
    fn notify_progress(
        &self,
        param: ProgressNotificationParam,
    ) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(std::future::ready(send_json(
            &self.0,
            &progress_message(param),
        )))
    }

    fn send_request(&self, _request: ServerRequest) -> BoxFuture<'_, Result<Sent, ErrorData>> {
        Box::pin(std::future::ready(Err(ErrorData::internal_error(
            "a stateless client is asked through input_required, never by a request",
            None,
        ))))
    }

    fn withdraw(&self, _param: CancelledNotificationParam) {}
}

/// The `Mcp-*` headers of a request whose headers are plain (`plain_headers`): the first value
/// of each, and whether one of them came more than once.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct McpHeaders<'h> {
    pub(crate) version: Option<&'h [u8]>,
    pub(crate) method: Option<&'h [u8]>,
    pub(crate) name: Option<&'h [u8]>,
    pub(crate) repeated: bool,
}

/// Headers rmcp would accept without a second look: an allowed `Host`, no `Origin`, both
/// media types accepted (in either order: an `Accept` without quality values states no
/// preference, and the transport obliges a client to take either answer), a JSON body, a
/// protocol version the gateway speaks (or none), and no `Mcp-*` header but those in `mcp`
/// (lowercase). `None` when they are not; else the `Mcp-*` headers a caller reads further.
pub(crate) fn plain_headers<'h>(
    headers: &'h HeaderMap,
    hosts: &AllowedHosts,
    mcp: &[&str],
) -> Option<McpHeaders<'h>> {
    // One pass over the headers (a lookup each would hash every name again); of a header given
    // twice the first value counts, as `HeaderMap::get` would give it.
    let (mut host, mut content_type) = (None, None);
    let (mut json, mut sse) = (false, false);
    let mut seen = McpHeaders::default();
    let first = |slot: &mut Option<&'h [u8]>, repeated: &mut bool, value: &'h http::HeaderValue| {
        if slot.is_some() {
            *repeated = true;
        } else {
            *slot = Some(value.as_bytes());
        }
    };
    for (name, value) in headers {
        if name == ORIGIN {
            return None;
        } else if name == HOST {
            host.get_or_insert(value);
        } else if name == ACCEPT {
            let value = value.to_str().ok()?;
            for media in value.as_bytes().split(|&b| b == b',') {
                let essence = essence(media);
                sse |= essence.eq_ignore_ascii_case(b"text/event-stream");
                json |= essence.eq_ignore_ascii_case(b"application/json");
            }
        } else if name == CONTENT_TYPE {
            content_type.get_or_insert(value);
        } else if name.as_str().starts_with("mcp-") {
            if !mcp.contains(&name.as_str()) {
                return None;
            }
            if name == MCP_PROTOCOL_VERSION {
                first(&mut seen.version, &mut seen.repeated, value);
            } else if name == MCP_METHOD {
                first(&mut seen.method, &mut seen.repeated, value);
            } else if name == MCP_NAME {
                first(&mut seen.name, &mut seen.repeated, value);
            }
        }
    }
    let json_body = content_type
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| essence(v.as_bytes()).eq_ignore_ascii_case(b"application/json"));
    let plain = json
        && sse
        && json_body
        && host.is_some_and(|host| hosts.allows_value(host.as_bytes()))
        && seen
            .version
            .is_none_or(|version| versions().iter().any(|v| v.as_str().as_bytes() == version));
    plain.then_some(seen)
}

/// A media type without its parameters, trimmed (bytes, not `str`: searching for a `char` costs
/// more than the whole check on the gateway's path).
fn essence(media: &[u8]) -> &[u8] {
    media
        .split(|&b| b == b';')
        .next()
        .unwrap_or_default()
        .trim_ascii()
}

fn accepted() -> Response<BoxBody> {
    let mut response = Response::new(BoxBody::new(http_body_util::Empty::new()));
    *response.status_mut() = StatusCode::ACCEPTED;
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, http::HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn plain() -> Vec<(&'static str, &'static str)> {
        vec![
            ("host", "127.0.0.1:8080"),
            ("accept", "application/json, text/event-stream"),
            ("content-type", "application/json"),
            ("mcp-session-id", "s1"),
        ]
    }

    #[test]
    fn only_plain_headers_are_answered_by_the_gateway() {
        let hosts = AllowedHosts::new(false, ["localhost", "127.0.0.1", "::1"]);
        assert!(plain_headers(&headers(&plain()), &hosts, HANDSHAKE_HEADERS).is_some());
        let with = |extra: (&'static str, &'static str)| {
            let mut h = plain();
            h.push(extra);
            plain_headers(&headers(&h), &hosts, HANDSHAKE_HEADERS).is_some()
        };
        assert!(with(("mcp-protocol-version", "2025-06-18")));
        assert!(!with(("mcp-protocol-version", "1999-01-01")));
        assert!(!with(("origin", "http://localhost:3000")));
        assert!(!with(("mcp-method", "tools/call")));
        let mut h = plain();
        h[0] = ("host", "evil.example:8080");
        assert!(plain_headers(&headers(&h), &hosts, HANDSHAKE_HEADERS).is_none());
        h[0] = ("host", "[::1]:8080");
        assert!(plain_headers(&headers(&h), &hosts, HANDSHAKE_HEADERS).is_some());
        let mut h = plain();
        h[1] = ("accept", "application/json");
        assert!(plain_headers(&headers(&h), &hosts, HANDSHAKE_HEADERS).is_none());
        // Either order (rmcp's own client lists the event stream first).
        h[1] = ("accept", "text/event-stream, application/json");
        assert!(plain_headers(&headers(&h), &hosts, HANDSHAKE_HEADERS).is_some());
        h[1] = ("accept", "text/event-stream");
        assert!(plain_headers(&headers(&h), &hosts, HANDSHAKE_HEADERS).is_none());
        let mut h = plain();
        h[2] = ("content-type", "text/plain");
        assert!(plain_headers(&headers(&h), &hosts, HANDSHAKE_HEADERS).is_none());
        // A stateless call's standard headers.
        let stateless = headers(&[
            ("host", "127.0.0.1:8080"),
            ("accept", "application/json, text/event-stream"),
            ("content-type", "application/json"),
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "echo"),
        ]);
        assert_eq!(
            plain_headers(&stateless, &hosts, STATELESS_HEADERS),
            Some(McpHeaders {
                version: Some(b"2026-07-28"),
                method: Some(b"tools/call"),
                name: Some(b"echo"),
                repeated: false,
            })
        );
        assert!(plain_headers(&stateless, &hosts, HANDSHAKE_HEADERS).is_none());
    }

    #[test]
    fn a_header_counts_only_once() {
        let hosts = AllowedHosts::new(false, ["127.0.0.1"]);
        let mut pairs = vec![
            ("host", "127.0.0.1:8080"),
            ("accept", "application/json, text/event-stream"),
            ("content-type", "application/json"),
            ("mcp-name", "a"),
            ("mcp-method", "m"),
        ];
        let once = headers(&pairs);
        let seen = plain_headers(&once, &hosts, STATELESS_HEADERS).unwrap();
        assert!(!seen.repeated);
        assert_eq!(
            (seen.name, seen.method, seen.version),
            (Some(&b"a"[..]), Some(&b"m"[..]), None)
        );
        pairs.push(("mcp-name", "b"));
        let twice = headers(&pairs);
        let seen = plain_headers(&twice, &hosts, STATELESS_HEADERS).unwrap();
        assert!(seen.repeated);
        assert_eq!(seen.name, Some(&b"a"[..]));
    }
}
