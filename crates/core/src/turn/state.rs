//! A running turn: its calls' slots, its cancellation scope, and how it shows in
//! `GET /v1/turns/active`.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use tokio::time::Instant;
use toolwarden_protocol::{
    ActiveCall, ActiveTurn, EventKind, Timestamp, ToolCall, TurnCall, TurnId,
};

use crate::call::{CallSlot, CallTurn};
use crate::cancel::CancelScope;
use crate::events::{EventBus, EventScope};

use super::request::ResultRenderer;

/// A running turn.
pub(crate) struct TurnState {
    /// What its calls see of it: id, session, start, progress and completion streams.
    pub(crate) base: CallTurn,
    pub(crate) parent: Option<TurnId>,
    pub(crate) scope: CancelScope,
    pub(crate) started_at: Timestamp,
    /// The session and turn, as the turn's own events name them.
    pub(crate) scope_ids: Arc<EventScope>,
    pub(crate) slots: Vec<Arc<CallSlot>>,
    /// The calls, kept only for a renderer (which reads each call beside its result).
    pub(crate) calls: Vec<ToolCall>,
    pub(crate) finalized: AtomicBool,
    pub(crate) render: Option<ResultRenderer>,
}

impl TurnState {
    /// The turn's id.
    pub(crate) fn id(&self) -> &TurnId {
        &self.base.id
    }

    /// Who the turn's own events are about (made once, shared by them).
    pub(crate) fn event_scope(&self) -> &Arc<EventScope> {
        &self.scope_ids
    }

    /// `turn_start`: emitted when the turn is registered (and so can be aborted), before anything
    /// else about it.
    pub(crate) fn emit_start(&self, bus: &EventBus) {
        bus.emit_with_at(self.event_scope(), self.base.started, || {
            EventKind::TurnStart {
                parent_turn_id: self.parent.clone(),
                calls: self
                    .slots
                    .iter()
                    .map(|s| TurnCall {
                        call_id: s.call_id.clone(),
                        tool: s.tool.clone(),
                    })
                    .collect(),
                trace: self.base.trace.and_then(|t| t.turn_trace()),
            }
        });
    }

    pub(crate) fn view(&self) -> ActiveTurn {
        let now = Instant::now();
        ActiveTurn {
            turn_id: self.base.id.clone(),
            principal: self.base.session.key.principal.clone(),
            session_id: self.base.session.key.id.clone(),
            parent_turn_id: self.parent.clone(),
            started_at: self.started_at,
            calls: self
                .slots
                .iter()
                .map(|slot| {
                    let v = slot.view.lock();
                    ActiveCall {
                        call_id: slot.call_id.clone(),
                        tool: slot.tool.to_string(),
                        state: v.state,
                        elapsed_ms: v
                            .started
                            .map_or(0, |s| now.duration_since(s).as_millis() as u64),
                        attempt: v.attempt,
                        progress: v.progress.clone(),
                        status: v.status.map(str::to_owned),
                    }
                })
                .collect(),
        }
    }
}
