//! Preparing a turn: the request is checked, its session found or made, its calls given their
//! slots and their places in the session's line (in call order, before anything runs), and the
//! turn registered so that it can be aborted before its first call starts.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::time::Instant;
use toolwarden_protocol::{Concurrency, SessionId, SessionKey, TurnId};

use crate::availability::PendingTool;
use crate::call::{CallJob, CallSlot, CallTurn, Target};
use crate::cancel::ScopeKind;
use crate::events::EventScope;
use crate::ids::{new_id, new_id_at};
use crate::policy::ToolOrigin;
use crate::registry::Registry;
use crate::servers::Servers;
use crate::trace::TurnContext;

use super::request::{TurnError, TurnRequest};
use super::runtime::TurnRuntime;
use super::state::TurnState;

/// Validates a turn request and registers the turn; the calls are ready to run.
pub(crate) fn prepare(
    rt: &TurnRuntime,
    registry: &Arc<Registry>,
    servers: &Arc<Servers>,
    req: TurnRequest,
) -> Result<(Arc<TurnState>, Vec<CallJob>), TurnError> {
    if req.calls.is_empty() {
        return Err(TurnError::Empty);
    }
    for (i, call) in req.calls.iter().enumerate() {
        if call.id.as_str().is_empty() {
            return Err(TurnError::EmptyCallId(i));
        }
        if req.calls[..i].iter().any(|c| c.id == call.id) {
            return Err(TurnError::DuplicateCallId(call.id.clone()));
        }
    }
    // A parent turn is one of the same principal's: another's is unknown here.
    let parent = req
        .parent_turn_id
        .as_ref()
        .and_then(|p| rt.turn(p))
        .filter(|p| p.base.session.key.principal == req.principal.name);
    let named = req
        .session_id
        .or_else(|| parent.as_ref().map(|p| p.base.session.key.id.clone()));
    // A turn that names no session gets one of its own, forgotten when the turn ends: nobody
    // can refer to it again, so nothing should pile up.
    let ephemeral = named.is_none();
    let session_id = named.unwrap_or_else(|| SessionId::new(new_id("s_")));
    let session = rt.session(SessionKey {
        principal: req.principal.name.clone(),
        id: session_id,
    });
    if ephemeral {
        session.ephemeral.store(true, Ordering::Relaxed);
    }
    let scope = match &parent {
        Some(p) => p.scope.child(ScopeKind::Turn),
        None => session.scope.child(ScopeKind::Turn),
    };
    // The turn's start: its monotonic instant (its calls' arrival) and the wall-clock time
    // of it, which also dates the turn's id.
    let started = Instant::now();
    let started_at = rt.env.bus.stamp(started);
    let turn_id = req
        .turn_id
        .unwrap_or_else(|| TurnId::new(new_id_at("t_", started_at)));
    // Kept only for a renderer, which reads each call beside its result.
    let kept_calls = if req.render.is_some() {
        req.calls.clone()
    } else {
        Vec::new()
    };
    let single = req.calls.len() == 1;
    let mut slots = Vec::with_capacity(req.calls.len());
    let mut jobs = Vec::with_capacity(req.calls.len());
    for (index, call) in req.calls.into_iter().enumerate() {
        let target = match (registry.get(&call.name), servers.awaited_for(&call.name)) {
            (Some(entry), _) => Target::Known(entry),
            (None, Some(server)) => Target::Pending(Box::new(PendingTool {
                name: call.name.clone(),
                policy: registry.provisional_policy(
                    &call.name,
                    &server.tool,
                    &ToolOrigin::Server(server.name.clone()),
                ),
                server,
                registry: registry.clone(),
                servers: servers.clone(),
            })),
            (None, None) => Target::Unknown {
                suggestion: registry.suggest(&call.name),
            },
        };
        let (entry, concurrency) = match &target {
            Target::Known(entry) => (Some(entry), Some(entry.policy.concurrency)),
            Target::Pending(p) => (None, Some(p.policy.concurrency)),
            Target::Unknown { .. } => (None, None),
        };
        // Places in the session's line are taken in call order, before anything runs.
        let ticket = concurrency.map(|c| session.gate.reserve(c == Concurrency::Exclusive));
        let slot = Arc::new(CallSlot::new(
            index,
            call.id.clone(),
            entry.map_or_else(|| call.name.as_str().into(), |e| e.name.clone()),
            // A one-call turn's call shares the turn's scope: aborting either is the same.
            if single {
                scope.clone()
            } else {
                scope.child(ScopeKind::Call)
            },
        ));
        slots.push(slot.clone());
        jobs.push(CallJob {
            slot,
            call,
            target,
            ticket,
        });
    }
    let trace = TurnContext::new(
        rt.env.export_spans,
        req.traceparent,
        parent.as_ref().and_then(|p| p.base.trace),
    );
    let mut base = CallTurn::new(
        turn_id.clone(),
        session.clone(),
        started,
        req.progress,
        trace,
    );
    base.scopes = req.principal.scopes;
    let turn = Arc::new(TurnState {
        base,
        parent: req.parent_turn_id,
        scope,
        started_at,
        scope_ids: Arc::new(EventScope {
            principal: Some(session.key.principal.clone()),
            session_id: Some(session.key.id.clone()),
            turn_id: Some(turn_id.clone()),
            call_id: None,
            tool: None,
        }),
        slots,
        calls: kept_calls,
        finalized: AtomicBool::new(false),
        render: req.render,
    });
    if !rt.register(&turn) {
        return Err(TurnError::DuplicateTurnId(turn_id));
    }
    turn.emit_start(&rt.env.bus);
    session.turn_started();
    Ok((turn, jobs))
}
