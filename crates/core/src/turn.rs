//! Turns: the ordered set of calls one model response asked for.
//!
//! A turn's calls run in parallel; its results come back **in call order, exactly one per call**,
//! whatever happened, and are also streamed one by one as they complete. Every call writes its
//! result into the turn when it ends — on its normal path or, if the caller went away, from its
//! drop guard — so the turn's end is assembled the same way in both cases.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use toolwarden_protocol::{
    ActiveCall, ActiveTurn, CallId, CallResult, CallState, CancelReason, EventKind, ProgressInfo,
    SessionId, Status, Timestamp, ToolCall, TurnCall, TurnId, TurnResults,
};

use crate::backend::ProgressRelay;
use crate::call::{CallJob, run_call};
use crate::cancel::Scope;
use crate::engine::EngineInner;
use crate::events::EventScope;
use crate::session::Session;

/// Turns a call's result into what a front door answers with (an Anthropic `tool_result` block,
/// an OpenAI tool message, ...). `turn_end` carries the rendered list.
pub type ResultRenderer = Arc<dyn Fn(&ToolCall, &CallResult) -> Value + Send + Sync>;

/// Receives every progress report of every call of a turn as it happens.
pub type CallProgress = Arc<dyn Fn(&CallId, &ProgressInfo) + Send + Sync>;

/// A turn to run.
#[derive(Clone, Default)]
pub struct TurnRequest {
    /// The session; a new one when absent (or the parent turn's, for a child turn).
    pub session_id: Option<SessionId>,
    /// The turn this one is a sub-agent of: aborting it aborts this one.
    pub parent_turn_id: Option<TurnId>,
    /// A caller-chosen id; generated (`t_<ULID>`) when absent.
    pub turn_id: Option<TurnId>,
    /// The calls, in order.
    pub calls: Vec<ToolCall>,
    /// How `turn_end` renders results (default: the `CallResult`s themselves).
    pub render: Option<ResultRenderer>,
    /// Live progress of the calls (the MCP gateway relays it to its client).
    pub progress: Option<CallProgress>,
}

impl std::fmt::Debug for TurnRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TurnRequest")
            .field("session_id", &self.session_id)
            .field("parent_turn_id", &self.parent_turn_id)
            .field("turn_id", &self.turn_id)
            .field("calls", &self.calls)
            .finish_non_exhaustive()
    }
}

impl TurnRequest {
    /// A turn of `calls` in `session`.
    pub fn new(session_id: impl Into<SessionId>, calls: Vec<ToolCall>) -> Self {
        Self {
            session_id: Some(session_id.into()),
            calls,
            ..Self::default()
        }
    }
}

/// Why a turn was refused before any call ran.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TurnError {
    /// No calls.
    #[error("a turn needs at least one call")]
    Empty,
    /// A call without an id.
    #[error("call {0} has an empty id")]
    EmptyCallId(usize),
    /// Two calls share an id.
    #[error("call id {0:?} appears more than once in the turn")]
    DuplicateCallId(CallId),
    /// The caller-chosen turn id is already running.
    #[error("turn {0} is already running")]
    DuplicateTurnId(TurnId),
}

/// A finished turn.
#[derive(Debug, Clone)]
pub struct TurnOutput {
    /// The turn.
    pub turn_id: TurnId,
    /// Its session.
    pub session_id: SessionId,
    /// One result per call, in call order (shared with the `tool_result` events).
    pub results: Vec<Arc<CallResult>>,
    /// The results as the turn's renderer made them (see [`TurnRequest::render`]), in call
    /// order: the same list `turn_end` carries, made once.
    pub rendered: Option<Arc<Vec<Value>>>,
}

/// How a turn ended: its results, and their rendering when it has a renderer.
pub(crate) type Finished = (Vec<Arc<CallResult>>, Option<Arc<Vec<Value>>>);

/// A call that completed: its index in the turn and its result.
pub(crate) type Completion = (usize, Arc<CallResult>);

/// One call's live state, as `GET /v1/turns/active` shows it.
pub(crate) struct SlotView {
    pub(crate) state: CallState,
    pub(crate) started: Option<Instant>,
    pub(crate) attempt: u32,
    pub(crate) progress: Option<ProgressInfo>,
    pub(crate) status: Option<&'static str>,
}

