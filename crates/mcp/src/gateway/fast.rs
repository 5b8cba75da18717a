//! The gateway's own answer to a plain `tools/call` over Streamable HTTP.
//!
//! rmcp's Streamable HTTP server takes a request through a session worker task, the session's
//! service task and a handler task, and answers it on an event stream; for a call to a quick
//! tool that machinery costs more than the call (≈ 170 µs of CPU per request on the
//! development machine, against ≈ 30 µs for a call through the HTTP turn API). The gateway
//! serves the one request that matters for speed, `tools/call` in an initialized session, on
//! its own: the call runs on a task of its own with the same code as under rmcp
//! ([`super::call::call_tool`]), and its answer goes back as one `application/json` body when
//! nothing else has to go first. Whatever has to reach the client during the call (progress
//! under its token, an approval question, a server's sampling or elicitation request) turns
//! the response into an event stream and rides it, as it does under rmcp; the client's answers
//! to those requests come back as POSTs, which are caught here before rmcp sees them.
//!
//! Anything unusual goes to rmcp untouched: another method, a batch, an unknown member, the
//! newer per-request protocol metadata or standard headers, an `Origin`, a `Host` that is not
//! plainly allowed, a body without a length or over the limit, a session rmcp would refuse.
//! rmcp then validates and answers exactly as before.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use http::header::{ACCEPT, CONTENT_TYPE, HOST, ORIGIN};
use http::{HeaderMap, HeaderName, Response, StatusCode};
use rmcp::ErrorData;
use rmcp::model::{
    CallToolRequestParams, CancelledNotificationParam, ClientResult, JsonObject, JsonRpcError,
    JsonRpcRequest, JsonRpcResponse, JsonRpcVersion2_0, ProgressNotificationParam, RequestId,
    RequestMetaObject, ServerRequest, ServerResult,
};
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use toolwarden_protocol::CancelReason;

use super::call::{CallContext, Door, call_tool};
use super::channel::{ClientChannel, Sent};
use super::handshake_tasks;
use super::http_sessions::HttpSessions;
use toolwarden_hosts::AllowedHosts;

use super::options::{ANSWER_ID_PREFIX, versions};
use super::respond::{BoxBody, FastPath, Out, respond};
use super::session::ClientSession;
use super::state::GatewayState;

/// The headers of a session and of its protocol version (names made once, not parsed at
/// every lookup).
pub(crate) const MCP_SESSION_ID: HeaderName = HeaderName::from_static("mcp-session-id");
pub(crate) const MCP_PROTOCOL_VERSION: HeaderName = HeaderName::from_static("mcp-protocol-version");

/// The response of a call the gateway serves itself, as the call's handler sees it.
#[derive(Clone)]
pub(crate) struct CallResponse {
    session: Arc<ClientSession>,
    out: mpsc::UnboundedSender<Out>,
}

impl CallResponse {
    fn send_json(&self, message: &impl serde::Serialize) -> Result<(), String> {
        let bytes = serde_json::to_vec(message).map_err(|e| e.to_string())?;
        self.out
            .send(Out::Message(bytes.into()))
            .map_err(|_| "the client closed the call's response".to_owned())
    }
}

/// The call's own response: what is sent goes on it, before the answer; the client's answers
/// to requests come back as POSTs the gateway catches (see [`serve`]).
impl ClientChannel for CallResponse {
    fn notify_progress(
        &self,
        param: ProgressNotificationParam,
    ) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(std::future::ready(self.send_json(&serde_json::json!({
            "jsonrpc": "2.0",
            "method": "notifications/progress",
            "params": param,
        }))))
    }

    fn send_request(&self, request: ServerRequest) -> BoxFuture<'_, Result<Sent, ErrorData>> {
        let (id, answer) = self.session.expect_answer();
        let id = RequestId::String(id.into());
        if let Err(e) = self.send_json(&JsonRpcRequest::new(id.clone(), request)) {
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
        let _ = self.send_json(&serde_json::json!({
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": param,
        }));
    }
}

/// Whether a POST could be one the fast path serves: it names a session and says how long its
/// body is (its size was checked against the limit before).
pub(crate) fn candidate(headers: &HeaderMap) -> bool {
    headers.contains_key(MCP_SESSION_ID) && headers.contains_key(http::header::CONTENT_LENGTH)
}

