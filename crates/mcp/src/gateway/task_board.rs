//! The tasks this gateway runs for its clients, while it runs them: what each one's call last
//! said (progress, questions, its result), as events of the call come in. `super::tasks` makes
//! them and answers `tasks/get`, `tasks/update` and `tasks/cancel`; a task this board no longer
//! holds (another process ran it, or this one restarted) is read from the audit trail there.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rmcp::ErrorData;
use rmcp::model::{CallToolResult, InputRequest, InputRequests, InputResponses};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use toolwarden_protocol::{TaskRecord, Timestamp};

use super::flow_events::{Answer, EventReceiver, FlowEvent};
use super::parked::{KEEP_PARKED, read_answer};

/// The live tasks, by id.
#[derive(Default)]
pub(crate) struct TaskBoard {
    live: Mutex<HashMap<String, Arc<LiveTask>>>,
}

/// One task whose call runs (or ran) in this process.
pub(crate) struct LiveTask {
    pub(crate) record: TaskRecord,
    state: Mutex<TaskState>,
    /// Cancels the call as its client's leaving does (`cancelled{client_disconnect}`).
    cancel: CancellationToken,
    /// Fires once the call's result is in.
    finished: CancellationToken,
}

/// What a live task's call last said.
#[derive(Default)]
struct TaskState {
    progress: Option<Progress>,
    /// Questions of the call not answered yet, in the order asked.
    asked: BTreeMap<String, (InputRequest, Answer)>,
    /// Since when the call has had a question unanswered.
    asking_since: Option<Instant>,
    /// The call's answer, once it came, and when.
    result: Option<(Result<CallToolResult, ErrorData>, Instant)>,
    updated: Timestamp,
}

/// The last progress report of a task's call.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Progress {
    pub(crate) progress: f64,
    pub(crate) total: Option<f64>,
    pub(crate) message: Option<String>,
}

/// A live task as `tasks/get` sees it now.
pub(crate) enum Seen {
    Working,
    Asking(InputRequests),
    Done(Result<CallToolResult, ErrorData>),
}

/// A snapshot of a live task.
pub(crate) struct Snapshot {
    pub(crate) seen: Seen,
    pub(crate) progress: Option<Progress>,
    pub(crate) updated: Timestamp,
}

impl TaskBoard {
    /// Holds the task `record` whose call sends `events`, with the questions it has asked so
    /// far; follows the call on a task of its own until its result.
    pub(crate) fn adopt(
        &self,
        record: TaskRecord,
        asked: BTreeMap<String, (InputRequest, Answer)>,
        events: EventReceiver,
        cancel: CancellationToken,
        tasks: &tokio_util::task::TaskTracker,
    ) -> Arc<LiveTask> {
        let task = Arc::new(LiveTask {
            state: Mutex::new(TaskState {
                asking_since: (!asked.is_empty()).then(Instant::now),
                asked,
                updated: record.created_at,
                ..TaskState::default()
            }),
            record,
            cancel,
            finished: CancellationToken::new(),
        });
        self.live
            .lock()
            .insert(task.record.task_id.clone(), task.clone());
        tasks.spawn(follow(task.clone(), events));
        task
    }

    /// The live task of that id.
    pub(crate) fn get(&self, task_id: &str) -> Option<Arc<LiveTask>> {
        self.live.lock().get(task_id).cloned()
    }

    /// The live tasks made in session `session`, oldest first.
    pub(crate) fn of_session(
        &self,
        session: &toolwarden_protocol::SessionKey,
    ) -> Vec<Arc<LiveTask>> {
        let mut tasks: Vec<Arc<LiveTask>> = self
            .live
            .lock()
            .values()
            .filter(|t| {
                t.record.session_id.as_ref() == Some(&session.id)
                    && *t.record.principal == *session.principal
            })
            .cloned()
            .collect();
        tasks.sort_by(|a, b| a.record.task_id.cmp(&b.record.task_id));
        tasks
    }

    /// Forgets the tasks whose call ended more than their `ttl` ago, and cancels those whose
    /// question has waited for an answer longer than a parked call waits for its client.
    pub(crate) fn sweep(&self) {
        let now = Instant::now();
        self.live.lock().retain(|_, task| {
            let ttl = Duration::from_millis(task.record.ttl_ms);
            let state = task.state.lock();
            match &state.result {
                Some((_, ended)) => now.duration_since(*ended) < ttl,
                None => {
                    if state
                        .asking_since
                        .is_some_and(|since| now.duration_since(since) >= KEEP_PARKED)
                    {
                        task.cancel.cancel();
                    }
                    true
                }
            }
        });
    }
}

impl LiveTask {
    pub(crate) fn snapshot(&self) -> Snapshot {
        let state = self.state.lock();
        let seen = match &state.result {
            Some((result, _)) => Seen::Done(result.clone()),
            None if state.asked.is_empty() => Seen::Working,
            None => Seen::Asking(
                state
                    .asked
                    .iter()
                    .map(|(key, (request, _))| (key.clone(), request.clone()))
                    .collect(),
            ),
        };
        Snapshot {
            seen,
            progress: state.progress.clone(),
            updated: state.updated,
        }
    }

    /// Answers the questions `responses` names; how many it answered (an answer to a question
    /// not asked, or no longer asked, is ignored). A malformed answer is an error for the call.
    pub(crate) fn answer(&self, responses: InputResponses) -> usize {
        let mut state = self.state.lock();
        let mut answered = 0;
        for (key, value) in responses {
            if let Some((request, answer)) = state.asked.remove(&key) {
                let _ = answer.send(read_answer(&request, value));
                answered += 1;
            }
        }
        if answered > 0 {
            state.updated = Timestamp::now();
        }
        if state.asked.is_empty() {
            state.asking_since = None;
        }
        answered
    }

    /// Cancels the call as its client's leaving would (`cancelled{client_disconnect}`).
    pub(crate) fn abandon(&self) {
        self.cancel.cancel();
    }

    /// Whether the call's result is in.
    pub(crate) fn is_done(&self) -> bool {
        self.state.lock().result.is_some()
    }

    /// Resolves once the call's result is in.
    pub(crate) async fn done(&self) {
        self.finished.cancelled().await;
    }
}

/// Follows a task's call: each event updates what `tasks/get` answers.
async fn follow(task: Arc<LiveTask>, mut events: EventReceiver) {
    loop {
        let event = events.recv().await;
        let mut state = task.state.lock();
        state.updated = Timestamp::now();
        match event {
            Some(FlowEvent::Progress(param)) => {
                state.progress = Some(Progress {
                    progress: param.progress,
                    total: param.total,
                    message: param.message,
                });
            }
            Some(FlowEvent::Ask {
                key,
                request,
                answer,
            }) => {
                state.asked.insert(key, (request, answer));
                state.asking_since.get_or_insert_with(Instant::now);
            }
            Some(FlowEvent::Withdraw(key)) => {
                state.asked.remove(&key);
                if state.asked.is_empty() {
                    state.asking_since = None;
                }
            }
            Some(FlowEvent::Done(result)) => {
                state.asked.clear();
                state.asking_since = None;
                state.result = Some((result, Instant::now()));
                task.finished.cancel();
                return;
            }
            None => {
                let lost = ErrorData::internal_error("the call ended without a result", None);
                state.result = Some((Err(lost), Instant::now()));
                task.finished.cancel();
                return;
            }
        }
    }
}