/// One call's place in its turn.
pub(crate) struct CallSlot {
    pub(crate) index: usize,
    pub(crate) call_id: CallId,
    pub(crate) tool: Arc<str>,
    pub(crate) scope: Scope,
    pub(crate) view: Mutex<SlotView>,
    /// The call's result, once it has one, and when it ended.
    pub(crate) result: Mutex<Option<(Arc<CallResult>, Instant)>>,
}

impl CallSlot {
    pub(crate) fn set_state(&self, state: CallState) {
        self.view.lock().state = state;
    }
}

/// A running turn.
pub(crate) struct TurnState {
    pub(crate) id: TurnId,
    pub(crate) session: Arc<Session>,
    pub(crate) parent: Option<TurnId>,
    pub(crate) scope: Scope,
    pub(crate) started_at: Timestamp,
    /// The monotonic instant of `started_at`: when the turn's calls arrived.
    pub(crate) started: Instant,
    /// The session and turn, as the turn's own events name them.
    pub(crate) scope_ids: Arc<EventScope>,
    pub(crate) slots: Vec<Arc<CallSlot>>,
    pub(crate) calls: Vec<ToolCall>,
    pub(crate) finalized: AtomicBool,
    pub(crate) render: Option<ResultRenderer>,
    pub(crate) progress: Option<CallProgress>,
    pub(crate) stream: Mutex<Option<mpsc::UnboundedSender<Completion>>>,
    /// Whether `stream` was ever set: a turn nobody streams never locks it.
    pub(crate) streaming: AtomicBool,
}

impl TurnState {
    /// Who the turn's own events are about (made once, shared by them).
    pub(crate) fn event_scope(&self) -> &Arc<EventScope> {
        &self.scope_ids
    }

    /// The progress relay of one call, if the turn has a listener.
    pub(crate) fn relay_for(&self, call_id: &CallId) -> Option<ProgressRelay> {
        let progress = self.progress.clone()?;
        let call_id = call_id.clone();
        Some(Arc::new(move |info: &ProgressInfo| {
            progress(&call_id, info)
        }))
    }

    /// A call's result (the call ended at `end`): kept in order and streamed.
    pub(crate) fn complete(&self, slot: &CallSlot, result: Arc<CallResult>, end: Instant) {
        if self.streaming.load(Ordering::Acquire)
            && let Some(tx) = &*self.stream.lock()
        {
            let _ = tx.send((slot.index, result.clone()));
        }
        *slot.result.lock() = Some((result, end));
    }

    /// `turn_start`: emitted when the turn is registered (and so can be aborted), before anything
    /// else about it.
    pub(crate) fn emit_start(&self, engine: &EngineInner) {
        engine
            .bus
            .emit_with_at(self.event_scope(), self.started, || EventKind::TurnStart {
                parent_turn_id: self.parent.clone(),
                calls: self
                    .slots
                    .iter()
                    .map(|s| TurnCall {
                        call_id: s.call_id.clone(),
                        tool: s.tool.clone(),
                    })
                    .collect(),
            });
    }