/// Serves the POST if it is a plain `tools/call` or the client's answer to a request the
/// gateway sent on a call's response; `None` sends it to rmcp.
pub(crate) async fn serve(
    gw: &Arc<GatewayState>,
    sessions: &HttpSessions,
    fast: &FastPath,
    headers: &HeaderMap,
    body: &Bytes,
) -> Option<Response<BoxBody>> {
    if !plain_headers(
        headers,
        &fast.hosts,
        &["mcp-session-id", "mcp-protocol-version"],
    ) {
        return None;
    }
    let session_id = headers.get(MCP_SESSION_ID)?.to_str().ok()?;
    let session = gw.http_session(session_id)?;
    if session.is_ended() {
        return None;
    }
    // UTF-8 checked at once, not string by string.
    let message: Probe<'_> = serde_json::from_str(std::str::from_utf8(body).ok()?).ok()?;
    if message.jsonrpc != "2.0" {
        return None;
    }
    let id: RequestId = serde_json::from_str(message.id?.get()).ok()?;
    match message.method {
        None => {
            // The client's answer to one of our own requests (other answers go to rmcp).
            let RequestId::String(key) = &id else {
                return None;
            };
            if !key.starts_with(ANSWER_ID_PREFIX) || message.params.is_some() {
                return None;
            }
            let answer = match (message.result, message.error) {
                (Some(result), None) => {
                    serde_json::from_str::<ClientResult>(result.get()).map_err(|e| {
                        ErrorData::internal_error(
                            format!("the client's answer is not a result: {e}"),
                            None,
                        )
                    })
                }
                (None, Some(error)) => Err(serde_json::from_str::<ErrorData>(error.get())
                    .unwrap_or_else(|e| {
                        ErrorData::internal_error(
                            format!("the client's error is malformed: {e}"),
                            None,
                        )
                    })),
                _ => return None,
            };
            sessions.touch(&session_id.into());
            session.touch();
            if !session.answer(key, answer) {
                tracing::debug!(session = %session.id, request = %key,
                    "an answer to a request nobody waits for any more");
            }
            Some(accepted())
        }
        Some("tools/call") => {
            if message.result.is_some() || message.error.is_some() {
                return None;
            }
            let params: CallParams = serde_json::from_str(message.params?.get()).ok()?;
            let mut meta = params.meta.unwrap_or_default();
            if meta
                .keys()
                .any(|k| k.starts_with("io.modelcontextprotocol/"))
            {
                return None;
            }
            if params.task.is_some() && !session.handshake_tasks() {
                // rmcp drops the task, and the call is held as always.
                return None;
            }
            sessions.touch(&session_id.into());
            session.touch();
            super::call::trace_from_header(headers, &mut meta);
            let mut call = CallToolRequestParams::new(params.name);
            call.arguments = params.arguments;
            if params.task.is_some() {
                return Some(handshake_tasks::serve_call(gw, session, fast, call, id, meta).await);
            }
            let (out, rx) = mpsc::unbounded_channel();
            let call = run(gw.clone(), session, call, id, meta, out, fast.keep_alive);
            Some(respond(gw, Box::pin(call), rx, fast).await)
        }
        Some("tools/list") if session.handshake_tasks() => {
            if message.result.is_some() || message.error.is_some() {
                return None;
            }
            sessions.touch(&session_id.into());
            session.touch();
            Some(handshake_tasks::serve_list(gw, &session, &id))
        }
        Some(method) if session.handshake_tasks() && handshake_tasks::METHODS.contains(&method) => {
            if message.result.is_some() || message.error.is_some() {
                return None;
            }
            sessions.touch(&session_id.into());
            session.touch();
            Some(handshake_tasks::serve_method(gw, session, fast, method, id, message.params).await)
        }
        Some(_) => None,
    }
}

/// One JSON-RPC message, as much as the fast path needs to tell what it is.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Probe<'a> {
    pub(crate) jsonrpc: &'a str,
    #[serde(borrow, default)]
    pub(crate) id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub(crate) method: Option<&'a str>,
    #[serde(borrow, default)]
    pub(crate) params: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub(crate) result: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub(crate) error: Option<&'a RawValue>,
}

/// The parameters of a plain `tools/call`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CallParams {
    name: String,
    #[serde(default)]
    arguments: Option<JsonObject>,
    #[serde(rename = "_meta", default)]
    meta: Option<RequestMetaObject>,
    /// The 2025-11-25 revision's task request (`{"ttl": ...}`), served for a session that
    /// declared tasks (`super::handshake_tasks`).
    #[serde(default)]
    task: Option<serde_json::Value>,
}

/// Headers rmcp would accept without a second look: an allowed `Host`, no `Origin`, both
/// media types accepted — JSON first: a client that lists `text/event-stream` first prefers
/// an event stream, and rmcp answers it with one (a priming event and resumable ids); the
/// order of the list decides, quality values are not weighed —, a JSON
/// body, a protocol version the gateway speaks (or none), and no `Mcp-*` header but those in
/// `mcp` (lowercase).
pub(crate) fn plain_headers(headers: &HeaderMap, hosts: &AllowedHosts, mcp: &[&str]) -> bool {
    if headers.contains_key(ORIGIN)
        || !headers
            .get(HOST)
            .is_some_and(|host| hosts.allows_value(host.as_bytes()))
    {
        return false;
    }
    let (mut json, mut sse) = (false, false);
    for value in headers.get_all(ACCEPT) {
        let Ok(value) = value.to_str() else {
            return false;
        };
        for media in value.split(',') {
            let essence = media.split(';').next().unwrap_or("").trim();
            if essence.eq_ignore_ascii_case("text/event-stream") {
                if !json {
                    return false;
                }
                sse = true;
            }
            json |= essence.eq_ignore_ascii_case("application/json");
        }
    }
    let json_body = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .eq_ignore_ascii_case("application/json")
        });
    if !(json && sse && json_body) {
        return false;
    }
    if let Some(version) = headers.get(MCP_PROTOCOL_VERSION) {
        let known = versions()
            .iter()
            .any(|v| v.as_str().as_bytes() == version.as_bytes());
        if !known {
            return false;
        }
    }
    headers.keys().all(|name| {
        let name = name.as_str();
        !name.starts_with("mcp-") || mcp.contains(&name)
    })
}

