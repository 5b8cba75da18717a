//! The gateway's background tasks: what clients must hear that no request of theirs asked
//! about — a changed tool list, an approval answered elsewhere, a call that ended while its
//! approval was being asked, a server that restarted — and the end of idle stateless sessions.

use std::sync::{Arc, Weak};
use std::time::Duration;

use rmcp::model::ServerNotification;
use tokio_util::sync::CancellationToken;
use toolwarden_protocol::{EventKind, ServerStateKind};

use super::elicit::Elicitations;
use super::session::sweep_due;
use super::state::GatewayState;
use super::{prompts, resources};

/// Tells clients when the tool list they would get changed (a server's `list_changed`, a
/// restart, a tool registered or removed).
pub(crate) async fn tools(
    gateway: Weak<GatewayState>,
    mut changed: tokio::sync::watch::Receiver<u64>,
    closed: CancellationToken,
) {
    // What was last listed, so that a republished but identical list tells nobody.
    if let Some(gw) = gateway.upgrade() {
        gw.relist_tools();
    }
    loop {
        tokio::select! {
            _ = closed.cancelled() => return,
            r = changed.changed() => if r.is_err() { return },
        }
        // A server's list arrives as one change, a restart as several: let them settle.
        tokio::time::sleep(Duration::from_millis(20)).await;
        changed.mark_unchanged();
        let Some(gw) = gateway.upgrade() else { return };
        if gw.relist_tools() {
            tracing::debug!("the tool list changed: telling the clients");
            gw.broadcast(ServerNotification::ToolListChangedNotification(
                Default::default(),
            ));
        }
    }
}

/// Follows the engine's events: approvals answered elsewhere (their elicitation is
/// withdrawn), calls that ended (the same), servers that restarted (their prompts and
/// resources may have changed, and subscriptions are renewed).
pub(crate) async fn events(
    gateway: Weak<GatewayState>,
    elicitations: Arc<Elicitations>,
    mut events: toolwarden_core::Matching,
    closed: CancellationToken,
) {
    loop {
        let event = tokio::select! {
            _ = closed.cancelled() => return,
            r = events.recv() => match r { Some(event) => event, None => return },
        };
        let Some(gw) = gateway.upgrade() else { return };
        match &event.kind {
            EventKind::InteractionAnswered { interaction_id, .. }
            | EventKind::InteractionTimedOut { interaction_id, .. } => {
                elicitations.withdraw(interaction_id.as_str());
            }
            EventKind::ToolResult { .. } => {
                if let Some(call) = &event.scope.call_id {
                    elicitations.withdraw_of_call(&event.scope, call.as_str());
                }
            }
            EventKind::ServerState {
                server,
                state: ServerStateKind::Restarted,
                ..
            } => {
                prompts::server_restarted(&gw, server);
                resources::server_restarted(&gw, server);
            }
            _ => {}
        }
    }
}

/// Ends the sessions of stateless clients once idle (see `GatewayState::stateless_session`).
pub(crate) async fn stateless(
    gateway: Weak<GatewayState>,
    idle: Duration,
    closed: CancellationToken,
) {
    while sweep_due(idle, &closed).await {
        let Some(gw) = gateway.upgrade() else { return };
        gw.sweep_stateless(idle);
        gw.parked.sweep();
        gw.task_board.sweep();
    }
}
