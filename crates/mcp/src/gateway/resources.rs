//! `resources/*` through the gateway. Resources keep their URIs. A URI goes to the server that
//! listed it; a URI nobody listed goes to the server whose template matches it; with one
//! server, to that server. Otherwise the lists are read again (the client may have the URI from
//! a tool result), and last, each server is asked in turn until one answers. Templates belong
//! to the server that listed them.
//!
//! Subscriptions are counted per URI: the server is subscribed when the first client
//! subscribes and unsubscribed when the last one leaves (or its session ends); they are renewed
//! when the server restarts. `notifications/resources/updated` goes to the clients subscribed
//! to its URI (`upstream`).

#![allow(
    deprecated,
    reason = "resources/subscribe is deprecated by SEP-2577 (MCP 2026-07-28), but the \
              session-based revisions the gateway speaks still use it"
)]

use std::sync::Arc;

use crate::servers::Deadline;
use rmcp::ErrorData;
use rmcp::model::{
    ClientRequest, ListResourceTemplatesRequest, ListResourceTemplatesResult, ListResourcesRequest,
    ListResourcesResult, PaginatedRequestParams, ReadResourceRequest, ReadResourceRequestParams,
    ReadResourceResult, RequestMetaObject, RequestOptionalParam, Resource,
    ResourceListChangedNotification, ResourceTemplate, ServerNotification, ServerResult,
    SubscribeRequest, SubscribeRequestParams, UnsubscribeRequest, UnsubscribeRequestParams,
};
use rmcp::service::{RequestContext, RoleServer};
use tokio_util::sync::CancellationToken;

use crate::McpServer;
use crate::servers::link::retype;

use super::passthrough::{
    Kind, all_pages, as_list, forward, own_deadline, page, servers_with, until,
};
use super::session::ClientSession;
use super::state::GatewayState;

/// `resources/list`.
pub(crate) async fn list(
    gw: &GatewayState,
    session: &ClientSession,
    params: Option<PaginatedRequestParams>,
    ctx: RequestContext<RoleServer>,
) -> Result<ListResourcesResult, ErrorData> {
    let until = until(gw, &ctx.meta);
    // Every server that could start is in the list: its first start is waited for, within
    // the request's deadline.
    gw.first_starts_by(until.at).await;
    let servers = servers_with(&gw.servers, Kind::Resources);
    if let [server] = servers.as_slice() {
        let request = ClientRequest::ListResourcesRequest(ListResourcesRequest {
            method: Default::default(),
            params: page(params),
            extensions: Default::default(),
        });
        let result: ListResourcesResult = as_list(
            forward(session, server, request, &ctx, until).await?,
            "resources/list",
        )?;
        remember_resources(gw, server, &result.resources);
        return Ok(result);
    }
    let mut all = Vec::new();
    for server in &servers {
        match all_resources(server, until).await {
            Ok(resources) => {
                remember_resources(gw, server, &resources);
                all.extend(resources);
            }
            Err(e) => tracing::warn!(server = %server.server_name(), error = %e.message,
                "resources/list failed; its resources are left out"),
        }
    }
    Ok(ListResourcesResult::with_all_items(all))
}

/// `resources/templates/list`.
pub(crate) async fn list_templates(
    gw: &GatewayState,
    session: &ClientSession,
    params: Option<PaginatedRequestParams>,
    ctx: RequestContext<RoleServer>,
) -> Result<ListResourceTemplatesResult, ErrorData> {
    let until = until(gw, &ctx.meta);
    // Every server that could start is in the list: its first start is waited for, within
    // the request's deadline.
    gw.first_starts_by(until.at).await;
    let servers = servers_with(&gw.servers, Kind::Resources);
    if let [server] = servers.as_slice() {
        let request = ClientRequest::ListResourceTemplatesRequest(ListResourceTemplatesRequest {
            method: Default::default(),
            params: page(params),
            extensions: Default::default(),
        });
        let result: ListResourceTemplatesResult = as_list(
            forward(session, server, request, &ctx, until).await?,
            "resources/templates/list",
        )?;
        remember_templates(gw, server, &result.resource_templates);
        return Ok(result);
    }
    let mut all = Vec::new();
    for server in &servers {
        match all_templates(server, until).await {
            Ok(templates) => {
                remember_templates(gw, server, &templates);
                all.extend(templates);
            }
            Err(e) => tracing::warn!(server = %server.server_name(), error = %e.message,
                "resources/templates/list failed; its templates are left out"),
        }
    }
    Ok(ListResourceTemplatesResult::with_all_items(all))
}

/// `resources/read`.
pub(crate) async fn read(
    gw: &GatewayState,
    session: &ClientSession,
    mut params: ReadResourceRequestParams,
    ctx: RequestContext<RoleServer>,
) -> Result<ReadResourceResult, ErrorData> {
    super::call::needs_call(session, "read resources")?;
    params.meta = None;
    let until = until(gw, &ctx.meta);
    let servers = servers_for_uri(gw, &params.uri, until).await;
    let mut last = None;
    for server in &servers {
        let request = ClientRequest::ReadResourceRequest(ReadResourceRequest::new(params.clone()));
        match forward(session, server, request, &ctx, until).await {
            Ok(ServerResult::ReadResourceResult(r)) => return Ok(r),
            Ok(other) => return retype(other, "resources/read"),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        ErrorData::resource_not_found(format!("no server serves {}", params.uri), None)
    }))
}

