//! The `task` tool and the task requests (`io.modelcontextprotocol/tasks`, SEP-2663).
//!
//! `task {ms, steps?, poll_ms?, ask?, ignore_cancel?}` works for `ms` in `steps` steps (default
//! 3). To a client that declared the tasks extension it answers at once with a task (its
//! `pollIntervalMs` is `poll_ms`, default 100) whose status message says `step I/N` as it goes;
//! to any other client it answers when done. With `ask`, after the first step the task goes
//! `input_required` with an elicitation keyed `confirm` and waits for `tasks/update`. The
//! result says `task done` (and the answer, with `ask`). `tasks/cancel` is recorded for the
//! `cancels` tool (reason `tasks/cancel`, the call's request id) and stops the work, unless
//! `ignore_cancel`, which keeps it running.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use parking_lot::Mutex;
use rmcp::ErrorData as McpError;
use rmcp::model::{
    CallToolResponse, CreateTaskResult, DetailedTask, ElicitRequest, InputRequest, InputRequests,
    InputResponses, JsonObject, Task, TaskPayload, TaskStatus,
};
use rmcp::service::{RequestContext, RoleServer};
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::state::State;
use crate::task_table::{Current, Entry, STAMP};
use crate::tools::{arg_u64, id_json, text, wire};

/// Runs the `task` tool: as a task when the client declared the extension, else inline.
pub(crate) async fn run(
    state: &Arc<State>,
    args: JsonObject,
    ctx: &RequestContext<RoleServer>,
) -> Result<CallToolResponse, McpError> {
    let ms = arg_u64(&args, "ms").unwrap_or(300);
    let steps = arg_u64(&args, "steps").unwrap_or(3).max(1);
    let poll_ms = arg_u64(&args, "poll_ms").unwrap_or(100);
    let ask = args.get("ask").and_then(Value::as_bool) == Some(true);
    let ignore_cancel = args.get("ignore_cancel").and_then(Value::as_bool) == Some(true);
    let supports_tasks = ctx
        .meta
        .client_capabilities()
        .or_else(|| ctx.client_capabilities())
        .is_some_and(|c| c.supports_tasks());
    if !supports_tasks {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        return Ok(CallToolResponse::Complete(text("task done")));
    }
    let id = format!(
        "task-{}",
        state.tasks.next.fetch_add(1, Ordering::SeqCst) + 1
    );
    let entry = Arc::new(Entry {
        request_id: id_json(&ctx.id),
        poll_ms,
        state: Mutex::new(Current {
            payload: TaskPayload::Working,
            message: None,
            responses: None,
        }),
        cancel: CancellationToken::new(),
        answered: Notify::new(),
    });
    state.tasks.all.lock().insert(id.clone(), entry.clone());
    let work = Work {
        entry: entry.clone(),
        ms,
        steps,
        ask,
        ignore_cancel,
    };
    tokio::spawn(work.run());
    let created = Task::new(id, TaskStatus::Working, STAMP, STAMP).with_poll_interval_ms(poll_ms);
    Ok(CallToolResponse::Task(CreateTaskResult::new(created)))
}

struct Work {
    entry: Arc<Entry>,
    ms: u64,
    steps: u64,
    ask: bool,
    ignore_cancel: bool,
}

impl Work {
    async fn run(self) {
        let step = Duration::from_millis(self.ms / self.steps);
        let stop = if self.ignore_cancel {
            CancellationToken::new()
        } else {
            self.entry.cancel.clone()
        };
        let mut answer = None;
        for i in 1..=self.steps {
            tokio::select! {
                _ = tokio::time::sleep(step) => {}
                _ = stop.cancelled() => return self.entry.set(TaskPayload::Cancelled, None),
            }
            self.entry.set(
                TaskPayload::Working,
                Some(format!("step {i}/{}", self.steps)),
            );
            if self.ask && i == 1 {
                match self.ask_confirm(&stop).await {
                    Some(a) => answer = Some(a),
                    None => return self.entry.set(TaskPayload::Cancelled, None),
                }
            }
        }
        let mut result = text(match &answer {
            Some(a) => format!("task done: {a}"),
            None => "task done".to_owned(),
        });
        if let Some(a) = answer {
            result.structured_content = Some(a);
        }
        let result = serde_json::to_value(result)
            .ok()
            .and_then(|v| v.as_object().cloned())
            .unwrap_or_default();
        self.entry.set(TaskPayload::Completed { result }, None);
    }

    /// Goes `input_required` and waits for the answer (`None`: cancelled).
    async fn ask_confirm(&self, stop: &CancellationToken) -> Option<Value> {
        let Ok(request) = wire(json!({
            "mode": "form",
            "message": "Go on?",
            "requestedSchema": {"type": "object", "properties": {"answer": {"type": "string"}}}
        })) else {
            return None;
        };
        let mut requests = InputRequests::new();
        requests.insert(
            "confirm".to_owned(),
            InputRequest::Elicitation(ElicitRequest::new(request)),
        );
        self.entry.set(
            TaskPayload::InputRequired {
                input_requests: requests,
            },
            Some("waiting for confirm".into()),
        );
        loop {
            let answered = self.entry.answered.notified();
            let responses = self.entry.state.lock().responses.take();
            if let Some(answer) = responses.as_ref().and_then(|r| r.get("confirm")) {
                self.entry
                    .set(TaskPayload::Working, Some("confirmed".into()));
                return Some(answer.clone());
            }
            tokio::select! {
                _ = answered => {}
                _ = stop.cancelled() => return None,
            }
        }
    }
}

/// `tasks/get`.
pub(crate) fn get(state: &State, id: &str) -> Result<DetailedTask, McpError> {
    Ok(state.tasks.get(id)?.detailed(id))
}

/// `tasks/update`.
pub(crate) fn update(state: &State, id: &str, responses: InputResponses) -> Result<(), McpError> {
    let entry = state.tasks.get(id)?;
    entry.state.lock().responses = Some(responses);
    entry.answered.notify_one();
    Ok(())
}

/// `tasks/cancel`: recorded for `cancels`, then the work is told to stop.
pub(crate) fn cancel(state: &State, id: &str) -> Result<(), McpError> {
    let entry = state.tasks.get(id)?;
    state.cancels.lock().push(json!({
        "requestId": entry.request_id,
        "reason": "tasks/cancel",
        "taskId": id,
    }));
    entry.cancel.cancel();
    Ok(())
}
