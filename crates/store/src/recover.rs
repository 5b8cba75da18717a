//! Recovery, when a store opens: a process that died (crash, `kill -9`, power loss) left turns
//! without `turn_end` and calls without `tool_result`. Each such call gets a `tool_result` with the
//! `interrupted` outcome, and each such turn a `turn_end` (outcome `interrupted`) listing one
//! result per call, so that every call in the trail ends in exactly one outcome.

use std::sync::Arc;

use serde_json::Value;
use toolwarden_protocol::{
    CallResult, Content, Event, EventKind, EventScope, Outcome, SessionId, Status, Timestamp,
    TurnId, TurnResults,
};

/// One call of an unfinished turn, as the trail knows it.
pub(crate) struct OpenCall {
    pub(crate) call_id: String,
    pub(crate) tool: Option<String>,
    /// Its recorded result (the stored `tool_result`'s fields), if it has one.
    pub(crate) result: Option<Value>,
    pub(crate) started_at: Option<i64>,
    pub(crate) attempts: Option<u32>,
    pub(crate) ran: bool,
}

/// A turn a dead process left open, with its calls.
pub(crate) struct OpenTurn {
    pub(crate) turn_id: String,
    pub(crate) principal: String,
    pub(crate) session_id: Option<String>,
    pub(crate) calls: Vec<OpenCall>,
}

/// Who stopped while the calls ran, as the `interrupted` outcome's detail says.
pub(crate) enum Interruption<'a> {
    /// This process (or an earlier one of this replica): recorded when it started again.
    Restart,
    /// Another replica, declared dead when its lease ran out: recorded by this one.
    Dead {
        /// The dead replica's id.
        replica: &'a str,
        /// This replica's id.
        by: &'a str,
    },
}

impl Interruption<'_> {
    fn detail(&self, ran: bool) -> String {
        match (self, ran) {
            (Interruption::Restart, true) => "toolwarden stopped (it crashed or was killed) while the call ran; this was recorded when it started again".to_owned(),
            (Interruption::Restart, false) => "toolwarden stopped (it crashed or was killed) before the call's backend was invoked; it did not run".to_owned(),
            (Interruption::Dead { replica, by }, true) => format!(
                "replica {replica:?} stopped renewing its lease (it died, was killed, or lost the database) while the call ran; replica {by:?} recorded this"
            ),
            (Interruption::Dead { replica, by }, false) => format!(
                "replica {replica:?} stopped renewing its lease (it died, was killed, or lost the database) before the call's backend was invoked, so it did not run; replica {by:?} recorded this"
            ),
        }
    }
}

/// The events that end `turns`: an `interrupted` `tool_result` for each call without an outcome
/// and a `turn_end` for each turn, numbered after `seq` (which ends at the last). Also answers
/// how many calls were interrupted.
pub(crate) fn close_turns(
    seq: &mut u64,
    now: Timestamp,
    turns: Vec<OpenTurn>,
    why: &Interruption<'_>,
) -> (Vec<Event>, usize) {
    let mut events = Vec::new();
    let mut interrupted = 0;
    for turn in turns {
        let turn_id = TurnId::from(turn.turn_id.as_str());
        let session_id = turn.session_id.map(|s| SessionId::from(s.as_str()));
        let principal: Arc<str> = Arc::from(turn.principal);
        let mut results = Vec::with_capacity(turn.calls.len());
        for call in turn.calls {
            let result = match call.result {
                Some(result) => result,
                None => {
                    interrupted += 1;
                    *seq += 1;
                    let turn = (&principal, &turn_id, session_id.clone());
                    let (event, result) = interrupted_call(*seq, now, turn, &call, why);
                    events.push(event);
                    serde_json::to_value(&*result).unwrap_or(Value::Null)
                }
            };
            results.push(result);
        }
        *seq += 1;
        events.push(Event {
            seq: *seq,
            ts: now,
            scope: Arc::new(EventScope {
                principal: Some(principal.clone()),
                session_id: session_id.clone(),
                turn_id: Some(turn_id.clone()),
                call_id: None,
                tool: None,
            }),
            kind: EventKind::TurnEnd {
                outcome: "interrupted".into(),
                results: TurnResults::Rendered(Arc::new(results)),
            },
        });
    }
    (events, interrupted)
}

/// The calls its `turn_start` (`start`, the stored body) listed, as (call id, tool), in order.
pub(crate) fn listed_calls(start: Option<&str>) -> Vec<(String, Option<String>)> {
    let mut listed = Vec::new();
    if let Some(Value::Array(calls)) = start
        .and_then(|b| serde_json::from_str::<Value>(b).ok())
        .and_then(|mut v| v.get_mut("calls").map(Value::take))
    {
        for c in calls {
            if let Some(id) = c.get("call_id").and_then(Value::as_str) {
                let tool = c.get("tool").and_then(Value::as_str).map(str::to_owned);
                listed.push((id.to_owned(), tool));
            }
        }
    }
    listed
}

/// The calls listed first, in their order, each with its row when it has one; then the rows no
/// listing names.
pub(crate) fn merge_calls(
    listed: Vec<(String, Option<String>)>,
    mut rows: Vec<OpenCall>,
) -> Vec<OpenCall> {
    let mut out = Vec::with_capacity(listed.len().max(rows.len()));
    for (call_id, tool) in listed {
        match rows.iter().position(|r| r.call_id == call_id) {
            Some(i) => out.push(rows.remove(i)),
            None => out.push(OpenCall {
                call_id,
                tool,
                result: None,
                started_at: None,
                attempts: None,
                ran: false,
            }),
        }
    }
    out.extend(rows);
    out
}

/// A stored `tool_result`'s result fields (`outcome`, `content`, ...), as `turn_end` lists them.
pub(crate) fn stored_result(body: &str) -> Option<Value> {
    let Value::Object(mut map) = serde_json::from_str::<Value>(body).ok()? else {
        return None;
    };
    let mut result = serde_json::Map::new();
    for key in ["outcome", "content", "structured_content", "is_error"] {
        if let Some(v) = map.remove(key) {
            result.insert(key.to_owned(), v);
        }
    }
    Some(Value::Object(result))
}

fn interrupted_call(
    seq: u64,
    now: Timestamp,
    (principal, turn_id, session_id): (&Arc<str>, &TurnId, Option<SessionId>),
    call: &OpenCall,
    why: &Interruption<'_>,
) -> (Event, Arc<CallResult>) {
    let tool: Arc<str> = call.tool.as_deref().unwrap_or("").into();
    let status = Status::Interrupted;
    let detail = why.detail(call.ran);
    let duration_ms = call
        .started_at
        .map_or(0, |s| (now.unix_millis() - s).max(0) as u64);
    let result = Arc::new(CallResult {
        content: vec![Content::text(toolwarden_core::outcome_text(
            &tool,
            &status,
            Some(&detail),
        ))],
        outcome: Outcome {
            status,
            attempts: call.attempts.unwrap_or(u32::from(call.ran)),
            call_id: call.call_id.as_str().into(),
            turn_id: turn_id.clone(),
            tool: tool.clone(),
            duration_ms,
            provenance: None,
            detail: Some(detail),
            repeat_count: None,
        },
        structured_content: None,
        is_error: true,
    });
    let event = Event {
        seq,
        ts: now,
        scope: Arc::new(EventScope {
            principal: Some(principal.clone()),
            session_id,
            turn_id: Some(turn_id.clone()),
            call_id: Some(call.call_id.as_str().into()),
            tool: Some(tool),
        }),
        kind: EventKind::ToolResult {
            result: result.clone(),
            duration_ms,
        },
    };
    (event, result)
}
