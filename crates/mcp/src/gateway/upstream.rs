//! The upstream side: a server's own requests and notifications, on their way to a client.
//! Which client gets them is decided here: the one whose call runs on that server, else the
//! server's most recent caller, else the most recently active client; and a request goes out
//! only if that client declared what it needs.

#![allow(
    deprecated,
    reason = "sampling, roots and logging are deprecated by SEP-2577 (MCP 2026-07-28), but the \
              session-based revisions that clients speak still use them"
)]

use std::sync::Arc;

use futures::future::BoxFuture;
use rmcp::ErrorData;
use rmcp::model::{
    ClientResult, ElicitRequestParams, ErrorCode, ServerNotification, ServerRequest,
};
use tokio_util::sync::CancellationToken;

use super::session::ClientSession;
use super::state::GatewayState;
use crate::servers::link::{Upstream, no_client, server_request_method};

impl Upstream for GatewayState {
    fn request(
        &self,
        server: Arc<str>,
        request: ServerRequest,
        cancel: CancellationToken,
    ) -> BoxFuture<'static, Result<ClientResult, ErrorData>> {
        let method = server_request_method(&request);
        let Some((session, call)) = route_client(self, &server) else {
            return Box::pin(std::future::ready(Err(no_client(&method))));
        };
        if let Err(e) = supports(&session, &request, &method) {
            return Box::pin(std::future::ready(Err(e)));
        }
        tracing::debug!(%server, %method, session = %session.id, call = ?call,
            "forwarding a server's request to its client");
        Box::pin(async move {
            session
                .request(call.as_deref(), request, None, cancel)
                .await
        })
    }

    fn notify(&self, server: Arc<str>, notification: ServerNotification) {
        match &notification {
            ServerNotification::ResourceUpdatedNotification(n) => {
                self.listeners.deliver(&notification);
                let uri = &n.params.uri;
                for session in self.live_sessions() {
                    if session.is_subscribed(uri) {
                        session.notify(notification.clone());
                    }
                }
            }
            ServerNotification::LoggingMessageNotification(_)
            | ServerNotification::ResourceListChangedNotification(_)
            | ServerNotification::PromptListChangedNotification(_) => {
                self.broadcast(notification);
            }
            // Tool lists reach clients through the engine's tool set; progress and cancels
            // belong to requests and are handled by the backend.
            ServerNotification::ToolListChangedNotification(_)
            | ServerNotification::ProgressNotification(_)
            | ServerNotification::CancelledNotification(_) => {}
            _ => {
                if let Some((session, _)) = route_client(self, &server) {
                    session.notify(notification);
                }
            }
        }
    }
}

/// Records that `session` called a tool of `server` (for routing the server's requests).
pub(crate) fn note_client(gw: &GatewayState, server: &Arc<str>, session: &Arc<ClientSession>) {
    gw.last_client
        .lock()
        .insert(server.clone(), Arc::downgrade(session));
}

/// The client a server's request or notification goes to: the one whose call is running on
/// that server (the most recent client of that server's calls when several are); else the most
/// recent client of that server's calls; else the most recently active client. With it, the
/// call the request belongs to, if one runs.
fn route_client(gw: &GatewayState, server: &str) -> Option<(Arc<ClientSession>, Option<String>)> {
    let live = gw.live_sessions();
    let running: Vec<(Arc<ClientSession>, String, u64)> = live
        .iter()
        .filter_map(|s| {
            s.latest_call_on(server)
                .map(|(call, seq)| (s.clone(), call, seq))
        })
        .collect();
    let last = gw
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

/// Whether the client declared what the request needs; the error a client without it would
/// answer otherwise.
fn supports(
    session: &ClientSession,
    request: &ServerRequest,
    method: &str,
) -> Result<(), ErrorData> {
    let caps = session.capabilities();
    let caps = caps.as_deref();
    let ok = match request {
        ServerRequest::CreateMessageRequest(_) => caps.is_some_and(|c| c.sampling.is_some()),
        ServerRequest::ListRootsRequest(_) => caps.is_some_and(|c| c.roots.is_some()),
        ServerRequest::ElicitRequest(r) => {
            let elicitation = caps.and_then(|c| c.elicitation.as_ref());
            match &r.params {
                ElicitRequestParams::UrlElicitationParams { .. } => {
                    elicitation.is_some_and(|e| e.url.is_some())
                }
                // `elicitation: {}` means form.
                _ => elicitation.is_some_and(|e| e.form.is_some() || e.url.is_none()),
            }
        }
        _ => true,
    };
    if ok {
        Ok(())
    } else {
        Err(ErrorData::new(
            ErrorCode::METHOD_NOT_FOUND,
            format!("{method}: the connected MCP client does not support it"),
            None,
        ))
    }
}
