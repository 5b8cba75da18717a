//! `subscriptions/listen` (2026-07-28) toward stateless clients: the revision's one way to hear of
//! changes — the gateway's tool list, its servers' prompt and resource lists, and updates of the
//! resources a client names. rmcp acknowledges the filter (what was asked, as far as the
//! gateway's capabilities reach) and tags every notification with the stream's id; the gateway
//! keeps the stream open until the client closes it, and delivers what it already watches for
//! handshake clients. For resource updates it subscribes the resources' servers, counted with the
//! handshake clients' own subscriptions, and unsubscribes them when the last listener leaves.

use std::sync::Arc;

use rmcp::ErrorData;
use rmcp::service::SubscriptionContext;
use tokio_util::sync::CancellationToken;
use toolwarden_protocol::SessionKey;

use super::passthrough::own_deadline;
use super::resources;
use super::state::GatewayState;

/// Serves one stream until its client closes it (or the gateway goes): from the moment it is
/// acknowledged it takes what the gateway delivers; it subscribes the servers of the resources
/// it names (a server this one is the first subscriber of), then lets go of them.
pub(crate) async fn listen(
    gw: &Arc<GatewayState>,
    context: SubscriptionContext,
    shutdown: &CancellationToken,
) -> Result<(), ErrorData> {
    let key = SessionKey::new(
        gw.principal_of(
            context
                .request_context()
                .extensions
                .get::<http::request::Parts>(),
        )
        .name,
        format!("listen_{}", ulid::Ulid::new()),
    );
    gw.listeners
        .add(key.clone(), context.sink().clone(), &gw.tasks);
    let uris = context
        .accepted()
        .resource_subscriptions
        .clone()
        .unwrap_or_default();
    let until = own_deadline(gw);
    for uri in &uris {
        let Some(server) = resources::servers_for_uri(gw, uri, until)
            .await
            .into_iter()
            .next()
        else {
            tracing::debug!(%uri, "subscriptions/listen: no server serves this resource");
            continue;
        };
        if gw.routes.subscribe(uri, &server.server_name().into(), &key)
            && let Err(e) = resources::subscribe_server(&server, uri, until).await
        {
            tracing::warn!(server = %server.server_name(), %uri, error = %e.message,
                "subscribing a server for subscriptions/listen failed; its updates will not come");
        }
    }
    tokio::select! {
        () = context.cancelled() => {}
        () = shutdown.cancelled() => {}
        () = gw.closed.cancelled() => {}
    }
    gw.listeners.remove(&key);
    gw.forget_subscriber(&key);
    Ok(())
}