    pub(crate) fn view(&self) -> ActiveTurn {
        let now = Instant::now();
        ActiveTurn {
            turn_id: self.id.clone(),
            session_id: self.session.id.clone(),
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

/// Runs every call of `turn` and assembles its end. Dropping this future aborts the turn's
/// remaining calls (as a client disconnect) and still records one result per call.
pub(crate) async fn drive_turn(
    engine: Arc<EngineInner>,
    turn: Arc<TurnState>,
    jobs: Vec<CallJob>,
) -> Finished {
    let guard = TurnGuard {
        engine: engine.clone(),
        turn: turn.clone(),
    };
    // store: back-pressure — calls start once the audit trail's write queue has room.
    crate::store::admit(&engine).await;
    if jobs.len() == 1 {
        for job in jobs {
            run_call(engine.clone(), turn.clone(), job).await;
        }
    } else {
        let mut running: FuturesUnordered<_> = jobs
            .into_iter()
            .map(|job| run_call(engine.clone(), turn.clone(), job))
            .collect();
        while running.next().await.is_some() {}
    }
    let finished = finalize(&engine, &turn);
    drop(guard);
    finished
}

/// Aborts and finalizes a turn whose driver was dropped mid-way.
struct TurnGuard {
    engine: Arc<EngineInner>,
    turn: Arc<TurnState>,
}

impl Drop for TurnGuard {
    fn drop(&mut self) {
        if !self.turn.finalized.load(Ordering::Acquire) {
            if self.turn.scope.cancel(CancelReason::ClientDisconnect) {
                self.engine.bus.emit(
                    self.turn.event_scope(),
                    EventKind::TurnAbort {
                        reason: CancelReason::ClientDisconnect,
                    },
                );
            }
            finalize(&self.engine, &self.turn);
        }
    }
}

/// Ends a turn exactly once: unregisters it, emits `turn_end` with one result per call in order.
pub(crate) fn finalize(engine: &EngineInner, turn: &TurnState) -> Finished {
    if turn.finalized.swap(true, Ordering::AcqRel) {
        return (Vec::new(), None);
    }
    // The turn ends when its last call did; a call that never ended (the turn was dropped) ends
    // it now.
    let mut last_end = Some(turn.started);
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
                Arc::new(engine.synthetic_result(turn, slot.index))
            }
        })
        .collect();
    if turn.streaming.load(Ordering::Acquire) {
        *turn.stream.lock() = None;
    }
    let now = last_end.unwrap_or_else(Instant::now);
    engine.unregister_turn(turn, now);
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
    engine
        .bus
        .emit_with_at(turn.event_scope(), now, || EventKind::TurnEnd {
            outcome: outcome.into(),
            results: match &rendered {
                Some(list) => TurnResults::Rendered(list.clone()),
                None => TurnResults::Results(results.clone()),
            },
        });
    engine.metrics.turn(outcome);
    (results, rendered)
}

/// A turn running on its own task.
pub struct TurnHandle {
    turn_id: TurnId,
    session_id: SessionId,
    completions: mpsc::UnboundedReceiver<(usize, Arc<CallResult>)>,
    done: Option<oneshot::Receiver<Finished>>,
    abort_on_drop: Option<std::sync::Weak<EngineInner>>,
}

impl std::fmt::Debug for TurnHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TurnHandle")
            .field("turn_id", &self.turn_id)
            .finish_non_exhaustive()
    }
}

impl TurnHandle {
    pub(crate) fn new(
        turn_id: TurnId,
        session_id: SessionId,
        completions: mpsc::UnboundedReceiver<(usize, Arc<CallResult>)>,
        done: oneshot::Receiver<Finished>,
        engine: std::sync::Weak<EngineInner>,
    ) -> Self {
        Self {
            turn_id,
            session_id,
            completions,
            done: Some(done),
            abort_on_drop: Some(engine),
        }
    }

    /// The turn's id.
    pub fn turn_id(&self) -> &TurnId {
        &self.turn_id
    }

    /// The turn's session.
    pub fn session_id(&self) -> &SessionId {
        &self.session_id
    }

    /// The next call to complete, with its index; `None` when every call has completed.
    pub async fn next_completed(&mut self) -> Option<(usize, Arc<CallResult>)> {
        self.completions.recv().await
    }

    /// Waits for the turn to end: one result per call, in call order.
    pub async fn finish(mut self) -> TurnOutput {
        let (results, rendered) = match self.done.take() {
            Some(rx) => rx.await.unwrap_or_default(),
            None => (Vec::new(), None),
        };
        self.abort_on_drop = None;
        TurnOutput {
            turn_id: self.turn_id.clone(),
            session_id: self.session_id.clone(),
            results,
            rendered,
        }
    }

    /// Lets the turn run on when this handle is dropped (by default, dropping the handle aborts
    /// the turn as a client disconnect).
    pub fn detach(mut self) {
        self.abort_on_drop = None;
    }
}

impl Drop for TurnHandle {
    fn drop(&mut self) {
        if let Some(engine) = self.abort_on_drop.take().and_then(|w| w.upgrade()) {
            let _ = engine.abort_turn(&self.turn_id, CancelReason::ClientDisconnect);
        }
    }
}

/// Sets the completion stream of a turn before it starts.
pub(crate) fn stream_completions(
    turn: &TurnState,
) -> mpsc::UnboundedReceiver<(usize, Arc<CallResult>)> {
    let (tx, rx) = mpsc::unbounded_channel();
    *turn.stream.lock() = Some(tx);
    turn.streaming.store(true, Ordering::Release);
    rx
}
