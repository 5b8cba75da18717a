//! Driving a turn: its calls run in parallel; its results come back **in call order, exactly one
//! per call**, whatever happened. Every call writes its result into its slot when it ends — on its
//! normal path or, if the caller went away, from its drop guard — so the turn's end is assembled
//! the same way in both cases.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use serde_json::Value;
use tokio::time::Instant;
use toolwarden_protocol::{
    CallId, CallResult, CancelReason, Content, EventKind, Outcome, Status, TurnResults,
};

use crate::call::{CallJob, run_call};
use crate::store;
use crate::text::outcome_text;

use super::request::FinishedTurn;
use super::runtime::TurnRuntime;
use super::state::TurnState;

/// Runs every call of `turn` and assembles its end. Dropping this future aborts the turn's
/// remaining calls (as a client disconnect) and still records one result per call.
pub(crate) async fn drive_turn(
    rt: Arc<TurnRuntime>,
    turn: Arc<TurnState>,
    jobs: Vec<CallJob>,
) -> FinishedTurn {
    let guard = TurnGuard {
        rt: rt.clone(),
        turn: turn.clone(),
    };
    let (env, base) = (&rt.env, &turn.base);
    // Back-pressure: calls start once the audit trail's write queue has room.
    store::admit(env.store.as_ref()).await;
    if jobs.len() == 1 {
        for job in jobs {
            run_call(env, base, job).await;
        }
    } else {
        let mut running: FuturesUnordered<_> = jobs
            .into_iter()
            .map(|job| run_call(env, base, job))
            .collect();
        while running.next().await.is_some() {}
    }
    let finished = finalize(&rt, &turn);
    drop(guard);
    finished
}

/// Aborts and finalizes a turn whose driver was dropped mid-way.
struct TurnGuard {
    rt: Arc<TurnRuntime>,
    turn: Arc<TurnState>,
}

impl Drop for TurnGuard {
    fn drop(&mut self) {
        if !self.turn.finalized.load(Ordering::Acquire) {
            if self.turn.scope.cancel(CancelReason::ClientDisconnect) {
                self.rt.env.bus.emit(
                    self.turn.event_scope(),
                    EventKind::TurnAbort {
                        reason: CancelReason::ClientDisconnect,
                    },
                );
            }
            finalize(&self.rt, &self.turn);
        }
    }
}

/// Ends a turn exactly once: unregisters it, emits `turn_end` with one result per call in order.
fn finalize(rt: &TurnRuntime, turn: &TurnState) -> FinishedTurn {
    if turn.finalized.swap(true, Ordering::AcqRel) {
        return (Vec::new(), None);
    }
    // The turn ends when its last call did; a call that never ended (the turn was dropped) ends
    // it now.
    let mut last_end = Some(turn.base.started);
    let results: Vec<Arc<CallResult>> = turn
        .slots
        .iter()
        .map(|slot| match &*slot.result.lock() {
            Some((result, end)) => {
                last_end = last_end.map(|last| last.max(*end));
                result.clone()
            }
            None => {
                last_end = None;
                Arc::new(not_started(turn, slot.index))
            }
        })
        .collect();
    turn.base.close_stream();
    let now = last_end.unwrap_or_else(Instant::now);
    rt.unregister(turn, now);
    let outcome = if turn.scope.is_cancelled() {
        "aborted"
    } else if results.iter().all(|r| r.outcome.status == Status::Ok) {
        "completed"
    } else {
        "partial"
    };
    // Rendered once, for `turn_end` and the front door's answer alike.
    let rendered: Option<Arc<Vec<Value>>> = turn.render.as_ref().map(|render| {
        Arc::new(
            results
                .iter()
                .zip(&turn.calls)
                .map(|(r, c)| render(c, r))
                .collect(),
        )
    });
    rt.env
        .bus
        .emit_with_at(turn.event_scope(), now, || EventKind::TurnEnd {
            outcome: outcome.into(),
            results: match &rendered {
                Some(list) => TurnResults::Rendered(list.clone()),
                None => TurnResults::Results(results.clone()),
            },
        });
    rt.metrics.turn(outcome);
    (results, rendered)
}

/// The result of a call whose pipeline recorded nothing (cannot happen; kept total).
fn not_started(turn: &TurnState, index: usize) -> CallResult {
    let (call_id, tool) = turn.slots.get(index).map_or_else(
        || (CallId::from(""), Arc::<str>::from("")),
        |s| (s.call_id.clone(), s.tool.clone()),
    );
    let status = Status::Cancelled {
        reason: CancelReason::NotStarted,
    };
    CallResult {
        content: vec![Content::text(outcome_text(&tool, &status, None))],
        outcome: Outcome {
            status,
            attempts: 0,
            call_id,
            turn_id: turn.id().clone(),
            tool,
            duration_ms: 0,
            provenance: None,
            detail: None,
            repeat_count: None,
        },
        structured_content: None,
        is_error: true,
    }
}
