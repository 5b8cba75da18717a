//! Tasks toward clients (the `io.modelcontextprotocol/tasks` extension): a `tools/call` of a
//! stateless client that declared the extension is answered with a task instead of being held
//! open — at once with `task = "always"`, once the call has run `task_after` with `"auto"` — and
//! the client follows it with `tasks/get`, answers its questions with `tasks/update` and stops
//! it with `tasks/cancel`.
//!
//! The call already runs under its own policy (`rounds`); becoming a task (which puts it on a
//! task of its own, if it was not yet) only changes who follows it: instead of the request's
//! handler, the board (`task_board`), which keeps what the call last said for any later
//! request, from any client that knows the task's id. The task is recorded in the audit trail
//! before the answer goes out, naming the call's turn: once the board no longer holds it (after
//! a restart, or on another replica), its status and result are the turn's, as the trail has
//! them — a call that a restart cut off reads `failed` with the `interrupted` outcome.
//! `docs/GATEWAY.md`, "Tasks", has the rules.

use std::sync::Arc;
use std::time::Duration;

use rmcp::ErrorData;
use rmcp::model::{
    CallToolResult, CreateTaskResult, DetailedTask, GetTaskResult, JsonObject, MetaObject,
    RequestMetaObject, Task, TaskPayload, TaskStatus,
};
use serde_json::{Value, json};
use tokio::time::Instant;
use toolwarden_core::shared::{TaskAnswer, TaskAsk, TaskRequest};
use toolwarden_protocol::{
    CallId, CallResult, CancelReason, SessionKey, TaskMode, TaskRecord, Timestamp, TurnRunState,
};

use super::convert::{self, OUTCOME_META};
use super::options::STATUS_TOOL;
use super::parked::{Flow, TaskPlan};
use super::state::GatewayState;
use super::task_board::{LiveTask, Progress, Seen, Snapshot};

/// The `_meta` key of a task's last progress report in `tasks/get`.
pub(crate) const PROGRESS_META: &str = "toolwarden/progress";

/// How long a read of the trail waits for what was emitted before it to be committed.
const CATCH_UP: Duration = Duration::from_secs(2);

/// When the call of `tool` may become a task: never for a client that did not declare tasks,
/// nor for the gateway's own status tool; else as the tool's policy says.
pub(crate) fn plan(
    gw: &GatewayState,
    tool: &str,
    declared: bool,
    session: &SessionKey,
    call_id: String,
) -> Option<TaskPlan> {
    if !declared || tool == STATUS_TOOL {
        return None;
    }
    let policy = gw.engine.policy_of(tool)?;
    let after = match policy.task {
        TaskMode::Never => return None,
        TaskMode::Always => Duration::ZERO,
        TaskMode::Auto => policy.task_after,
    };
    Some(TaskPlan {
        at: Instant::now() + after,
        turn_id: toolwarden_core::Engine::new_turn_id(),
        call_id,
        tool: tool.to_owned(),
        session: session.clone(),
    })
}

/// Whether a call of `tool` may become a task at all (for a client that asks for one).
pub(crate) fn allowed(gw: &GatewayState, tool: &str) -> bool {
    tool != STATUS_TOOL
        && gw
            .engine
            .policy_of(tool)
            .is_some_and(|policy| !matches!(policy.task, TaskMode::Never))
}

