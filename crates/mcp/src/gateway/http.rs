//! Streamable HTTP at `/mcp`: the tower service the binary mounts. Every POST's body is read
//! within the limit and dispatched once (`dispatch`): what the gateway answers itself (a
//! `tools/call` of either era, the answers to its own requests, the 2025-11-25 task requests)
//! it answers; everything else goes to rmcp's `StreamableHttpService`, whose sessions the
//! gateway watches (`http_sessions`).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use super::dispatch::{Routed, dispatch};
use super::handler::GatewayConnection;
use super::handshake_tasks;
use super::http_sessions::{self, HttpSessions};
use super::incoming::handed_to_rmcp;
use super::options::JSON_WINDOW;
use super::respond::{Answering, BoxBody};
use super::state::GatewayState;
use toolwarden_hosts::AllowedHosts;

type RmcpService = StreamableHttpService<GatewayConnection, HttpSessions>;

/// The gateway's Streamable HTTP service: mount it at `/mcp`.
///
/// What the gateway answers itself is dispatched to it (`super::dispatch`); everything else
/// goes to rmcp's service. rmcp's service clones itself, configuration included, for every
/// request (and axum clones it once more); shared behind an `Arc`, a request costs a
/// reference count instead.
#[derive(Clone)]
pub struct GatewayHttpService(Arc<ServiceInner>);

/// What every clone of the service shares.
struct ServiceInner {
    inner: RmcpService,
    gateway: Arc<GatewayState>,
    sessions: Arc<HttpSessions>,
    answering: Answering,
}

impl std::fmt::Debug for GatewayHttpService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayHttpService").finish_non_exhaustive()
    }
}

impl<B> tower_service::Service<http::Request<B>> for GatewayHttpService
where
    B: http_body::Body + Send + 'static,
    B::Error: std::fmt::Display + Into<Box<dyn std::error::Error + Send + Sync>>,
    B::Data: Send + 'static,
{
    type Response = http::Response<BoxBody>;
    type Error = std::convert::Infallible;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let this = self.0.clone();
        Box::pin(async move {
            // A session is its `initialize`'s principal's: another principal's request naming
            // it is told there is no such session (as for an unknown one).
            let principal = this.gateway.principal_of_request(req.extensions());
            if let Some(id) = req
                .headers()
                .get("mcp-session-id")
                .and_then(|v| v.to_str().ok())
                && let Some(session) = this.gateway.http_session(id)
                && session.principal.name != principal.name
            {
                return Ok(not_yours());
            }
            if req.method() != http::Method::POST {
                return Ok(this.inner.handle(req).await);
            }
            // Every POST body is read within the limit, whichever path it takes: rmcp's own
            // service would read any size.
            let limit = this.gateway.opts.max_body;
            let declared = req
                .headers()
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            if declared.is_some_and(|n| n > limit as u64) {
                return Ok(too_large(limit));
            }
            let (parts, body) = req.into_parts();
            let body =
                match http_body_util::BodyExt::collect(http_body_util::Limited::new(body, limit))
                    .await
                {
                    Ok(body) => body.to_bytes(),
                    Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                        return Ok(too_large(limit));
                    }
                    Err(e) => {
                        let mut response = http::Response::new(BoxBody::new(
                            http_body_util::Full::new(Bytes::from(format!(
                                "Bad Request: cannot read the request body: {e}"
                            ))),
                        ));
                        *response.status_mut() = http::StatusCode::BAD_REQUEST;
                        return Ok(response);
                    }
                };
            let declares_tasks = match dispatch(
                &this.gateway,
                &this.sessions,
                &this.answering,
                &principal,
                &parts.headers,
                &body,
            )
            .await
            {
                Routed::Answered(response) => return Ok(response),
                Routed::Rmcp { declares_tasks } => declares_tasks,
            };
            // An `initialize` declaring the 2025-11-25 tasks capability, which rmcp drops: the
            // handler learns it from this mark, and the answer gets the gateway's own.
            let mut parts = parts;
            if declares_tasks {
                parts.extensions.insert(handshake_tasks::DeclaresTasks);
            }
            handed_to_rmcp(1);
            let req = http::Request::from_parts(parts, http_body_util::Full::new(body.clone()));
            let response = this.inner.handle(req).await;
            if declares_tasks && response.status() == http::StatusCode::OK {
                return Ok(handshake_tasks::advertise(response));
            }
            if response.status() == http::StatusCode::UNSUPPORTED_MEDIA_TYPE {
                return Ok(unreadable(response, &body).await);
            }
            Ok(response)
        })
    }
}

