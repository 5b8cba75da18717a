//! Calls of stateless (2026-07-28) clients waiting between two requests of their client, and
//! the way such a call reaches its client: [`RoundChannel`], the third `ClientChannel`. What
//! the call sends becomes events for whichever request of the client drives it (`rounds`).

#![allow(
    deprecated,
    reason = "sampling and roots are deprecated by SEP-2577 (MCP 2026-07-28), but a server may \
              still ask them during a call, and the revision carries them as input requests"
)]

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use parking_lot::Mutex;
use rmcp::ErrorData;
use rmcp::model::{
    CancelledNotificationParam, ClientResult, CreateMessageResult, ElicitResult, ErrorCode,
    InputRequest, ListRootsResult, ProgressNotificationParam, RequestId, ServerRequest,
};
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::channel::{ClientChannel, Sent};
use super::flow_events::{Answer, EventReceiver, EventSender, FlowEvent};
use super::options::ANSWER_ID_PREFIX;

/// How long a parked call whose result is in waits for its client to come back for it.
const KEEP_FINISHED: Duration = Duration::from_secs(60);

/// How long a call waits parked, at most, for its client's next request; then it is cancelled.
pub(crate) const KEEP_PARKED: Duration = Duration::from_secs(3600);

/// The way back to a stateless client: what the call sends becomes events for whichever of
/// the client's requests drives it now.
pub(crate) struct RoundChannel {
    events: EventSender,
    next: AtomicU64,
}

impl RoundChannel {
    pub(crate) fn new(events: EventSender) -> Self {
        Self {
            events,
            next: AtomicU64::new(1),
        }
    }
}

impl ClientChannel for RoundChannel {
    fn notify_progress(
        &self,
        param: ProgressNotificationParam,
    ) -> BoxFuture<'_, Result<(), String>> {
        let sent = self
            .events
            .send(FlowEvent::Progress(param))
            .map_err(|_| "the call's client is gone".to_owned());
        Box::pin(std::future::ready(sent))
    }

    fn send_request(&self, request: ServerRequest) -> BoxFuture<'_, Result<Sent, ErrorData>> {
        let request = match request {
            ServerRequest::ElicitRequest(r) => InputRequest::Elicitation(r),
            ServerRequest::CreateMessageRequest(r) => InputRequest::CreateMessage(r),
            ServerRequest::ListRootsRequest(r) => InputRequest::ListRoots(r),
            other => {
                let method = serde_json::to_value(&other)
                    .ok()
                    .and_then(|v| v.get("method").and_then(Value::as_str).map(str::to_owned))
                    .unwrap_or_default();
                return Box::pin(std::future::ready(Err(ErrorData::new(
                    ErrorCode::METHOD_NOT_FOUND,
                    format!("{method} cannot reach a stateless client"),
                    None,
                ))));
            }
        };
        let key = format!(
            "{ANSWER_ID_PREFIX}{}",
            self.next.fetch_add(1, Ordering::Relaxed)
        );
        let (tx, rx) = oneshot::channel();
        let sent = self
            .events
            .send(FlowEvent::Ask {
                key: key.clone(),
                request,
                answer: tx,
            })
            .map_err(|_| ErrorData::internal_error("the call's client is gone", None))
            .map(|()| Sent {
                id: RequestId::String(key.into()),
                answer: Box::pin(async move {
                    rx.await.unwrap_or_else(|_| {
                        Err(ErrorData::internal_error(
                            "the MCP client did not come back with an answer",
                            None,
                        ))
                    })
                }),
            });
        Box::pin(std::future::ready(sent))
    }

    fn withdraw(&self, param: CancelledNotificationParam) {
        if let Some(id) = param.request_id {
            let _ = self.events.send(FlowEvent::Withdraw(id.to_string()));
        }
    }
}

/// When and as what a call of a client that declared tasks becomes a task (`super::tasks`).
pub(crate) struct TaskPlan {
    /// From then on, the request driving the call is answered with a task.
    pub(crate) at: Instant,
    /// The call's turn (chosen before it started) and its id within it.
    pub(crate) turn_id: toolwarden_protocol::TurnId,
    pub(crate) call_id: String,
    pub(crate) tool: String,
    pub(crate) session: toolwarden_protocol::SessionKey,
}

/// A call of a stateless client between two of its requests (or being driven by one).
pub(crate) struct Flow {
    pub(crate) events: EventReceiver,
    /// The questions the client has not answered yet, in the order asked.
    pub(crate) asked: BTreeMap<String, (InputRequest, Answer)>,
    /// Cancels the call (its handler's `ct`).
    pub(crate) cancel: CancellationToken,
    pub(crate) runner: Runner,
    /// Set when the call may become a task.
    pub(crate) task: Option<TaskPlan>,
}

/// The call's own work (`call::call_tool`, then its `Event::Done`): driven by the request that
/// started it while that request waits for it ([`Runner::run`]), so a quick call costs no task
/// of its own and no hand-over between two tasks; on a task of its own from the moment nothing
/// may drive it — it is parked, becomes a task, or the request is dropped ([`Runner::detach`],
/// and when the runner is dropped) — and from then on exactly as if it had started there.
pub(crate) struct Runner(Run);

enum Run {
    Inline {
        call: Pin<Box<dyn Future<Output = ()> + Send>>,
        tasks: TaskTracker,
    },
    Spawned(JoinHandle<()>),
    Finished,
}

impl Runner {
    /// A call not started yet, driven by whoever [`run`](Self::run)s it until it is detached.
    pub(crate) fn inline(
        call: Pin<Box<dyn Future<Output = ()> + Send>>,
        tasks: &TaskTracker,
    ) -> Self {
        Runner(Run::Inline {
            call,
            tasks: tasks.clone(),
        })
    }