/// Makes `flow`'s call a task: records it in the trail, then hands the call to the board. When
/// the trail cannot record it, the call stays with its request (which goes on waiting for it).
pub(crate) async fn start(
    gw: &GatewayState,
    mut flow: Flow,
) -> Result<CreateTaskResult, Box<Flow>> {
    let Some(plan) = flow.task.take() else {
        return Err(Box::new(flow));
    };
    // The board follows the call from now on: it runs on a task of its own (and goes on while
    // the task is recorded).
    flow.runner.detach();
    let record = TaskRecord {
        task_id: format!("task_{}", ulid::Ulid::new()),
        turn_id: plan.turn_id,
        call_id: CallId::from(plan.call_id.as_str()),
        principal: plan.session.principal.to_string(),
        session_id: Some(plan.session.id),
        tool: plan.tool,
        created_at: Timestamp::now(),
        ttl_ms: millis(gw.opts.task_ttl),
        poll_interval_ms: millis(gw.opts.task_poll_interval),
    };
    if let Some(store) = gw.engine.store()
        && let Err(e) = store.put_task(record.clone()).await
    {
        tracing::warn!(task = %record.task_id, error = %e,
            "the task could not be recorded; the request keeps waiting for the call");
        return Err(Box::new(flow));
    }
    tracing::debug!(task = %record.task_id, turn = %record.turn_id, tool = %record.tool,
        "a call became a task");
    let Flow {
        events,
        asked,
        cancel,
        ..
    } = flow;
    let task = gw
        .task_board
        .adopt(record, asked, events, cancel, &gw.tasks);
    let status = match task.snapshot().seen {
        Seen::Asking(_) => TaskStatus::InputRequired,
        _ => TaskStatus::Working,
    };
    Ok(CreateTaskResult::new(base(
        &task.record,
        status,
        task.record.created_at,
    )))
}

/// `tasks/get`: the task's status, its last progress and, once it has ended, its result.
pub(crate) async fn get(
    gw: &GatewayState,
    who: &str,
    task_id: &str,
) -> Result<GetTaskResult, ErrorData> {
    if let Some(task) = live_of(gw, who, task_id)? {
        return Ok(live(&task));
    }
    let record = stored(gw, who, task_id).await?;
    let Some(store) = gw.engine.store() else {
        return Err(unknown(task_id));
    };
    let read_turn = || async {
        store
            .turn(record.turn_id.clone())
            .await
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))
    };
    let mut turn = read_turn().await?;
    if turn
        .as_ref()
        .is_none_or(|t| t.state == TurnRunState::Running)
    {
        // What this process emitted may not be committed yet: wait for that, then look again.
        let _ = gw.engine.store_caught_up(CATCH_UP).await;
        turn = read_turn().await?;
    }
    let detailed = match turn {
        Some(turn) if turn.state == TurnRunState::Running => {
            // Another replica runs it (replicas sharing a trail): its live state comes from
            // there — a question it asks, its last progress — else the trail's `working`.
            if let Some(live) = live_elsewhere(gw, who, task_id).await {
                return Ok(live);
            }
            DetailedTask::new(
                base(&record, TaskStatus::Working, turn.started_at),
                TaskPayload::Working,
            )
        }
        Some(turn) => {
            let ended = turn.ended_at.unwrap_or(turn.started_at);
            if ended.plus(Duration::from_millis(record.ttl_ms)) < Timestamp::now() {
                return Err(unknown(task_id));
            }
            let result = turn
                .results
                .and_then(|r| serde_json::from_str::<Vec<CallResult>>(r.get()).ok())
                .and_then(|results| results.into_iter().next());
            let payload = match result {
                Some(result) => payload(Ok(convert::call_result(&result))),
                None => interrupted(&record),
            };
            DetailedTask::new(base(&record, TaskStatus::Working, ended), payload)
        }
        // Its turn never reached the trail: toolwarden stopped as the task was made.
        None => DetailedTask::new(
            base(&record, TaskStatus::Working, record.created_at),
            interrupted(&record),
        ),
    };
    Ok(GetTaskResult::new(detailed))
}

