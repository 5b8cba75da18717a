//! Tasks from servers (the `io.modelcontextprotocol/tasks` extension, SEP-2663). The backend
//! declares the extension, so a server may answer a `tools/call` with a task instead of its
//! result. The attempt then follows the task:
//!
//! - it polls `tasks/get`, waiting the task's `pollIntervalMs` between polls (the latest
//!   value the server gave; 500 ms when it gives none);
//! - each change of status or status message is a heartbeat, relayed as progress whose
//!   message is the status message (or the status), so an idle deadline sees a task that moves;
//! - `input_required` is answered like an `input_required` result (`input`): the requests are
//!   asked of the client, and the answers go back with `tasks/update`;
//! - `completed` is the call's result, `failed` a rejection with the server's error, and a
//!   task the server cancelled by itself a transport error;
//! - on a cancel (the engine's: user, timeout, ...) it sends `tasks/cancel` and keeps polling
//!   until the task reaches a final status — the server stopped — or the forced stop: a task
//!   still running then is stuck, and the caller applies `on_stuck`.
//!
//! The polling is written against [`TaskServer`], so that its timing can be tested with paused
//! time against a fake server.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use rmcp::ServiceError;
use rmcp::model::{
    CallToolResult, CancelTaskParams, GetTaskParams, GetTaskResult, InputRequiredResult,
    InputResponses, JsonObject, Task, TaskPayload, TaskStatus, UpdateTaskParams,
};
use rmcp::service::{Peer, RoleClient};
use toolwarden_core::{AttemptError, Heartbeat, StopSignals, ToolOutput};
use toolwarden_protocol::ProgressInfo;

use super::convert::{service_error, tool_output};
use super::input;
use super::link::Link;

/// How long to wait between polls when the server suggests nothing.
pub(crate) const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(500);
/// The shortest wait between polls, whatever the server suggests.
const MIN_POLL_INTERVAL: Duration = Duration::from_millis(10);

/// The three task requests, as the follower needs them.
pub(crate) trait TaskServer: Send + Sync {
    fn get(&self, task_id: &str) -> BoxFuture<'_, Result<GetTaskResult, ServiceError>>;
    fn update(
        &self,
        task_id: &str,
        responses: InputResponses,
    ) -> BoxFuture<'_, Result<(), ServiceError>>;
    fn cancel(&self, task_id: &str) -> BoxFuture<'_, Result<(), ServiceError>>;
}

impl TaskServer for Peer<RoleClient> {
    fn get(&self, task_id: &str) -> BoxFuture<'_, Result<GetTaskResult, ServiceError>> {
        let params = GetTaskParams::new(task_id);
        Box::pin(self.get_task(params))
    }

    fn update(
        &self,
        task_id: &str,
        responses: InputResponses,
    ) -> BoxFuture<'_, Result<(), ServiceError>> {
        let params = UpdateTaskParams::new(task_id, responses);
        Box::pin(self.update_task(params))
    }

    fn cancel(&self, task_id: &str) -> BoxFuture<'_, Result<(), ServiceError>> {
        let params = CancelTaskParams::new(task_id);
        Box::pin(self.cancel_task(params))
    }
}

/// How following a task ended.
#[derive(Debug)]
pub(crate) enum Followed {
    /// The task ended before any stop: its result, or why it failed.
    Done(Result<ToolOutput, AttemptError>),
    /// Cancelled (at `since`), and the task reached a final status before the forced stop.
    /// `late` is `Some(is_error)` when it still completed or failed (a late answer).
    Stopped {
        late: Option<bool>,
        since: tokio::time::Instant,
    },
    /// Forced while the task still ran.
    Stuck,
}

/// Where the server's input requests go.
pub(crate) struct Asker<'a> {
    pub(crate) link: &'a Link,
    pub(crate) server: &'a Arc<str>,
}

/// Follows the task `created` to its end (see the module docs).
pub(crate) async fn follow(
    server: &dyn TaskServer,
    asker: Asker<'_>,
    created: Task,
    stop: &StopSignals,
    heartbeat: &Heartbeat,
) -> Followed {
    let id = created.task_id.clone();
    let mut seen = LastSeen::from(&created);
    let mut interval = poll_interval(&created);
    // Input requests already answered (keys are unique over the life of a task).
    let mut answered: Vec<String> = Vec::new();
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(interval) => {}
        }
        let got = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            got = server.get(&id) => got,
        };
        let detailed = match got {
            Ok(result) => result.task,
            Err(e) => return gave_up(server, &id, service_error(&e)).await,
        };
        interval = poll_interval(&detailed.task);
        if seen.changed(&detailed.task) {
            heartbeat.progress(seen.progress());
        }
        match detailed.payload {
            TaskPayload::Working => {}
            TaskPayload::InputRequired { input_requests } => {
                let fresh: rmcp::model::InputRequests = input_requests
                    .into_iter()
                    .filter(|(key, _)| !answered.contains(key))
                    .collect();
                if fresh.is_empty() {
                    continue;
                }
                answered.extend(fresh.keys().cloned());
                let asked = InputRequiredResult::from_input_requests(fresh);
                let retry = tokio::select! {
                    biased;
                    _ = stop.cancelled() => break,
                    retry = input::fulfil(asker.link, asker.server, asked) => retry,
                };
                let responses = match retry {
                    Ok(retry) => retry.responses.unwrap_or_default(),
                    Err(e) => return gave_up(server, &id, e).await,
                };
                heartbeat.beat();
                if let Err(e) = server.update(&id, responses).await {
                    return gave_up(server, &id, service_error(&e)).await;
                }
            }
            TaskPayload::Completed { result } => return Followed::Done(completed(result)),
            TaskPayload::Failed { error } => return Followed::Done(Err(failed(&error))),
            TaskPayload::Cancelled => {
                return Followed::Done(Err(AttemptError::Transport(
                    "the server cancelled the task".into(),
                )));
            }
            _ => {}
        }
    }
    stopping(server, &id, stop).await
}

