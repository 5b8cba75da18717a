//! `prompts/list` and `prompts/get` through the gateway: prompts are named like tools,
//! `SERVER__PROMPT` (unprefixed with `prefix = false`), and a prompt goes to the server that
//! listed it. With one server a list is forwarded page by page with its cursor; with several,
//! every page of every server is read and answered as one page (a server that fails to list
//! is left out, and logged).

use std::sync::Arc;

use crate::servers::Deadline;
use rmcp::ErrorData;
use rmcp::model::{
    ClientRequest, GetPromptRequest, GetPromptRequestParams, GetPromptResult, ListPromptsRequest,
    ListPromptsResult, PaginatedRequestParams, Prompt, PromptListChangedNotification,
    ServerNotification, ServerResult,
};
use rmcp::service::{RequestContext, RoleServer};
use toolwarden_core::PREFIX_SEPARATOR;

use crate::McpServer;
use crate::servers::link::retype;

use super::passthrough::{Kind, all_pages, as_list, forward, page, servers_with, unknown, until};
use super::session::ClientSession;
use super::state::GatewayState;

/// `prompts/list`.
pub(crate) async fn list(
    gw: &GatewayState,
    session: &ClientSession,
    params: Option<PaginatedRequestParams>,
    ctx: RequestContext<RoleServer>,
) -> Result<ListPromptsResult, ErrorData> {
    let until = until(gw, &ctx.meta);
    // Every server that could start is in the list: its first start is waited for, within
    // the request's deadline.
    gw.first_starts_by(until.at).await;
    let servers = servers_with(&gw.servers, Kind::Prompts);
    if let [server] = servers.as_slice() {
        let request = ClientRequest::ListPromptsRequest(ListPromptsRequest {
            method: Default::default(),
            params: page(params),
            extensions: Default::default(),
        });
        let mut result: ListPromptsResult = as_list(
            forward(session, server, request, &ctx, until).await?,
            "prompts/list",
        )?;
        result.prompts = expose(gw, server, result.prompts);
        return Ok(result);
    }
    let mut all = Vec::new();
    for server in &servers {
        match all_prompts(server, until).await {
            Ok(prompts) => all.extend(expose(gw, server, prompts)),
            Err(e) => tracing::warn!(server = %server.server_name(), error = %e.message,
                "prompts/list failed; its prompts are left out"),
        }
    }
    Ok(ListPromptsResult::with_all_items(all))
}

/// `prompts/get`: asked of the server that listed the prompt, under its own name.
pub(crate) async fn get(
    gw: &GatewayState,
    session: &ClientSession,
    mut params: GetPromptRequestParams,
    ctx: RequestContext<RoleServer>,
) -> Result<GetPromptResult, ErrorData> {
    super::call::needs_call(session, "get prompts")?;
    let until = until(gw, &ctx.meta);
    let Some((server, own)) = resolve(gw, &params.name, until).await else {
        return Err(unknown(format!("unknown prompt {:?}", params.name)));
    };
    params.name = own;
    params.meta = None;
    let request = ClientRequest::GetPromptRequest(GetPromptRequest::new(params));
    match forward(session, &server, request, &ctx, until).await? {
        ServerResult::GetPromptResult(r) => Ok(r),
        other => retype(other, "prompts/get"),
    }
}

/// The server and own name of an exposed prompt: the one that listed it; a name never listed
/// after reading the lists again: with `prefix`, the part before the first `__`; with one
/// server, that server.
pub(crate) async fn resolve(
    gw: &GatewayState,
    exposed: &str,
    until: Deadline,
) -> Option<(Arc<McpServer>, String)> {
    let found = |gw: &GatewayState| {
        let (server, own) = gw.routes.prompt(exposed)?;
        Some((gw.server(&server)?.clone(), own))
    };
    if let Some(hit) = found(gw) {
        return Some(hit);
    }
    // Not listed yet: read the lists.
    for server in servers_with(&gw.servers, Kind::Prompts) {
        if let Ok(prompts) = all_prompts(&server, until).await {
            expose(gw, &server, prompts);
        }
    }
    if let Some(hit) = found(gw) {
        return Some(hit);
    }
    if gw.opts.prefix {
        let (server, own) = exposed.split_once(PREFIX_SEPARATOR)?;
        return Some((gw.server(server)?.clone(), own.to_owned()));
    }
    match gw.servers.as_slice() {
        [only] => Some((only.clone(), exposed.to_owned())),
        _ => None,
    }
}

/// A server restarted: its prompts may have changed.
pub(crate) fn server_restarted(gw: &GatewayState, name: &str) {
    let offers_prompts = gw
        .server(name)
        .and_then(|s| s.info())
        .is_some_and(|i| i.capabilities.prompts.is_some());
    if offers_prompts {
        gw.broadcast(ServerNotification::PromptListChangedNotification(
            PromptListChangedNotification::default(),
        ));
    }
}

async fn all_prompts(server: &McpServer, until: Deadline) -> Result<Vec<Prompt>, ErrorData> {
    all_pages(
        server,
        until,
        "prompts/list",
        |params| {
            ClientRequest::ListPromptsRequest(ListPromptsRequest {
                method: Default::default(),
                params: Some(params),
                extensions: Default::default(),
            })
        },
        |page: ListPromptsResult| (page.prompts, page.next_cursor),
    )
    .await
}

/// A server's prompts under their exposed names, remembered for routing.
fn expose(gw: &GatewayState, server: &McpServer, prompts: Vec<Prompt>) -> Vec<Prompt> {
    let name: Arc<str> = server.server_name().into();
    prompts
        .into_iter()
        .map(|mut p| {
            let exposed = if gw.opts.prefix {
                format!("{name}{PREFIX_SEPARATOR}{}", p.name)
            } else {
                p.name.clone()
            };
            gw.routes.remember_prompt(&exposed, &name, &p.name);
            p.name = exposed;
            p
        })
        .collect()
}