/// `tasks/update`: the client's answers to the questions the task's call asked.
pub(crate) async fn update(
    gw: &GatewayState,
    who: &str,
    task_id: &str,
    responses: rmcp::model::InputResponses,
) -> Result<(), ErrorData> {
    let Some(task) = live_of(gw, who, task_id)? else {
        stored(gw, who, task_id).await?;
        // Another replica may hold it: the answers go there through the shared state.
        let request = TaskRequest {
            task_id: task_id.to_owned(),
            principal: who.to_owned(),
            ask: TaskAsk::Update(
                serde_json::to_value(&responses)
                    .map_err(|e| ErrorData::invalid_params(e.to_string(), None))?,
            ),
        };
        return match gw.engine.answer_task_elsewhere(request).await {
            TaskAnswer::Done(_) => Ok(()),
            TaskAnswer::Refused(why) => Err(ErrorData::invalid_params(why, None)),
            TaskAnswer::NotFound => Err(ErrorData::invalid_params(
                format!(
                    "task {task_id} is held by no toolwarden that can be reached (its replica \
                     is gone, or a restart ended it): tasks/get says how it ended"
                ),
                None,
            )),
        };
    };
    answer_live(&task, task_id, responses).map_err(|why| ErrorData::invalid_params(why, None))
}

/// Hands `responses` to a live task; why not, when it asks none of them.
fn answer_live(
    task: &LiveTask,
    task_id: &str,
    responses: rmcp::model::InputResponses,
) -> Result<(), String> {
    if task.answer(responses) == 0 && !task.is_done() {
        return Err(format!(
            "task {task_id} asks none of the questions answered (see tasks/get)"
        ));
    }
    Ok(())
}

/// Another replica's request about a task this one may hold: its `tasks/update`, or its
/// `tasks/get` (answered with the task's live state).
pub(super) fn answer_here(gw: &GatewayState, request: &TaskRequest) -> TaskAnswer {
    let task = match live_of(gw, &request.principal, &request.task_id) {
        Ok(Some(task)) => task,
        _ => return TaskAnswer::NotFound,
    };
    let responses = match &request.ask {
        TaskAsk::Get => {
            return match serde_json::to_value(live(&task)) {
                Ok(state) => TaskAnswer::Done(Some(state)),
                Err(e) => TaskAnswer::Refused(format!("its state: {e}")),
            };
        }
        TaskAsk::Update(responses) => responses,
    };
    let responses = match serde_json::from_value(responses.clone()) {
        Ok(responses) => responses,
        Err(e) => return TaskAnswer::Refused(format!("answers: {e}")),
    };
    match answer_live(&task, &request.task_id, responses) {
        Ok(()) => TaskAnswer::Done(None),
        Err(why) => TaskAnswer::Refused(why),
    }
}

/// The live state of a task another replica holds, asked through the shared state; `None` when
/// no replica answers for it (it is gone: the trail says the rest).
async fn live_elsewhere(gw: &GatewayState, who: &str, task_id: &str) -> Option<GetTaskResult> {
    let request = TaskRequest {
        task_id: task_id.to_owned(),
        principal: who.to_owned(),
        ask: TaskAsk::Get,
    };
    match gw.engine.answer_task_elsewhere(request).await {
        TaskAnswer::Done(Some(state)) => serde_json::from_value(state)
            .map_err(|e| tracing::warn!(task = task_id, error = %e, "another replica's answer to tasks/get could not be read"))
            .ok(),
        _ => None,
    }
}