fn accepted() -> Response<BoxBody> {
    let mut response = Response::new(BoxBody::new(http_body_util::Empty::new()));
    *response.status_mut() = StatusCode::ACCEPTED;
    response
}

/// The call's task: runs it, stops it when the client goes away, sends its answer last.
async fn run(
    gw: Arc<GatewayState>,
    session: Arc<ClientSession>,
    call: CallToolRequestParams,
    id: RequestId,
    meta: RequestMetaObject,
    out: mpsc::UnboundedSender<Out>,
    keep_alive: Duration,
) {
    let response = CallResponse {
        session: session.clone(),
        out: out.clone(),
    };
    let context = CallContext {
        id: id.clone(),
        meta,
        channel: Arc::new(response),
        ct: CancellationToken::new(),
        door: Door::Connection,
    };
    let result = call_tool(&gw, &session, call, context);
    tokio::pin!(result);
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + keep_alive, keep_alive);
    let mut watching = true;
    let result = loop {
        tokio::select! {
            biased;
            result = &mut result => break result,
            () = out.closed(), if watching => {
                watching = false;
                tracing::debug!(session = %session.id, request = %id,
                    "the client closed a call's response before its answer");
                session.stop_request(&id.to_string(), CancelReason::ClientDisconnect);
            }
            _ = ticks.tick(), if watching => {
                let _ = out.send(Out::KeepAlive);
            }
        }
    };
    let answer = match result {
        Ok(result) => {
            let mut result = ServerResult::CallToolResult(result);
            result.strip_result_type_for_legacy_peer();
            serde_json::to_vec(&JsonRpcResponse {
                jsonrpc: JsonRpcVersion2_0,
                id,
                result,
            })
        }
        Err(error) => serde_json::to_vec(&JsonRpcError::new(Some(id), error)),
    };
    match answer {
        Ok(answer) => {
            let _ = out.send(Out::Answer(answer.into()));
        }
        Err(e) => {
            tracing::error!(session = %session.id, error = %e, "cannot serialize a call's answer")
        }
    }
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

    const HANDSHAKE: &[&str] = &["mcp-session-id", "mcp-protocol-version"];

    fn plain() -> Vec<(&'static str, &'static str)> {
        vec![
            ("host", "127.0.0.1:8080"),
            ("accept", "application/json, text/event-stream"),
            ("content-type", "application/json"),
            ("mcp-session-id", "s1"),
        ]
    }

    #[test]
    fn only_plain_headers_take_the_fast_path() {
        let hosts = AllowedHosts::new(false, ["localhost", "127.0.0.1", "::1"]);
        assert!(plain_headers(&headers(&plain()), &hosts, HANDSHAKE));
        let with = |extra: (&'static str, &'static str)| {
            let mut h = plain();
            h.push(extra);
            plain_headers(&headers(&h), &hosts, HANDSHAKE)
        };
        assert!(with(("mcp-protocol-version", "2025-06-18")));
        assert!(!with(("mcp-protocol-version", "1999-01-01")));
        assert!(!with(("origin", "http://localhost:3000")));
        assert!(!with(("mcp-method", "tools/call")));
        let mut h = plain();
        h[0] = ("host", "evil.example:8080");
        assert!(!plain_headers(&headers(&h), &hosts, HANDSHAKE));
        h[0] = ("host", "[::1]:8080");
        assert!(plain_headers(&headers(&h), &hosts, HANDSHAKE));
        let mut h = plain();
        h[1] = ("accept", "application/json");
        assert!(!plain_headers(&headers(&h), &hosts, HANDSHAKE));
        // An event stream preferred: rmcp's path, which always streams.
        h[1] = ("accept", "text/event-stream, application/json");
        assert!(!plain_headers(&headers(&h), &hosts, HANDSHAKE));
        let mut h = plain();
        h[2] = ("content-type", "text/plain");
        assert!(!plain_headers(&headers(&h), &hosts, HANDSHAKE));
    }

    #[test]
    fn candidates_name_a_session_and_a_length() {
        assert!(candidate(&headers(&[
            ("mcp-session-id", "s"),
            ("content-length", "10")
        ])));
        assert!(!candidate(&headers(&[("content-length", "10")])));
        assert!(!candidate(&headers(&[("mcp-session-id", "s")])));
        // The size was judged at the door (`super::http`: over `max_body` is 413 before any
        // path sees the request).
    }
}
