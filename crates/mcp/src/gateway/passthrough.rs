//! What every request that passes through to a server shares, and the ones that need nothing
//! else: a client's request sent to one server and cancelled with it, every page of a list,
//! answers re-read as the type asked for, which servers offer what; and `logging/setLevel` and
//! `notifications/roots/list_changed`, which go to every server.
//!
//! Passthrough requests are not tool calls, so they are not governed; they only need the live
//! connection and a way to be cancelled.

#![allow(
    deprecated,
    reason = "logging is deprecated by SEP-2577 (MCP 2026-07-28), but the session-based \
              revisions the gateway speaks still use it"
)]

use std::sync::Arc;
use std::time::Duration;

use rmcp::ErrorData;
use rmcp::model::{
    ClientNotification, ClientRequest, CompleteResult, GetPromptResult, ListPromptsResult,
    ListResourceTemplatesResult, ListResourcesResult, PaginatedRequestParams, ReadResourceResult,
    RequestMetaObject, ResultType, RootsListChangedNotification, ServerResult, SetLevelRequest,
    SetLevelRequestParams,
};
use rmcp::service::{RequestContext, RoleServer};
use tokio_util::sync::CancellationToken;

use crate::McpServer;
use crate::servers::Deadline;
use crate::servers::link::retype;

use super::call::hint_ms;
use super::options::MAX_REQUEST_TIMEOUT;
use super::session::ClientSession;
use super::state::GatewayState;

/// Which capability a list needs.
#[derive(Clone, Copy)]
pub(crate) enum Kind {
    Prompts,
    Resources,
}

/// The servers that offer `kind` (or whose capabilities are not known yet).
pub(crate) fn servers_with(servers: &[Arc<McpServer>], kind: Kind) -> Vec<Arc<McpServer>> {
    servers
        .iter()
        .filter(|s| {
            s.info().is_none_or(|i| match kind {
                Kind::Prompts => i.capabilities.prompts.is_some(),
                Kind::Resources => i.capabilities.resources.is_some(),
            })
        })
        .cloned()
        .collect()
}

/// Sends `request` to `server` for the client's request in `ctx`, cancelled with it: by the
/// client's `notifications/cancelled`, its closed response stream, or its session's end; and
/// ended with a JSON-RPC error when the server has not answered by the client request's
/// deadline, `until` ([`until`]: one deadline however many servers the request goes to).
pub(crate) async fn forward(
    session: &ClientSession,
    server: &McpServer,
    request: ClientRequest,
    ctx: &RequestContext<RoleServer>,
    until: Deadline,
) -> Result<ServerResult, ErrorData> {
    let open = session.request_started(&ctx.id);
    let stop = open.stop.clone();
    let cancel = CancellationToken::new();
    let _guard = cancel.clone().drop_guard();
    let watch = {
        let cancel = cancel.clone();
        let ct = ctx.ct.clone();
        async move {
            tokio::select! {
                _ = ct.cancelled() => cancel.cancel(),
                _ = stop.token().cancelled() => cancel.cancel(),
                _ = cancel.cancelled() => {}
            }
        }
    };
    let call = server.request(request, forward_meta(ctx), &cancel, until);
    let (result, ()) = tokio::join!(
        async {
            let r = call.await;
            cancel.cancel();
            r
        },
        watch
    );
    drop(open);
    result
}

/// When a client's request to be forwarded must be answered by: from now, the client's own
/// hint (`_meta.timeout_ms` or `_meta["toolwarden/timeout_ms"]`, at most
/// [`MAX_REQUEST_TIMEOUT`]; `0` is no hint, as for a tool call), else the gateway's
/// `request_timeout`. Every server the request goes to shares it.
pub(crate) fn until(gw: &GatewayState, meta: &RequestMetaObject) -> Deadline {
    let within = match hint_ms(meta, &["timeout_ms", "toolwarden/timeout_ms"]) {
        Some(ms) if ms > 0 => Duration::from_millis(ms).min(MAX_REQUEST_TIMEOUT),
        _ => gw.opts.request_timeout,
    };
    Deadline::after(within)
}

/// A request the gateway makes on its own behalf (a renewal, a subscription for a listen
/// stream): the gateway's `request_timeout` from now.
pub(crate) fn own_deadline(gw: &GatewayState) -> Deadline {
    Deadline::after(gw.opts.request_timeout)
}