/// `tasks/cancel`: cancels the task's call (`cancelled{user}`), through the cancellation tree
/// down to its server.
pub(crate) async fn cancel(gw: &GatewayState, who: &str, task_id: &str) -> Result<(), ErrorData> {
    let ended = || ErrorData::invalid_params(format!("task {task_id} has already ended"), None);
    let Some(task) = live_of(gw, who, task_id)? else {
        // Another replica may run it: the abort goes there through the shared state.
        let record = stored(gw, who, task_id).await?;
        tracing::debug!(task = task_id, turn = %record.turn_id, "tasks/cancel, elsewhere");
        return gw
            .engine
            .abort_anywhere(
                &record.turn_id,
                Some(&record.call_id),
                CancelReason::User,
                None,
            )
            .await
            .map_err(|_| ended());
    };
    tracing::debug!(task = task_id, turn = %task.record.turn_id, "tasks/cancel");
    // The call's turn is registered as its task starts running, which may be just after the
    // task's answer went out: a cancel that comes that early waits for it.
    let deadline = Instant::now() + REGISTER_WAIT;
    loop {
        if task.is_done() {
            return Err(ended());
        }
        let aborted = gw.engine.abort_call(
            &task.record.turn_id,
            &task.record.call_id,
            CancelReason::User,
        );
        if aborted.is_ok() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            // Registered and ended in between: `tasks/get` tells how.
            return Err(ended());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// How long a `tasks/cancel` waits for a just-made task's call to be registered.
const REGISTER_WAIT: Duration = Duration::from_secs(2);

/// The record of a task the board does not hold, from the trail.
/// The task of that id in the trail, if `who` made it (another principal's is unknown to it).
async fn stored(gw: &GatewayState, who: &str, task_id: &str) -> Result<TaskRecord, ErrorData> {
    let Some(store) = gw.engine.store() else {
        return Err(unknown(task_id));
    };
    store
        .task(task_id.to_owned())
        .await
        .map_err(|e| ErrorData::internal_error(e.to_string(), None))?
        .filter(|record| record.principal == who)
        .ok_or_else(|| unknown(task_id))
}

/// The live task of that id: `None` when the board does not hold it, unknown when it is
/// another principal's.
fn live_of(
    gw: &GatewayState,
    who: &str,
    task_id: &str,
) -> Result<Option<Arc<LiveTask>>, ErrorData> {
    match gw.task_board.get(task_id) {
        Some(task) if task.record.principal != who => Err(unknown(task_id)),
        found => Ok(found),
    }
}

fn unknown(task_id: &str) -> ErrorData {
    ErrorData::invalid_params(
        format!("unknown task {task_id:?} (never made here, or its outcome is no longer kept)"),
        None,
    )
}

/// A task the board holds, as `tasks/get` answers it.
fn live(task: &LiveTask) -> GetTaskResult {
    let Snapshot {
        seen,
        progress,
        updated,
    } = task.snapshot();
    let mut base = base(&task.record, TaskStatus::Working, updated);
    if let Some(progress) = &progress {
        base.status_message = Some(status_message(progress));
    }
    let payload = match seen {
        Seen::Working => TaskPayload::Working,
        Seen::Asking(input_requests) => TaskPayload::InputRequired { input_requests },
        Seen::Done(result) => payload(result),
    };
    let mut result = GetTaskResult::new(DetailedTask::new(base, payload));
    if let Some(progress) = progress {
        let mut meta = MetaObject::new();
        meta.insert(
            PROGRESS_META.into(),
            json!({"progress": progress.progress, "total": progress.total,
                   "message": progress.message}),
        );
        result.meta = Some(meta);
    }
    result
}

/// The task's fields but its status (which its payload sets).
fn base(record: &TaskRecord, status: TaskStatus, updated: Timestamp) -> Task {
    Task::new(
        record.task_id.clone(),
        status,
        record.created_at.to_string(),
        updated.to_string(),
    )
    .with_ttl_ms(record.ttl_ms)
    .with_poll_interval_ms(record.poll_interval_ms)
}

/// A progress report as a status message: its message, else `progress/total`.
fn status_message(progress: &Progress) -> String {
    match (&progress.message, progress.total) {
        (Some(message), _) => message.clone(),
        (None, Some(total)) => format!("{}/{}", progress.progress, total),
        (None, None) => format!("{}", progress.progress),
    }
}

/// How a call's answer reads as a task: a cancel by the user (`tasks/cancel`, or an abort) is
/// `cancelled`; an `interrupted` outcome, or a JSON-RPC error, is `failed`; every other result
/// — also a governed failure with `isError: true`, as the client would have had it — is
/// `completed`.
fn payload(result: Result<CallToolResult, ErrorData>) -> TaskPayload {
    let result = match result {
        Ok(result) => result,
        Err(error) => {
            return TaskPayload::Failed {
                error: object(serde_json::to_value(&error).unwrap_or(Value::Null)),
            };
        }
    };
    let outcome = result
        .meta
        .as_ref()
        .and_then(|m| m.get(OUTCOME_META))
        .cloned()
        .unwrap_or(Value::Null);
    match outcome.get("status").and_then(Value::as_str) {
        Some("cancelled") if outcome.get("reason").and_then(Value::as_str) == Some("user") => {
            TaskPayload::Cancelled
        }
        Some("interrupted") => {
            let message = result
                .content
                .iter()
                .find_map(|c| c.as_text().map(|t| t.text.clone()))
                .unwrap_or_else(|| "toolwarden stopped while the call ran".to_owned());
            TaskPayload::Failed {
                error: object(json!({
                    "code": rmcp::model::ErrorCode::INTERNAL_ERROR.0,
                    "message": message,
                    "data": {OUTCOME_META: outcome},
                })),
            }
        }
        _ => TaskPayload::Completed {
            result: object(serde_json::to_value(&result).unwrap_or(Value::Null)),
        },
    }
}

/// A task whose call has no recorded result: it was cut off by a stop of toolwarden.
fn interrupted(record: &TaskRecord) -> TaskPayload {
    TaskPayload::Failed {
        error: object(json!({
            "code": rmcp::model::ErrorCode::INTERNAL_ERROR.0,
            "message": "toolwarden stopped (it crashed or was killed) while the task's call ran",
            "data": {OUTCOME_META: {
                "status": "interrupted",
                "call_id": record.call_id.as_str(),
                "turn_id": record.turn_id.as_str(),
                "tool": record.tool,
            }},
        })),
    }
}

fn object(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => map,
        other => {
            let mut map = JsonObject::new();
            map.insert("value".into(), other);
            map
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Whether a request's client declared the tasks extension.
pub(crate) fn declared(meta: &RequestMetaObject) -> bool {
    meta.client_capabilities()
        .is_some_and(|capabilities| capabilities.supports_tasks())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use rmcp::model::ContentBlock;

    /// A call's answer with `outcome` in its `_meta`.
    fn answer(outcome: Value) -> Result<CallToolResult, ErrorData> {
        let mut result = CallToolResult::success(vec![ContentBlock::text("said")]);
        let mut meta = MetaObject::new();
        meta.insert(OUTCOME_META.into(), outcome);
        result.meta = Some(meta);
        Ok(result)
    }

    fn check(result: Result<CallToolResult, ErrorData>, expected: TaskStatus) {
        assert_eq!(payload(result).status(), expected);
    }

    #[test]
    fn a_calls_answer_reads_as_the_tasks_status() {
        check(answer(json!({"status": "ok"})), TaskStatus::Completed);
        // Governed failures are results, as for a held request.
        check(
            answer(json!({"status": "timeout", "kind": "total", "after_ms": 5})),
            TaskStatus::Completed,
        );
        check(
            answer(json!({"status": "cancelled", "reason": "shutdown"})),
            TaskStatus::Completed,
        );
        // A person's cancel (tasks/cancel, an abort) is the task's cancel.
        check(
            answer(json!({"status": "cancelled", "reason": "user"})),
            TaskStatus::Cancelled,
        );
        // Cut off by a stop of toolwarden, or no result at all: failed.
        check(answer(json!({"status": "interrupted"})), TaskStatus::Failed);
        check(
            Err(ErrorData::invalid_params("refused", None)),
            TaskStatus::Failed,
        );
    }

    #[test]
    fn an_interrupted_call_fails_with_its_outcome() {
        let TaskPayload::Failed { error } = payload(answer(json!({"status": "interrupted"})))
        else {
            panic!("not failed");
        };
        assert_eq!(
            Value::Object(error),
            json!({"code": -32603, "message": "said",
                   "data": {"toolwarden/outcome": {"status": "interrupted"}}})
        );
    }

    #[test]
    fn progress_is_the_status_message() {
        let progress = |message: Option<&str>, total| Progress {
            progress: 2.0,
            total,
            message: message.map(str::to_owned),
        };
        assert_eq!(
            status_message(&progress(Some("step 2"), Some(4.0))),
            "step 2"
        );
        assert_eq!(status_message(&progress(None, Some(4.0))), "2/4");
        assert_eq!(status_message(&progress(None, None)), "2");
    }
}