/// 404 with a JSON-RPC error: the session named is not the requester's.
fn not_yours() -> http::Response<BoxBody> {
    jsonrpc_error(
        http::StatusCode::NOT_FOUND,
        "Session not found: this Mcp-Session-Id is not one of yours (a session belongs to the \
         principal whose token made it)"
            .to_owned(),
    )
}

/// 413 with a JSON-RPC error (the request's id is unknown: its body was not read).
fn too_large(limit: usize) -> http::Response<BoxBody> {
    jsonrpc_error(
        http::StatusCode::PAYLOAD_TOO_LARGE,
        format!(
            "the request body is larger than this server's limit of {limit} bytes (http.max_body)"
        ),
    )
}

/// rmcp answers a body it cannot read as a client's message with 415 and a line of text, as
/// if the media type were wrong. A client gets 400 with a JSON-RPC error instead: `-32700`
/// when the body is not JSON at all, `-32600` when it is JSON but no message (JSON-RPC's own
/// codes; `id` null, as rmcp read none). Any other 415 (a wrong `Content-Type`) stays.
async fn unreadable(response: http::Response<BoxBody>, body: &Bytes) -> http::Response<BoxBody> {
    const PREFIX: &str = "fail to deserialize request body ";
    let (parts, said) = response.into_parts();
    let said = http_body_util::BodyExt::collect(said)
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let Some(detail) = std::str::from_utf8(&said)
        .ok()
        .and_then(|text| text.strip_prefix(PREFIX))
    else {
        return http::Response::from_parts(parts, BoxBody::new(http_body_util::Full::new(said)));
    };
    match serde_json::from_slice::<serde::de::IgnoredAny>(body) {
        Err(e) => jsonrpc_error_coded(
            http::StatusCode::BAD_REQUEST,
            PARSE_ERROR,
            format!("Parse error: the request body is not JSON: {e}"),
        ),
        Ok(_) => jsonrpc_error(
            http::StatusCode::BAD_REQUEST,
            format!("Invalid Request: the request body is not a JSON-RPC message: {detail}"),
        ),
    }
}

/// JSON-RPC's code for a message that is not JSON.
const PARSE_ERROR: i32 = -32700;

/// JSON-RPC's code for JSON that is not a valid request.
const INVALID_REQUEST: i32 = -32600;

/// An HTTP error with a JSON-RPC error (`-32600`, `id: null`) as its body.
fn jsonrpc_error(status: http::StatusCode, message: String) -> http::Response<BoxBody> {
    jsonrpc_error_coded(status, INVALID_REQUEST, message)
}

/// An HTTP error with a JSON-RPC error (`code`, `id: null`) as its body.
fn jsonrpc_error_coded(
    status: http::StatusCode,
    code: i32,
    message: String,
) -> http::Response<BoxBody> {
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {"code": code, "message": message},
    });
    let mut response = http::Response::new(BoxBody::new(http_body_util::Full::new(Bytes::from(
        body.to_string(),
    ))));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

pub(crate) fn service(
    gateway: &Arc<GatewayState>,
    shutdown: CancellationToken,
) -> GatewayHttpService {
    let sessions = HttpSessions::new(Arc::downgrade(gateway));
    let mut hosts: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    hosts.extend(gateway.opts.allowed_hosts.iter().cloned());
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(hosts.clone())
        .with_sse_keep_alive(Some(gateway.opts.sse_keep_alive))
        .with_cancellation_token(shutdown.clone());
    gateway.tasks.spawn(http_sessions::sweep(
        Arc::downgrade(&sessions),
        gateway.opts.http_session_idle,
        shutdown.clone(),
        gateway.closed.clone(),
    ));
    let factory = {
        let gateway = gateway.clone();
        let shutdown = shutdown.clone();
        move || Ok(GatewayConnection::new(gateway.clone(), shutdown.clone()))
    };
    let answering = Answering {
        hosts: AllowedHosts::new(false, &hosts),
        json_window: JSON_WINDOW,
        keep_alive: gateway.opts.sse_keep_alive,
        shutdown: shutdown.clone(),
    };
    GatewayHttpService(Arc::new(ServiceInner {
        inner: StreamableHttpService::new(factory, sessions.clone(), config),
        gateway: gateway.clone(),
        sessions,
        answering,
    }))
}