/// The call gives up on the task with `error`: the task is stopped on the server too (best
/// effort, at most [`GIVE_UP_CANCEL_WAIT`]), so that no work goes on unseen — nor beside a retry.
async fn gave_up(server: &dyn TaskServer, id: &str, error: AttemptError) -> Followed {
    match tokio::time::timeout(GIVE_UP_CANCEL_WAIT, server.cancel(id)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::debug!(task = %id, error = %e, "tasks/cancel failed"),
        Err(_) => tracing::debug!(task = %id, "tasks/cancel was not answered"),
    }
    Followed::Done(Err(error))
}

/// How long a call that gives up on a server's task waits for its `tasks/cancel` to be taken.
const GIVE_UP_CANCEL_WAIT: Duration = Duration::from_secs(2);

/// After a cancel: `tasks/cancel`, then polls until a final status or the forced stop.
async fn stopping(server: &dyn TaskServer, id: &str, stop: &StopSignals) -> Followed {
    let since = tokio::time::Instant::now();
    let stopped = |late| Followed::Stopped { late, since };
    let cancel = tokio::select! {
        biased;
        _ = stop.forced() => return Followed::Stuck,
        sent = server.cancel(id) => sent,
    };
    if let Err(e) = cancel {
        tracing::debug!(task = %id, error = %e, "tasks/cancel failed");
    }
    loop {
        let got = tokio::select! {
            biased;
            _ = stop.forced() => return Followed::Stuck,
            got = server.get(id) => got,
        };
        let interval = match got {
            Ok(result) => {
                let interval = poll_interval(&result.task.task);
                match result.task.payload {
                    TaskPayload::Cancelled => return stopped(None),
                    TaskPayload::Failed { .. } => return stopped(Some(true)),
                    TaskPayload::Completed { result } => {
                        let is_error = completed(result).map_or(true, |out| out.is_error);
                        return stopped(Some(is_error));
                    }
                    _ => interval,
                }
            }
            // The server forgot the task or went away: nothing more to learn.
            Err(_) => return stopped(None),
        };
        tokio::select! {
            biased;
            _ = stop.forced() => return Followed::Stuck,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

/// The server's suggested poll interval, within [`MIN_POLL_INTERVAL`] and
/// [`MAX_POLL_INTERVAL`] (a long one would leave a finished task unseen, or the call's idle
/// deadline to expire between two polls).
fn poll_interval(task: &Task) -> Duration {
    task.poll_interval_ms
        .map_or(DEFAULT_POLL_INTERVAL, Duration::from_millis)
        .clamp(MIN_POLL_INTERVAL, MAX_POLL_INTERVAL)
}

/// The longest wait between two polls of a server's task, whatever the server suggests.
pub(crate) const MAX_POLL_INTERVAL: Duration = Duration::from_secs(5);

/// What the follower last saw, to tell a change.
struct LastSeen {
    status: TaskStatus,
    message: Option<String>,
}

impl LastSeen {
    fn from(task: &Task) -> Self {
        Self {
            status: task.status,
            message: task.status_message.clone(),
        }
    }

    fn changed(&mut self, task: &Task) -> bool {
        if task.status == self.status && task.status_message == self.message {
            return false;
        }
        self.status = task.status;
        self.message = task.status_message.clone();
        true
    }

    fn progress(&self) -> ProgressInfo {
        let message = self.message.clone().unwrap_or_else(|| {
            serde_json::to_value(self.status)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default()
        });
        ProgressInfo {
            progress: None,
            total: None,
            message: Some(message),
        }
    }
}

fn completed(result: JsonObject) -> Result<ToolOutput, AttemptError> {
    let result: CallToolResult = serde_json::from_value(serde_json::Value::Object(result))
        .map_err(|e| {
            AttemptError::Transport(format!("the task completed with a malformed result: {e}"))
        })?;
    tool_output(rmcp::model::ServerResult::CallToolResult(result))
}

fn failed(error: &JsonObject) -> AttemptError {
    let message = error
        .get("message")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("no message");
    let code = error
        .get("code")
        .map(ToString::to_string)
        .unwrap_or_default();
    AttemptError::Rejected(format!(
        "the server's task failed: {message} (JSON-RPC error {code})"
    ))
}

#[cfg(test)]
#[path = "task_tests.rs"]
mod tests;
