//! Spans from events: a turn's span from `turn_start` to `turn_end`, a call's from its arrival to
//! its `tool_result`, an attempt's from `tool_start` (or the end of the backoff before it) to the
//! `tool_retry` that follows it or the call's `tool_result`.
//!
//! This runs on the engine's event path (inside the bus's `record`), so it only moves `Arc`s and
//! small copies into a map and out again; names and attributes are made later, off the path, by
//! [`crate::encode`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use toolwarden_core::{attempt_span, call_span};
use toolwarden_protocol::{
    CallId, CallResult, Event, EventKind, EventScope, SpanId, Timestamp, TraceId, TurnId, TurnTrace,
};

/// A finished span, ready to be named and encoded.
#[derive(Clone, Debug)]
pub(crate) struct SpanRecord {
    pub(crate) trace_id: TraceId,
    pub(crate) span_id: SpanId,
    pub(crate) parent: Option<SpanId>,
    pub(crate) start: Timestamp,
    pub(crate) end: Timestamp,
    /// Who it is about (session, turn, call, tool), shared with the events.
    pub(crate) scope: Arc<EventScope>,
    pub(crate) what: What,
}

/// What a span stands for.
#[derive(Clone, Debug)]
pub(crate) enum What {
    /// A turn, with how it ended and its parent turn.
    Turn {
        outcome: std::borrow::Cow<'static, str>,
        parent_turn: Option<TurnId>,
        calls: usize,
    },
    /// A call and its result.
    Call { result: Arc<CallResult> },
    /// Attempt `n` of a call, and how it ended.
    Attempt { n: u32, end: AttemptSpanEnd },
}

/// How an attempt ended.
#[derive(Clone, Debug)]
pub(crate) enum AttemptSpanEnd {
    /// It failed and another attempt followed; what failed.
    Retried(String),
    /// It was the call's last: the call's result.
    Last(Arc<CallResult>),
}

struct OpenTurnSpan {
    trace: TurnTrace,
    start: Timestamp,
    parent_turn: Option<TurnId>,
    calls: usize,
}

struct OpenAttempt {
    n: u32,
    start: Timestamp,
}

/// Spans begun and not yet ended, by turn and by call.
#[derive(Default)]
pub(crate) struct Assembler {
    turns: HashMap<TurnId, OpenTurnSpan>,
    attempts: HashMap<(TurnId, CallId), OpenAttempt>,
}

impl Assembler {
    /// Takes one event; returns the spans it ends (at most two: an attempt and its call).
    pub(crate) fn take(&mut self, event: &Event, out: &mut Vec<SpanRecord>) {
        let scope = &event.scope;
        let Some(turn_id) = scope.turn_id.as_ref() else {
            return;
        };
        match &event.kind {
            EventKind::TurnStart {
                parent_turn_id,
                calls,
                trace: Some(trace),
            } if trace.sampled => {
                self.turns.insert(
                    turn_id.clone(),
                    OpenTurnSpan {
                        trace: *trace,
                        start: event.ts,
                        parent_turn: parent_turn_id.clone(),
                        calls: calls.len(),
                    },
                );
            }
            EventKind::TurnEnd { outcome, .. } => {
                let Some(turn) = self.turns.remove(turn_id) else {
                    return;
                };
                out.push(SpanRecord {
                    trace_id: turn.trace.trace_id,
                    span_id: turn.trace.span_id,
                    parent: turn.trace.parent_span_id,
                    start: turn.start,
                    end: event.ts,
                    scope: scope.clone(),
                    what: What::Turn {
                        outcome: outcome.clone(),
                        parent_turn: turn.parent_turn,
                        calls: turn.calls,
                    },
                });
            }
            EventKind::ToolStart { .. } => {
                let Some(call_id) = scope.call_id.as_ref() else {
                    return;
                };
                if self.turns.contains_key(turn_id) {
                    self.attempts.insert(
                        (turn_id.clone(), call_id.clone()),
                        OpenAttempt {
                            n: 1,
                            start: event.ts,
                        },
                    );
                }
            }
            EventKind::ToolRetry {
                attempt,
                delay_ms,
                cause,
            } => {
                let (Some(call_id), Some(turn)) = (scope.call_id.as_ref(), self.turns.get(turn_id))
                else {
                    return;
                };
                let call = call_span(turn.trace.span_id, call_id);
                let trace_id = turn.trace.trace_id;
                let key = (turn_id.clone(), call_id.clone());
                let next = OpenAttempt {
                    n: *attempt,
                    start: event.ts.plus(Duration::from_millis(*delay_ms)),
                };
                if let Some(ended) = self.attempts.insert(key, next) {
                    out.push(attempt_record(
                        trace_id,
                        call,
                        scope,
                        &ended,
                        event.ts,
                        AttemptSpanEnd::Retried(cause.clone()),
                    ));
                }
            }
            EventKind::ToolResult {
                result,
                duration_ms,
            } => {
                let Some(call_id) = scope.call_id.as_ref() else {
                    return;
                };
                // Removed whatever happens next: nothing of a call outlives its result.
                let last = self.attempts.remove(&(turn_id.clone(), call_id.clone()));
                let Some(turn) = self.turns.get(turn_id) else {
                    return;
                };
                let call = call_span(turn.trace.span_id, call_id);
                let trace_id = turn.trace.trace_id;
                let turn_span = turn.trace.span_id;
                let turn_start = turn.start;
                if let Some(last) = last {
                    out.push(attempt_record(
                        trace_id,
                        call,
                        scope,
                        &last,
                        event.ts,
                        AttemptSpanEnd::Last(result.clone()),
                    ));
                }
                // A call arrives with its turn; its duration runs from there.
                let arrived = Timestamp::from_unix_millis(
                    event.ts.unix_millis() - i64::try_from(*duration_ms).unwrap_or(0),
                );
                out.push(SpanRecord {
                    trace_id,
                    span_id: call,
                    parent: Some(turn_span),
                    start: arrived.max(turn_start),
                    end: event.ts,
                    scope: scope.clone(),
                    what: What::Call {
                        result: result.clone(),
                    },
                });
            }
            _ => {}
        }
    }
}