/// The client's `_meta` for the server: what the client said, without what belongs to the
/// hop — rmcp sets its own progress token, and every key of the namespace the protocol
/// reserves, `io.modelcontextprotocol/`: the 2026-07-28 envelope (`protocolVersion`,
/// `clientCapabilities`, `clientInfo`, `logLevel`) describes the gateway's client, not the
/// gateway toward its server, and the rest speaks of the client's hop too (a
/// `related-task` names one of the gateway's own tasks). (rmcp's HTTP
/// client takes a request's own `protocolVersion` as the connection's: a stateless client's
/// envelope sent on to a handshake server changed the connection's protocol header, and the
/// server refused every request after it.)
fn forward_meta(ctx: &RequestContext<RoleServer>) -> RequestMetaObject {
    let mut meta = ctx.meta.clone();
    meta.remove("progressToken");
    meta.retain(|key, _| !key.starts_with(ENVELOPE_PREFIX));
    meta
}

/// The prefix of the keys the 2026-07-28 revision reserves in a request's `_meta`.
const ENVELOPE_PREFIX: &str = "io.modelcontextprotocol/";

/// A list request's paging parameters, without the client's `_meta` (it goes with the
/// request's own).
pub(crate) fn page(params: Option<PaginatedRequestParams>) -> Option<PaginatedRequestParams> {
    params.map(|mut p| {
        p.meta = None;
        p
    })
}

/// A forwarded answer as the gateway's own: with `resultType: "complete"`, which the 2026-07-28
/// revision requires of every answer and a handshake server's answer lacks (SDK clients of
/// that revision refuse an answer without it). rmcp strips it again for handshake clients.
pub(crate) trait Completed {
    fn completed(self) -> Self;
}

macro_rules! completed {
    ($($t:ty),*) => {$(
        impl Completed for $t {
            fn completed(mut self) -> Self {
                self.result_type.get_or_insert(ResultType::COMPLETE);
                self
            }
        }
    )*};
}

completed!(
    ListResourcesResult,
    ListResourceTemplatesResult,
    ListPromptsResult,
    ReadResourceResult,
    GetPromptResult,
    CompleteResult
);

/// The error for a name or reference no server serves.
pub(crate) fn unknown(what: String) -> ErrorData {
    ErrorData::invalid_params(what, None)
}

/// Every item of a paginated `*/list` request to one server, page after page: `request` makes
/// the request for a page, `split` takes a page apart into its items and the next cursor.
pub(crate) async fn all_pages<P, T>(
    server: &McpServer,
    until: Deadline,
    what: &str,
    request: impl Fn(PaginatedRequestParams) -> ClientRequest,
    split: impl Fn(P) -> (Vec<T>, Option<String>),
) -> Result<Vec<T>, ErrorData>
where
    P: serde::de::DeserializeOwned,
{
    let mut all = Vec::new();
    let mut cursor = None;
    loop {
        let mut params = PaginatedRequestParams::default();
        params.cursor = cursor;
        let page: P = as_list(
            server
                .request(
                    request(params),
                    RequestMetaObject::new(),
                    &CancellationToken::new(),
                    until,
                )
                .await?,
            what,
        )?;
        let (items, next) = split(page);
        all.extend(items);
        cursor = next;
        if cursor.is_none() {
            return Ok(all);
        }
    }
}

/// A list answer as its type (rmcp may have parsed it as a structurally similar variant).
pub(crate) fn as_list<T: serde::de::DeserializeOwned>(
    result: ServerResult,
    what: &str,
) -> Result<T, ErrorData> {
    match result {
        ServerResult::EmptyResult(_) => retype(serde_json::json!({}), what),
        other => retype(other, what),
    }
}

/// `logging/setLevel`: every server that offers logging (an error only if all fail).
pub(crate) async fn set_level(
    gw: &GatewayState,
    session: &ClientSession,
    mut params: SetLevelRequestParams,
    ctx: RequestContext<RoleServer>,
) -> Result<(), ErrorData> {
    params.meta = None;
    let servers: Vec<Arc<McpServer>> = gw
        .servers
        .iter()
        .filter(|s| s.info().is_none_or(|i| i.capabilities.logging.is_some()))
        .cloned()
        .collect();
    let mut last = None;
    let mut any = false;
    let until = until(gw, &ctx.meta);
    for server in &servers {
        let request = ClientRequest::SetLevelRequest(SetLevelRequest::new(params.clone()));
        match forward(session, server, request, &ctx, until).await {
            Ok(_) => any = true,
            Err(e) => {
                tracing::warn!(server = %server.server_name(), error = %e.message,
                    "logging/setLevel failed");
                last = Some(e);
            }
        }
    }
    match last {
        Some(e) if !any => Err(e),
        _ => Ok(()),
    }
}

/// The client's roots changed: every server hears it.
pub(crate) async fn roots_list_changed(gw: &GatewayState) {
    for server in &gw.servers {
        server
            .notify(ClientNotification::RootsListChangedNotification(
                RootsListChangedNotification::default(),
            ))
            .await;
    }
}
