//! Calls of stateless (2026-07-28) clients waiting between two requests of their client, and
//! the way such a call reaches its client: [`RoundChannel`], the third `ClientChannel`. What
//! the call sends becomes events for whichever request of the client drives it (`rounds`).

#![allow(
    deprecated,
    reason = "sampling and roots are deprecated by SEP-2577 (MCP 2026-07-28), but a server may \
              still ask them during a call, and the revision carries them as input requests"
)]

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use parking_lot::Mutex;
use rmcp::ErrorData;
use rmcp::model::{
    CallToolResult, CancelledNotificationParam, ClientResult, CreateMessageResult, ElicitResult,
    ErrorCode, InputRequest, ListRootsResult, ProgressNotificationParam, RequestId, ServerRequest,
};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::channel::{ClientChannel, Sent};
use super::options::ANSWER_ID_PREFIX;

/// How long a parked call whose result is in waits for its client to come back for it.
const KEEP_FINISHED: Duration = Duration::from_secs(60);

/// How long a call waits parked, at most, for its client's next request; then it is cancelled.
pub(crate) const KEEP_PARKED: Duration = Duration::from_secs(3600);

pub(crate) type Answer = oneshot::Sender<Result<ClientResult, ErrorData>>;

/// What a call running on its own task tells the request driving it.
pub(crate) enum Event {
    Progress(ProgressNotificationParam),
    Ask {
        key: String,
        request: InputRequest,
        answer: Answer,
    },
    Withdraw(String),
    Done(Result<CallToolResult, ErrorData>),
}

/// The way back to a stateless client: what the call sends becomes events for whichever of
/// the client's requests drives it now.
pub(crate) struct RoundChannel {
    events: mpsc::UnboundedSender<Event>,
    next: AtomicU64,
}

impl RoundChannel {
    pub(crate) fn new(events: mpsc::UnboundedSender<Event>) -> Self {
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
            .send(Event::Progress(param))
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
            .send(Event::Ask {
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
            let _ = self.events.send(Event::Withdraw(id.to_string()));
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
    pub(crate) session: toolwarden_protocol::SessionId,
}

/// A call of a stateless client between two of its requests (or being driven by one).
pub(crate) struct Flow {
    pub(crate) events: mpsc::UnboundedReceiver<Event>,
    /// The questions the client has not answered yet, in the order asked.
    pub(crate) asked: BTreeMap<String, (InputRequest, Answer)>,
    /// Cancels the call (its handler's `ct`).
    pub(crate) cancel: CancellationToken,
    pub(crate) runner: JoinHandle<()>,
    /// Set when the call may become a task.
    pub(crate) task: Option<TaskPlan>,
}

/// The calls parked until their client's next request, by `requestState`.
#[derive(Default)]
pub(crate) struct Parked {
    flows: Mutex<HashMap<String, (Flow, Instant)>>,
    next: AtomicU64,
}

impl Parked {
    /// Parks `flow`; the `requestState` that finds it again.
    pub(crate) fn park(&self, flow: Flow) -> String {
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