fn attempt_record(
    trace_id: TraceId,
    call: SpanId,
    scope: &Arc<EventScope>,
    open: &OpenAttempt,
    end: Timestamp,
    how: AttemptSpanEnd,
) -> SpanRecord {
    SpanRecord {
        trace_id,
        span_id: attempt_span(call, open.n),
        parent: Some(call),
        start: open.start.min(end),
        end,
        scope: scope.clone(),
        what: What::Attempt {
            n: open.n,
            end: how,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use toolwarden_protocol::{Outcome, Status, TurnCall, TurnResults};

    fn ev(ts: i64, scope: &Arc<EventScope>, kind: EventKind) -> Event {
        Event {
            seq: 0,
            ts: Timestamp::from_unix_millis(ts),
            scope: scope.clone(),
            kind,
        }
    }

    fn result(status: Status, attempts: u32) -> Arc<CallResult> {
        Arc::new(CallResult {
            outcome: Outcome {
                status,
                attempts,
                call_id: "c1".into(),
                turn_id: "t1".into(),
                tool: "srv__flaky".into(),
                duration_ms: 90,
                provenance: None,
                detail: None,
                repeat_count: None,
            },
            content: Vec::new(),
            structured_content: None,
            is_error: false,
        })
    }

    #[test]
    fn a_retried_call_gives_a_turn_a_call_and_two_attempts_in_order() {
        let trace = TurnTrace {
            trace_id: TraceId([7; 16]),
            span_id: SpanId([1; 8]),
            parent_span_id: Some(SpanId([9; 8])),
            sampled: true,
        };
        let turn_scope = Arc::new(EventScope {
            principal: Some("alice".into()),
            session_id: Some("s1".into()),
            turn_id: Some("t1".into()),
            call_id: None,
            tool: None,
        });
        let call_scope = Arc::new(EventScope {
            call_id: Some("c1".into()),
            tool: Some("srv__flaky".into()),
            ..(*turn_scope).clone()
        });
        let mut a = Assembler::default();
        let mut out = Vec::new();
        let calls = vec![TurnCall {
            call_id: "c1".into(),
            tool: "srv__flaky".into(),
        }];
        for e in [
            ev(
                1000,
                &turn_scope,
                EventKind::TurnStart {
                    parent_turn_id: None,
                    calls,
                    trace: Some(trace),
                },
            ),
            ev(
                1010,
                &call_scope,
                EventKind::ToolStart {
                    input: Arc::new(serde_json::json!({})),
                    timeout_ms: 0,
                    idle_timeout_ms: 0,
                },
            ),
            ev(
                1030,
                &call_scope,
                EventKind::ToolRetry {
                    attempt: 2,
                    delay_ms: 20,
                    cause: "transport: broken pipe".into(),
                },
            ),
            ev(
                1090,
                &call_scope,
                EventKind::ToolResult {
                    result: result(Status::Ok, 2),
                    duration_ms: 90,
                },
            ),
            ev(
                1091,
                &turn_scope,
                EventKind::TurnEnd {
                    outcome: "completed".into(),
                    results: TurnResults::Results(Vec::new()),
                },
            ),
        ] {
            a.take(&e, &mut out);
        }
        let call = call_span(trace.span_id, &"c1".into());
        let got: Vec<(SpanId, Option<SpanId>, i64, i64)> = out
            .iter()
            .map(|s| {
                (
                    s.span_id,
                    s.parent,
                    s.start.unix_millis(),
                    s.end.unix_millis(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (attempt_span(call, 1), Some(call), 1010, 1030),
                (attempt_span(call, 2), Some(call), 1050, 1090),
                (call, Some(trace.span_id), 1000, 1090),
                (trace.span_id, Some(SpanId([9; 8])), 1000, 1091),
            ]
        );
        assert!(
            matches!(&out[0].what, What::Attempt { n: 1, end: AttemptSpanEnd::Retried(c) } if c == "transport: broken pipe")
        );
        assert!(a.turns.is_empty() && a.attempts.is_empty());
    }

    #[test]
    fn an_unsampled_or_untraced_turn_makes_no_spans() {
        let scope = Arc::new(EventScope {
            turn_id: Some("t1".into()),
            ..EventScope::default()
        });
        let mut a = Assembler::default();
        let mut out = Vec::new();
        for trace in [
            None,
            Some(TurnTrace {
                trace_id: TraceId([7; 16]),
                span_id: SpanId([1; 8]),
                parent_span_id: None,
                sampled: false,
            }),
        ] {
            a.take(
                &ev(
                    1,
                    &scope,
                    EventKind::TurnStart {
                        parent_turn_id: None,
                        calls: Vec::new(),
                        trace,
                    },
                ),
                &mut out,
            );
            a.take(
                &ev(
                    2,
                    &scope,
                    EventKind::TurnEnd {
                        outcome: "completed".into(),
                        results: TurnResults::Results(Vec::new()),
                    },
                ),
                &mut out,
            );
        }
        assert!(out.is_empty());
    }
}