/// `resources/subscribe`: the server hears it from the first subscriber only.
pub(crate) async fn subscribe(
    gw: &GatewayState,
    session: &ClientSession,
    mut params: SubscribeRequestParams,
    ctx: RequestContext<RoleServer>,
) -> Result<(), ErrorData> {
    super::call::needs_call(session, "subscribe to resources")?;
    params.meta = None;
    let uri = params.uri.clone();
    let until = until(gw, &ctx.meta);
    let Some(server) = servers_for_uri(gw, &uri, until).await.into_iter().next() else {
        return Err(ErrorData::resource_not_found(
            format!("no server serves {uri}"),
            None,
        ));
    };
    // Counted first, so that no other subscriber's leaving can unsubscribe the server while
    // this one subscribes it; the server hears the first subscriber only.
    let first = gw
        .routes
        .subscribe(&uri, &server.server_name().into(), &session.key());
    if first {
        let request = ClientRequest::SubscribeRequest(SubscribeRequest::new(params));
        if let Err(e) = forward(session, &server, request, &ctx, until).await {
            gw.routes.unsubscribe(&uri, &session.key());
            return Err(e);
        }
    }
    session.subscribe(&uri);
    Ok(())
}

/// `resources/unsubscribe`: the server hears it from the last subscriber only.
pub(crate) async fn unsubscribe(
    gw: &GatewayState,
    session: &ClientSession,
    mut params: UnsubscribeRequestParams,
    ctx: RequestContext<RoleServer>,
) -> Result<(), ErrorData> {
    params.meta = None;
    let uri = params.uri.clone();
    session.unsubscribe(&uri);
    let last = gw.routes.unsubscribe(&uri, &session.key());
    if let Some(server) = last.and_then(|s| gw.server(&s).cloned()) {
        let request = ClientRequest::UnsubscribeRequest(UnsubscribeRequest::new(params));
        forward(session, &server, request, &ctx, until(gw, &ctx.meta)).await?;
    }
    Ok(())
}

/// A server restarted: its resources may have changed, and it forgot its subscriptions.
pub(crate) fn server_restarted(gw: &GatewayState, name: &str) {
    let Some(server) = gw.server(name).cloned() else {
        return;
    };
    if server
        .info()
        .is_some_and(|i| i.capabilities.resources.is_some())
    {
        gw.broadcast(ServerNotification::ResourceListChangedNotification(
            ResourceListChangedNotification::default(),
        ));
    }
    let uris = gw.routes.subscribed_on(name);
    if uris.is_empty() {
        return;
    }
    let until = own_deadline(gw);
    gw.tasks.spawn(async move {
        for uri in uris {
            if let Err(e) = subscribe_server(&server, &uri, until).await {
                tracing::warn!(server = %server.server_name(), %uri, error = %e.message,
                    "renewing a subscription after a restart failed");
            }
        }
    });
}

/// Subscribes `server` to `uri` on the gateway's own behalf (a renewal, a stateless client's
/// `subscriptions/listen`), waiting at most `within`.
pub(crate) async fn subscribe_server(
    server: &McpServer,
    uri: &str,
    until: Deadline,
) -> Result<ServerResult, ErrorData> {
    let request = ClientRequest::SubscribeRequest(SubscribeRequest::new(
        SubscribeRequestParams::new(uri.to_owned()),
    ));
    server
        .request(
            request,
            RequestMetaObject::new(),
            &CancellationToken::new(),
            until,
        )
        .await
}

/// The server(s) to ask about a resource URI, best first; reading the lists again, if it must,
/// by `until`.
pub(crate) async fn servers_for_uri(
    gw: &GatewayState,
    uri: &str,
    until: Deadline,
) -> Vec<Arc<McpServer>> {
    if let Some(server) = lookup_uri(gw, uri) {
        return vec![server];
    }
    let servers = servers_with(&gw.servers, Kind::Resources);
    if servers.len() <= 1 {
        return servers;
    }
    // The client may know the URI from elsewhere (a tool's resource link): read the lists.
    for server in &servers {
        if let Ok(resources) = all_resources(server, until).await {
            remember_resources(gw, server, &resources);
        }
        if let Ok(templates) = all_templates(server, until).await {
            remember_templates(gw, server, &templates);
        }
    }
    match lookup_uri(gw, uri) {
        Some(server) => vec![server],
        None => servers,
    }
}

/// The server of a resource URI by what was listed: its own listing, then a template.
fn lookup_uri(gw: &GatewayState, uri: &str) -> Option<Arc<McpServer>> {
    let server = gw.routes.uri_server(uri)?;
    gw.server(&server).cloned()
}

async fn all_resources(server: &McpServer, until: Deadline) -> Result<Vec<Resource>, ErrorData> {
    all_pages(
        server,
        until,
        "resources/list",
        |params| {
            ClientRequest::ListResourcesRequest(ListResourcesRequest {
                method: Default::default(),
                params: Some(params),
                extensions: Default::default(),
            })
        },
        |page: ListResourcesResult| (page.resources, page.next_cursor),
    )
    .await
}

async fn all_templates(
    server: &McpServer,
    until: Deadline,
) -> Result<Vec<ResourceTemplate>, ErrorData> {
    all_pages(
        server,
        until,
        "resources/templates/list",
        |params| {
            ClientRequest::ListResourceTemplatesRequest(RequestOptionalParam {
                method: Default::default(),
                params: Some(params),
                extensions: Default::default(),
            })
        },
        |page: ListResourceTemplatesResult| (page.resource_templates, page.next_cursor),
    )
    .await
}

fn remember_resources(gw: &GatewayState, server: &McpServer, resources: &[Resource]) {
    let name: Arc<str> = server.server_name().into();
    for r in resources {
        gw.routes.remember_resource(&r.uri, &name);
    }
}

fn remember_templates(gw: &GatewayState, server: &McpServer, templates: &[ResourceTemplate]) {
    let name: Arc<str> = server.server_name().into();
    for t in templates {
        gw.routes.remember_template(&t.uri_template, &name);
    }
}
