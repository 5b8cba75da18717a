//! The task follower against a fake server, in paused time: when it polls, what beats, what
//! ends it.
#![allow(clippy::expect_used, clippy::unwrap_used, reason = "tests")]

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use parking_lot::Mutex;
use pretty_assertions::assert_eq;
use rmcp::ServiceError;
use rmcp::model::{
    DetailedTask, GetTaskResult, InputResponses, JsonObject, Task, TaskPayload, TaskStatus,
};
use serde_json::json;
use tokio::time::Instant;
use toolwarden_core::{AttemptError, Heartbeat, StopSignals};
use toolwarden_protocol::{CancelReason, ProgressInfo};

use super::{Asker, Followed, TaskServer, follow};
use crate::servers::link::Link;

/// A server whose `tasks/get` answers come from a script, one per poll (the last repeats), and
/// which records when each request came.
#[derive(Default)]
struct Fake {
    script: Mutex<VecDeque<DetailedTask>>,
    log: Mutex<Vec<(Duration, String)>>,
    start: Mutex<Option<Instant>>,
}

impl Fake {
    fn new(script: Vec<DetailedTask>) -> Self {
        Self {
            script: Mutex::new(script.into()),
            start: Mutex::new(Some(Instant::now())),
            ..Default::default()
        }
    }

    fn note(&self, what: String) {
        let start = self.start.lock().expect("start");
        self.log.lock().push((start.elapsed(), what));
    }

    fn log(&self) -> Vec<(u64, String)> {
        self.log
            .lock()
            .iter()
            .map(|(t, w)| (t.as_millis() as u64, w.clone()))
            .collect()
    }
}

impl TaskServer for Fake {
    fn get(&self, task_id: &str) -> BoxFuture<'_, Result<GetTaskResult, ServiceError>> {
        self.note(format!("get {task_id}"));
        let mut script = self.script.lock();
        let next = if script.len() > 1 {
            script.pop_front()
        } else {
            script.front().cloned()
        };
        Box::pin(std::future::ready(Ok(GetTaskResult::new(
            next.expect("a scripted answer"),
        ))))
    }

    fn update(
        &self,
        task_id: &str,
        responses: InputResponses,
    ) -> BoxFuture<'_, Result<(), ServiceError>> {
        self.note(format!(
            "update {task_id} {}",
            serde_json::to_string(&responses).unwrap()
        ));
        Box::pin(std::future::ready(Ok(())))
    }

    fn cancel(&self, task_id: &str) -> BoxFuture<'_, Result<(), ServiceError>> {
        self.note(format!("cancel {task_id}"));
        Box::pin(std::future::ready(Ok(())))
    }
}

fn task(status: TaskStatus, message: Option<&str>, poll_ms: Option<u64>) -> Task {
    let mut t = Task::new("t1", status, "2026-11-24T00:00:00Z", "2026-11-24T00:00:00Z");
    t.status_message = message.map(str::to_owned);
    t.poll_interval_ms = poll_ms;
    t
}

fn working(message: Option<&str>, poll_ms: Option<u64>) -> DetailedTask {
    DetailedTask::new(
        task(TaskStatus::Working, message, poll_ms),
        TaskPayload::Working,
    )
}

fn completed(text: &str) -> DetailedTask {
    let result: JsonObject =
        serde_json::from_value(json!({"content": [{"type": "text", "text": text}]})).unwrap();
    DetailedTask::new(
        task(TaskStatus::Completed, None, None),
        TaskPayload::Completed { result },
    )
}

fn cancelled() -> DetailedTask {
    DetailedTask::new(
        task(TaskStatus::Cancelled, None, None),
        TaskPayload::Cancelled,
    )
}

fn heartbeat() -> (Heartbeat, Arc<Mutex<Vec<ProgressInfo>>>) {
    let seen: Arc<Mutex<Vec<ProgressInfo>>> = Arc::default();
    let sink = seen.clone();
    let hb = Heartbeat::new(Some(Arc::new(move |p: &ProgressInfo| {
        sink.lock().push(p.clone())
    })));
    (hb, seen)
}

fn messages(seen: &Mutex<Vec<ProgressInfo>>) -> Vec<String> {
    seen.lock()
        .iter()
        .map(|p| p.message.clone().unwrap_or_default())
        .collect()
}

/// Follows `created` on `fake` for the server `s`, with no client to ask, beating into `hb`.
async fn follow_on(fake: &Fake, created: Task, stop: &StopSignals, hb: &Heartbeat) -> Followed {
    let link = Link::default();
    let server: Arc<str> = "s".into();
    let asker = Asker {
        link: &link,
        server: &server,
    };
    follow(fake, asker, created, stop, hb).await
}