    /// A call already on a task of its own.
    pub(crate) fn spawned(task: JoinHandle<()>) -> Self {
        Runner(Run::Spawned(task))
    }

    /// Drives the call to its end while it is inline; never resolves once it is on its own task
    /// (its events tell how it goes on).
    pub(crate) async fn run(&mut self) {
        std::future::poll_fn(|cx| match &mut self.0 {
            Run::Inline { call, .. } => {
                let done = call.as_mut().poll(cx);
                if done.is_ready() {
                    self.0 = Run::Finished;
                }
                done
            }
            Run::Spawned(_) | Run::Finished => std::task::Poll::Pending,
        })
        .await;
    }

    /// Puts an inline call on a task of its own. Outside a runtime (it is shutting down) the
    /// call is dropped instead, which records its outcome as any dropped call does.
    pub(crate) fn detach(&mut self) {
        if !matches!(self.0, Run::Inline { .. }) {
            return;
        }
        let Run::Inline { call, tasks } = std::mem::replace(&mut self.0, Run::Finished) else {
            return;
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            self.0 = Run::Spawned(tasks.spawn(call));
        }
    }

    /// Whether the call has ended (an inline one has not: nobody has driven it to its end).
    pub(crate) fn is_finished(&self) -> bool {
        match &self.0 {
            Run::Inline { .. } => false,
            Run::Spawned(task) => task.is_finished(),
            Run::Finished => true,
        }
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        self.detach();
    }
}

/// The calls parked until their client's next request, by `requestState`.
#[derive(Default)]
pub(crate) struct Parked {
    flows: Mutex<HashMap<String, (Flow, Instant)>>,
    next: AtomicU64,
}

impl Parked {
    /// Parks `flow` (its call on a task of its own: nothing drives it until the client's next
    /// request); the `requestState` that finds it again.
    pub(crate) fn park(&self, mut flow: Flow) -> String {
        flow.runner.detach();
        let state = format!(
            "tw-{}-{}",
            ulid::Ulid::new(),
            self.next.fetch_add(1, Ordering::Relaxed)
        );
        self.flows
            .lock()
            .insert(state.clone(), (flow, Instant::now()));
        state
    }

    /// The parked call of that `requestState`, no longer parked.
    pub(crate) fn take(&self, state: &str) -> Option<Flow> {
        self.flows.lock().remove(state).map(|(flow, _)| flow)
    }

    /// Forgets the calls whose client did not come back: a finished one after
    /// [`KEEP_FINISHED`], a running one after [`KEEP_PARKED`] (then it is cancelled).
    pub(crate) fn sweep(&self) {
        let now = Instant::now();
        self.flows.lock().retain(|_, (flow, since)| {
            let waited = now.duration_since(*since);
            let keep = if flow.runner.is_finished() {
                waited < KEEP_FINISHED
            } else {
                waited < KEEP_PARKED
            };
            if !keep {
                flow.cancel.cancel();
            }
            keep
        });
    }
}

/// The client's answer to one input request, as the type that request expects.
pub(crate) fn read_answer(request: &InputRequest, value: Value) -> Result<ClientResult, ErrorData> {
    let bad = |e: serde_json::Error| {
        ErrorData::invalid_params(format!("a malformed input response: {e}"), None)
    };
    match request {
        InputRequest::Elicitation(_) => serde_json::from_value::<ElicitResult>(value)
            .map(ClientResult::ElicitResult)
            .map_err(bad),
        InputRequest::CreateMessage(_) => serde_json::from_value::<CreateMessageResult>(value)
            .map(|r| ClientResult::CreateMessageResult(Box::new(r)))
            .map_err(bad),
        InputRequest::ListRoots(_) => serde_json::from_value::<ListRootsResult>(value)
            .map(ClientResult::ListRootsResult)
            .map_err(bad),
        _ => Err(ErrorData::invalid_params(
            "an input response to a request the gateway cannot read",
            None,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A runner whose call ends when `go` is sent, and says so on `done`.
    fn quick(tasks: &TaskTracker) -> (Runner, oneshot::Sender<()>, oneshot::Receiver<()>) {
        let (go, wait) = oneshot::channel::<()>();
        let (tell, done) = oneshot::channel();
        let call = Box::pin(async move {
            let _ = wait.await;
            let _ = tell.send(());
        });
        (Runner::inline(call, tasks), go, done)
    }

    #[tokio::test]
    async fn an_inline_call_is_driven_by_whoever_runs_it_until_its_end() {
        let tasks = TaskTracker::new();
        let (mut runner, go, mut done) = quick(&tasks);
        // Nobody runs it: it does not move.
        tokio::task::yield_now().await;
        assert!(done.try_recv().is_err());
        assert!(!runner.is_finished());
        go.send(()).unwrap();
        runner.run().await;
        assert!(runner.is_finished());
        assert!(done.try_recv().is_ok());
        // No task of its own was ever made.
        assert!(tasks.is_empty());
    }

    #[tokio::test]
    async fn a_call_detached_or_dropped_goes_on_on_a_task_of_its_own() {
        let tasks = TaskTracker::new();
        let (mut runner, go, done) = quick(&tasks);
        runner.detach();
        assert_eq!(tasks.len(), 1);
        // Once on its own task, running it waits forever: its events say how it goes on.
        let ran = tokio::time::timeout(Duration::ZERO, runner.run()).await;
        assert!(ran.is_err());
        go.send(()).unwrap();
        done.await.unwrap();

        let (runner, go, done) = quick(&tasks);
        drop(runner);
        go.send(()).unwrap();
        done.await.unwrap();
        tasks.close();
        tasks.wait().await;
    }
}
