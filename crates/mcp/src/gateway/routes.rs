//! Passthrough of everything that is not a tool call, and where each request goes.
//!
//! - **Prompts** are named like tools: `SERVER__PROMPT` (unprefixed with `prefix = false`).
//! - **Resources** keep their URIs. A URI goes to the server that listed it; a URI nobody
//!   listed goes to the server whose template matches it; with one server, to that server.
//!   Otherwise the lists are read again (the client may have the URI from a tool result), and
//!   last, each server is asked in turn until one answers.
//! - **Templates** belong to the server that listed them (completion of a template's
//!   variable goes there).
//! - **Lists**: with one server, a list request is forwarded page by page with its cursor;
//!   with several, every page of every server is read and answered as one page. A server
//!   that fails to list is left out (and logged).
//! - **Subscriptions** are counted per URI: the server is subscribed when the first client
//!   subscribes and unsubscribed when the last one leaves (or its session ends); they are
//!   renewed when the server restarts. `notifications/resources/updated` goes to the clients
//!   subscribed to its URI.

#![allow(
    deprecated,
    reason = "logging and resources/subscribe are deprecated by SEP-2577 (MCP 2026-07-28), but \
              the session-based revisions the gateway speaks still use them"
)]

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;
use rmcp::ErrorData;
use rmcp::model::{
    ClientNotification, ClientRequest, CompleteRequest, CompleteRequestParams, CompleteResult,
    GetPromptRequest, GetPromptRequestParams, GetPromptResult, ListPromptsRequest,
    ListPromptsResult, ListResourceTemplatesRequest, ListResourceTemplatesResult,
    ListResourcesRequest, ListResourcesResult, PaginatedRequestParams, Prompt,
    PromptListChangedNotification, ReadResourceRequest, ReadResourceRequestParams,
    ReadResourceResult, Reference, RequestMetaObject, RequestOptionalParam, Resource,
    ResourceListChangedNotification, ResourceTemplate, RootsListChangedNotification,
    ServerNotification, ServerResult, SetLevelRequest, SetLevelRequestParams, SubscribeRequest,
    SubscribeRequestParams, UnsubscribeRequest, UnsubscribeRequestParams,
};
use rmcp::service::{RequestContext, RoleServer};
use tokio_util::sync::CancellationToken;
use toolwarden_core::PREFIX_SEPARATOR;
use toolwarden_protocol::SessionId;

use super::Gateway;
use super::session::ClientSession;
use crate::McpServer;
use crate::client::link::retype;

/// Where resources, templates and prompts live.
#[derive(Default)]
pub(crate) struct Routes {
    /// Resource URI → server.
    resources: Mutex<HashMap<String, Arc<str>>>,
    /// URI template → server.
    templates: Mutex<Vec<(String, Arc<str>)>>,
    /// Exposed prompt name → (server, the server's own name).
    prompts: Mutex<HashMap<String, (Arc<str>, String)>>,
    /// Resource URI → its server and the sessions subscribed to it.
    subscriptions: Mutex<HashMap<String, Subscribers>>,
}

/// A subscribed resource's server, and the sessions subscribed to it.
type Subscribers = (Arc<str>, BTreeSet<SessionId>);

/// Which capability a list needs.
#[derive(Clone, Copy)]
enum Kind {
    Prompts,
    Resources,
}

impl Routes {
    /// A session ended: its subscriptions go (and the servers' when it was the last).
    pub(crate) fn forget_session(&self, gw: &Gateway, session: &SessionId) {
        let mut emptied = Vec::new();
        {
            let mut subs = self.subscriptions.lock();
            subs.retain(|uri, (server, sessions)| {
                if sessions.remove(session) && sessions.is_empty() {
                    emptied.push((uri.clone(), server.clone()));
                    return false;
                }
                true
            });
        }
        for (uri, server) in emptied {
            if let Some(server) = gw.server(&server).cloned() {
                gw.tasks.spawn(async move {
                    let mut params = UnsubscribeRequestParams::new(uri);
                    params.meta = None;
                    let request =
                        ClientRequest::UnsubscribeRequest(UnsubscribeRequest::new(params));
                    let _ = server
                        .request(request, RequestMetaObject::new(), &CancellationToken::new())
                        .await;
                });
            }
        }
    }
}