/// The same in a task of its own, so that the test can act while it runs.
fn spawn_follow(
    fake: &Arc<Fake>,
    created: Task,
    stop: &StopSignals,
) -> tokio::task::JoinHandle<Followed> {
    let (fake, stop) = (fake.clone(), stop.clone());
    tokio::spawn(async move {
        let (hb, _seen) = heartbeat();
        follow_on(&fake, created, &stop, &hb).await
    })
}

fn get_times(fake: &Fake) -> Vec<u64> {
    fake.log()
        .into_iter()
        .filter(|(_, w)| w.starts_with("get"))
        .map(|(t, _)| t)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn polls_at_the_servers_interval_beats_on_each_change_and_returns_the_result() {
    let fake = Fake::new(vec![
        working(Some("step 1"), Some(300)),
        working(Some("step 1"), Some(300)),
        working(Some("step 2"), Some(1000)),
        completed("done"),
    ]);
    let stop = StopSignals::new();
    let (hb, seen) = heartbeat();
    let created = task(TaskStatus::Working, None, Some(200));
    let followed = follow_on(&fake, created, &stop, &hb).await;
    let Followed::Done(Ok(out)) = followed else {
        panic!("expected the result, got {followed:?}")
    };
    assert_eq!(out.content[0].as_text(), Some("done"));
    // First after the created task's 200 ms, then at each answer's own interval.
    assert_eq!(get_times(&fake), vec![200, 500, 800, 1800]);
    // A beat for each change of status or message, none for a repeat.
    assert_eq!(messages(&seen), vec!["step 1", "step 2", "completed"]);
}

#[tokio::test(start_paused = true)]
async fn a_cancel_sends_tasks_cancel_and_ends_once_the_task_is_cancelled() {
    let fake = Arc::new(Fake::new(vec![working(None, Some(100))]));
    let stop = StopSignals::new();
    let running = spawn_follow(&fake, task(TaskStatus::Working, None, Some(100)), &stop);
    tokio::time::sleep(Duration::from_millis(250)).await;
    *fake.script.lock() = vec![working(None, Some(100)), cancelled()].into();
    stop.request_stop(CancelReason::Timeout);
    let followed = running.await.unwrap();
    assert!(
        matches!(followed, Followed::Stopped { late: None, .. }),
        "{followed:?}"
    );
    let log: Vec<String> = fake
        .log()
        .into_iter()
        .map(|(t, w)| format!("{t} {w}"))
        .collect();
    // Polls at 100 and 200; the cancel at 250 at once, then polls until cancelled.
    assert_eq!(
        log,
        vec![
            "100 get t1",
            "200 get t1",
            "250 cancel t1",
            "250 get t1",
            "350 get t1"
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_task_still_working_at_the_forced_stop_is_stuck() {
    let fake = Arc::new(Fake::new(vec![working(None, Some(100))]));
    let stop = StopSignals::new();
    let running = spawn_follow(&fake, task(TaskStatus::Working, None, None), &stop);
    tokio::time::sleep(Duration::from_millis(50)).await;
    stop.request_stop(CancelReason::User);
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.force();
    assert!(matches!(running.await.unwrap(), Followed::Stuck));
    assert!(fake.log().iter().any(|(_, w)| w == "cancel t1"));
}

#[tokio::test(start_paused = true)]
async fn input_required_with_nobody_to_ask_fails_the_call_and_cancels_the_task() {
    let ask: rmcp::model::InputRequests = serde_json::from_value(json!({
        "q": {"method": "elicitation/create", "params": {"mode": "form", "message": "ok?",
            "requestedSchema": {"type": "object", "properties": {}}}}
    }))
    .unwrap();
    let fake = Fake::new(vec![DetailedTask::new(
        task(TaskStatus::InputRequired, None, None),
        TaskPayload::InputRequired {
            input_requests: ask,
        },
    )]);
    let stop = StopSignals::new();
    let (hb, _seen) = heartbeat();
    let created = task(TaskStatus::Working, None, None);
    let followed = follow_on(&fake, created, &stop, &hb).await;
    let Followed::Done(Err(AttemptError::Rejected(why))) = followed else {
        panic!("expected a rejection, got {followed:?}")
    };
    assert!(why.contains("elicitation/create"), "{why}");
    assert!(fake.log().iter().any(|(_, w)| w == "cancel t1"));
}