/// The client's `_meta` for the server (rmcp sets its own progress token on each hop).
fn forward_meta(ctx: &RequestContext<RoleServer>) -> RequestMetaObject {
    let mut meta = ctx.meta.clone();
    meta.remove("progressToken");
    meta
}

fn page(params: Option<PaginatedRequestParams>) -> Option<PaginatedRequestParams> {
    params.map(|mut p| {
        p.meta = None;
        p
    })
}

fn unknown(what: String) -> ErrorData {
    ErrorData::invalid_params(what, None)
}

impl Gateway {
    /// The servers that offer `kind` (or whose capabilities are not known yet).
    fn servers_with(&self, kind: Kind) -> Vec<Arc<McpServer>> {
        self.servers
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

    fn exposed_prompt(&self, server: &str, own: &str) -> String {
        if self.opts.prefix {
            format!("{server}{PREFIX_SEPARATOR}{own}")
        } else {
            own.to_owned()
        }
    }

    /// Sends `request` to `server` for the request in `ctx`, cancelled with it.
    async fn forward(
        &self,
        session: &ClientSession,
        server: &McpServer,
        request: ClientRequest,
        ctx: &RequestContext<RoleServer>,
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
        let call = server.request(request, forward_meta(ctx), &cancel);
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

    // ---- prompts ------------------------------------------------------------------------

    pub(crate) async fn list_prompts(
        &self,
        session: &ClientSession,
        params: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        let servers = self.servers_with(Kind::Prompts);
        if let [server] = servers.as_slice() {
            let request = ClientRequest::ListPromptsRequest(ListPromptsRequest {
                method: Default::default(),
                params: page(params),
                extensions: Default::default(),
            });
            let mut result: ListPromptsResult = as_list(
                self.forward(session, server, request, &ctx).await?,
                "prompts/list",
            )?;
            result.prompts = self.expose_prompts(server, result.prompts);
            return Ok(result);
        }
        let mut all = Vec::new();
        for server in &servers {
            match self.all_prompts(server).await {
                Ok(prompts) => all.extend(self.expose_prompts(server, prompts)),
                Err(e) => tracing::warn!(server = %server.server_name(), error = %e.message,
                    "prompts/list failed; its prompts are left out"),
            }
        }
        Ok(ListPromptsResult::with_all_items(all))
    }

    async fn all_prompts(&self, server: &McpServer) -> Result<Vec<Prompt>, ErrorData> {
        all_pages(
            server,
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

    fn expose_prompts(&self, server: &McpServer, prompts: Vec<Prompt>) -> Vec<Prompt> {
        let name: Arc<str> = server.server_name().into();
        let mut routes = self.routes.prompts.lock();
        prompts
            .into_iter()
            .map(|mut p| {
                let exposed = self.exposed_prompt(&name, &p.name);
                if let Some((other, _)) = routes.get(&exposed)
                    && **other != *name
                {
                    tracing::warn!(prompt = %exposed, first = %other, second = %name,
                        "two servers list the same prompt name; the last listed wins");
                }
                routes.insert(exposed.clone(), (name.clone(), p.name.clone()));
                p.name = exposed;
                p
            })
            .collect()
    }

    /// The server and own name of an exposed prompt.
    async fn resolve_prompt(&self, exposed: &str) -> Option<(Arc<McpServer>, String)> {
        let found = |gw: &Gateway| {
            let routes = gw.routes.prompts.lock();
            let (server, own) = routes.get(exposed)?;
            Some((gw.server(server)?.clone(), own.clone()))
        };
        if let Some(hit) = found(self) {
            return Some(hit);
        }
        // Not listed yet: read the lists.
        for server in self.servers_with(Kind::Prompts) {
            if let Ok(prompts) = self.all_prompts(&server).await {
                self.expose_prompts(&server, prompts);
            }
        }
        if let Some(hit) = found(self) {
            return Some(hit);
        }
        if self.opts.prefix {
            let (server, own) = exposed.split_once(PREFIX_SEPARATOR)?;
            return Some((self.server(server)?.clone(), own.to_owned()));
        }
        match self.servers.as_slice() {
            [only] => Some((only.clone(), exposed.to_owned())),
            _ => None,
        }
    }

    pub(crate) async fn get_prompt(
        &self,
        session: &ClientSession,
        mut params: GetPromptRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<GetPromptResult, ErrorData> {
        let Some((server, own)) = self.resolve_prompt(&params.name).await else {
            return Err(unknown(format!("unknown prompt {:?}", params.name)));
        };
        params.name = own;
        params.meta = None;
        let request = ClientRequest::GetPromptRequest(GetPromptRequest::new(params));
        match self.forward(session, &server, request, &ctx).await? {
            ServerResult::GetPromptResult(r) => Ok(r),
            other => retype(other, "prompts/get"),
        }
    }

    // ---- resources ----------------------------------------------------------------------

    pub(crate) async fn list_resources(
        &self,
        session: &ClientSession,
        params: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let servers = self.servers_with(Kind::Resources);
        if let [server] = servers.as_slice() {
            let request = ClientRequest::ListResourcesRequest(ListResourcesRequest {
                method: Default::default(),
                params: page(params),
                extensions: Default::default(),
            });
            let result: ListResourcesResult = as_list(
                self.forward(session, server, request, &ctx).await?,
                "resources/list",
            )?;
            self.remember_resources(server, &result.resources);
            return Ok(result);
        }
        let mut all = Vec::new();
        for server in &servers {
            match self.all_resources(server).await {
                Ok(resources) => {
                    self.remember_resources(server, &resources);
                    all.extend(resources);
                }
                Err(e) => tracing::warn!(server = %server.server_name(), error = %e.message,
                    "resources/list failed; its resources are left out"),
            }
        }
        Ok(ListResourcesResult::with_all_items(all))
    }

    async fn all_resources(&self, server: &McpServer) -> Result<Vec<Resource>, ErrorData> {
        all_pages(
            server,
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

    fn remember_resources(&self, server: &McpServer, resources: &[Resource]) {
        let name: Arc<str> = server.server_name().into();
        let mut routes = self.routes.resources.lock();
        for r in resources {
            routes.insert(r.uri.clone(), name.clone());
        }
    }

    pub(crate) async fn list_resource_templates(
        &self,
        session: &ClientSession,
        params: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        let servers = self.servers_with(Kind::Resources);
        if let [server] = servers.as_slice() {
            let request =
                ClientRequest::ListResourceTemplatesRequest(ListResourceTemplatesRequest {
                    method: Default::default(),
                    params: page(params),
                    extensions: Default::default(),
                });
            let result: ListResourceTemplatesResult = as_list(
                self.forward(session, server, request, &ctx).await?,
                "resources/templates/list",
            )?;
            self.remember_templates(server, &result.resource_templates);
            return Ok(result);
        }
        let mut all = Vec::new();
        for server in &servers {
            match self.all_templates(server).await {
                Ok(templates) => {
                    self.remember_templates(server, &templates);
                    all.extend(templates);
                }
                Err(e) => tracing::warn!(server = %server.server_name(), error = %e.message,
                    "resources/templates/list failed; its templates are left out"),
            }
        }
        Ok(ListResourceTemplatesResult::with_all_items(all))
    }

    async fn all_templates(&self, server: &McpServer) -> Result<Vec<ResourceTemplate>, ErrorData> {
        all_pages(
            server,
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

    fn remember_templates(&self, server: &McpServer, templates: &[ResourceTemplate]) {
        let name: Arc<str> = server.server_name().into();
        let mut routes = self.routes.templates.lock();
        for t in templates {
            routes.retain(|(uri, _)| *uri != t.uri_template);
            routes.push((t.uri_template.clone(), name.clone()));
        }
    }

    /// The server of a resource URI by what was listed: its own listing, then a template.
    fn lookup_uri(&self, uri: &str) -> Option<Arc<McpServer>> {
        let by_listing = self.routes.resources.lock().get(uri).cloned();
        let server = by_listing.or_else(|| {
            self.routes
                .templates
                .lock()
                .iter()
                .find(|(template, _)| template_matches(template, uri))
                .map(|(_, server)| server.clone())
        })?;
        self.server(&server).cloned()
    }

    /// The server(s) to ask about a resource URI, best first.
    async fn servers_for_uri(&self, uri: &str) -> Vec<Arc<McpServer>> {
        if let Some(server) = self.lookup_uri(uri) {
            return vec![server];
        }
        let servers = self.servers_with(Kind::Resources);
        if servers.len() <= 1 {
            return servers;
        }
        // The client may know the URI from elsewhere (a tool's resource link): read the lists.
        for server in &servers {
            if let Ok(resources) = self.all_resources(server).await {
                self.remember_resources(server, &resources);
            }
            if let Ok(templates) = self.all_templates(server).await {
                self.remember_templates(server, &templates);
            }
        }
        match self.lookup_uri(uri) {
            Some(server) => vec![server],
            None => servers,
        }
    }

    pub(crate) async fn read_resource(
        &self,
        session: &ClientSession,
        mut params: ReadResourceRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResult, ErrorData> {
        params.meta = None;
        let servers = self.servers_for_uri(&params.uri).await;
        let mut last = None;
        for server in &servers {
            let request =
                ClientRequest::ReadResourceRequest(ReadResourceRequest::new(params.clone()));
            match self.forward(session, server, request, &ctx).await {
                Ok(ServerResult::ReadResourceResult(r)) => return Ok(r),
                Ok(other) => return retype(other, "resources/read"),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            ErrorData::resource_not_found(format!("no server serves {}", params.uri), None)
        }))
    }

    pub(crate) async fn subscribe(
        &self,
        session: &ClientSession,
        mut params: SubscribeRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        params.meta = None;
        let uri = params.uri.clone();
        let Some(server) = self.servers_for_uri(&uri).await.into_iter().next() else {
            return Err(ErrorData::resource_not_found(
                format!("no server serves {uri}"),
                None,
            ));
        };
        let first = {
            let subs = self.routes.subscriptions.lock();
            subs.get(&uri).is_none_or(|(_, s)| s.is_empty())
        };
        if first {
            let request = ClientRequest::SubscribeRequest(SubscribeRequest::new(params));
            self.forward(session, &server, request, &ctx).await?;
        }
        self.routes
            .subscriptions
            .lock()
            .entry(uri.clone())
            .or_insert_with(|| (server.server_name().into(), BTreeSet::new()))
            .1
            .insert(session.id.clone());
        session.subscribe(&uri);
        Ok(())
    }

    pub(crate) async fn unsubscribe(
        &self,
        session: &ClientSession,
        mut params: UnsubscribeRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        params.meta = None;
        let uri = params.uri.clone();
        session.unsubscribe(&uri);
        let last = {
            let mut subs = self.routes.subscriptions.lock();
            match subs.get_mut(&uri) {
                Some((server, sessions)) => {
                    sessions.remove(&session.id);
                    if sessions.is_empty() {
                        let server = server.clone();
                        subs.remove(&uri);
                        Some(server)
                    } else {
                        None
                    }
                }
                None => None,
            }
        };
        if let Some(server) = last.and_then(|s| self.server(&s).cloned()) {
            let request = ClientRequest::UnsubscribeRequest(UnsubscribeRequest::new(params));
            self.forward(session, &server, request, &ctx).await?;
        }
        Ok(())
    }

    // ---- completion, logging, roots -----------------------------------------------------

    pub(crate) async fn complete(
        &self,
        session: &ClientSession,
        mut params: CompleteRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        params.meta = None;
        let server = match &mut params.r#ref {
            Reference::Prompt(prompt) => {
                let Some((server, own)) = self.resolve_prompt(&prompt.name).await else {
                    return Err(unknown(format!("unknown prompt {:?}", prompt.name)));
                };
                prompt.name = own;
                server
            }
            Reference::Resource(resource) => {
                let listed = self
                    .routes
                    .templates
                    .lock()
                    .iter()
                    .find(|(t, _)| *t == resource.uri)
                    .and_then(|(_, s)| self.server(s).cloned());
                match listed {
                    Some(server) => server,
                    None => match self.servers_for_uri(&resource.uri).await.into_iter().next() {
                        Some(server) => server,
                        None => {
                            return Err(unknown(format!("unknown resource {:?}", resource.uri)));
                        }
                    },
                }
            }
            _ => return Err(unknown("unknown completion reference".into())),
        };
        let request = ClientRequest::CompleteRequest(CompleteRequest::new(params));
        match self.forward(session, &server, request, &ctx).await? {
            ServerResult::CompleteResult(r) => Ok(r),
            other => retype(other, "completion/complete"),
        }
    }

    pub(crate) async fn set_level(
        &self,
        session: &ClientSession,
        mut params: SetLevelRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        params.meta = None;
        let servers: Vec<Arc<McpServer>> = self
            .servers
            .iter()
            .filter(|s| s.info().is_none_or(|i| i.capabilities.logging.is_some()))
            .cloned()
            .collect();
        let mut last = None;
        let mut any = false;
        for server in &servers {
            let request = ClientRequest::SetLevelRequest(SetLevelRequest::new(params.clone()));
            match self.forward(session, server, request, &ctx).await {
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
    pub(crate) async fn roots_list_changed(&self) {
        for server in &self.servers {
            server
                .notify(ClientNotification::RootsListChangedNotification(
                    RootsListChangedNotification::default(),
                ))
                .await;
        }
    }

    // ---- server restarts ----------------------------------------------------------------

    /// A server restarted: its prompts and resources may have changed, and it forgot its
    /// subscriptions.
    pub(crate) fn server_restarted(&self, name: &str) {
        let Some(server) = self.server(name).cloned() else {
            return;
        };
        let caps = server.info().map(|i| i.capabilities.clone());
        if caps.as_ref().is_some_and(|c| c.prompts.is_some()) {
            self.broadcast(ServerNotification::PromptListChangedNotification(
                PromptListChangedNotification::default(),
            ));
        }
        if caps.as_ref().is_some_and(|c| c.resources.is_some()) {
            self.broadcast(ServerNotification::ResourceListChangedNotification(
                ResourceListChangedNotification::default(),
            ));
        }
        let uris: Vec<String> = self
            .routes
            .subscriptions
            .lock()
            .iter()
            .filter(|(_, (s, sessions))| **s == *name && !sessions.is_empty())
            .map(|(uri, _)| uri.clone())
            .collect();
        if uris.is_empty() {
            return;
        }
        self.tasks.spawn(async move {
            for uri in uris {
                let request = ClientRequest::SubscribeRequest(SubscribeRequest::new(
                    SubscribeRequestParams::new(uri.clone()),
                ));
                if let Err(e) = server
                    .request(request, RequestMetaObject::new(), &CancellationToken::new())
                    .await
                {
                    tracing::warn!(server = %server.server_name(), %uri, error = %e.message,
                        "renewing a subscription after a restart failed");
                }
            }
        });
    }

    /// The client sessions subscribed to `uri`.
    pub(crate) fn subscribers(&self, uri: &str) -> Vec<Arc<ClientSession>> {
        self.live_sessions()
            .into_iter()
            .filter(|s| s.is_subscribed(uri))
            .collect()
    }
}

/// A list answer as its type (rmcp may have parsed it as a structurally similar variant).
/// Every item of a paginated `*/list` request to one server, page after page: `request` makes
/// the request for a page, `split` takes a page apart into its items and the next cursor.
async fn all_pages<P, T>(
    server: &McpServer,
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

fn as_list<T: serde::de::DeserializeOwned>(
    result: ServerResult,
    what: &str,
) -> Result<T, ErrorData> {
    match result {
        ServerResult::EmptyResult(_) => retype(serde_json::json!({}), what),
        other => retype(other, what),
    }
}

/// Whether `uri` matches an RFC 6570 URI template: literal parts must match in order; each
/// `{...}` expression matches one or more characters (`{+x}`, `{#x}` and `{/x}` may include
/// `/`; a plain `{x}` may not).
pub(crate) fn template_matches(template: &str, uri: &str) -> bool {
    enum Part<'a> {
        Lit(&'a str),
        Var { slashes: bool },
    }
    let mut parts = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        if open > 0 {
            parts.push(Part::Lit(&rest[..open]));
        }
        let Some(close) = rest[open..].find('}') else {
            return false;
        };
        let expr = &rest[open + 1..open + close];
        parts.push(Part::Var {
            slashes: expr.starts_with(['+', '#', '/']),
        });
        rest = &rest[open + close + 1..];
    }
    if !rest.is_empty() {
        parts.push(Part::Lit(rest));
    }
    fn go(parts: &[Part<'_>], s: &str) -> bool {
        match parts.split_first() {
            None => s.is_empty(),
            Some((Part::Lit(lit), tail)) => s.strip_prefix(lit).is_some_and(|s| go(tail, s)),
            Some((Part::Var { slashes }, tail)) => {
                for (i, c) in s.char_indices() {
                    if c == '/' && !slashes {
                        break;
                    }
                    if go(tail, &s[i + c.len_utf8()..]) {
                        return true;
                    }
                }
                false
            }
        }
    }
    go(&parts, uri)
}

impl Gateway {
    /// Records that `session` called a tool of `server` (for routing the server's requests).
    pub(crate) fn note_client(&self, server: &Arc<str>, session: &Arc<ClientSession>) {
        self.last_client
            .lock()
            .insert(server.clone(), Arc::downgrade(session));
    }

    /// The client a server's request or notification goes to: the one whose call is running
    /// on that server (the most recent client of that server's calls when several are); else
    /// the most recent client of that server's calls; else the most recently active client.
    /// With it, the call the request belongs to, if one runs.
    pub(crate) fn route_client(
        &self,
        server: &str,
    ) -> Option<(Arc<ClientSession>, Option<String>)> {
        let live = self.live_sessions();
        let running: Vec<(Arc<ClientSession>, String, u64)> = live
            .iter()
            .filter_map(|s| {
                s.latest_call_on(server)
                    .map(|(call, seq)| (s.clone(), call, seq))
            })
            .collect();
        let last = self
            .last_client
            .lock()
            .get(server)
            .and_then(std::sync::Weak::upgrade)
            .filter(|s| !s.is_ended());
        match running.as_slice() {
            [(session, call, _)] => return Some((session.clone(), Some(call.clone()))),
            [] => {}
            several => {
                let pick = last
                    .as_ref()
                    .and_then(|l| several.iter().find(|(s, _, _)| Arc::ptr_eq(s, l)))
                    .or_else(|| several.iter().max_by_key(|(_, _, seq)| *seq));
                if let Some((session, call, _)) = pick {
                    return Some((session.clone(), Some(call.clone())));
                }
            }
        }
        if let Some(last) = last {
            return Some((last, None));
        }
        live.into_iter().next().map(|s| (s, None))
    }
}

#[cfg(test)]
mod tests {
    use super::template_matches;

    #[test]
    fn templates_match_like_rfc_6570() {
        assert!(template_matches("test://items/{id}", "test://items/42"));
        assert!(!template_matches("test://items/{id}", "test://items/"));
        assert!(!template_matches("test://items/{id}", "test://items/4/2"));
        assert!(template_matches("file:///{+path}", "file:///a/b/c.txt"));
        assert!(template_matches("x://{a}/y/{b}", "x://1/y/2"));
        assert!(!template_matches("x://{a}/y/{b}", "x://1/z/2"));
        assert!(template_matches("plain://fixed", "plain://fixed"));
        assert!(!template_matches("plain://fixed", "plain://fixed/more"));
    }
}
