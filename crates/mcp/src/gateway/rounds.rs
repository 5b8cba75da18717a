//! The `input_required` round trip: how a stateless (2026-07-28) client is asked something
//! during one of its calls.
//!
//! The revision has no requests from server to client. A call that needs its client — an
//! approval, a server's sampling, elicitation or roots request — answers the client's
//! `tools/call` with an `input_required` result (`inputRequests`, and a `requestState`); the
//! client answers each input and sends the same `tools/call` again with `inputResponses` and
//! the `requestState`. The call (`call::call_tool`, exactly as for every other client) talks to
//! its client through `parked::RoundChannel` — the third `ClientChannel` — and each request of
//! the client drives it in turn ([`drive`]): relays its progress, answers with its result, or
//! parks it with its questions until the next request. Between two requests nothing drives the
//! call, so it is not part of the request's handler but a `parked::Runner` of its own: the
//! request that starts it runs it on its own task while it waits (a quick call costs no task of
//! its own and no hand-over between two tasks, as on `respond`'s path), and it moves to a task
//! of its own once it asks something, becomes a task, or its request is dropped. On the
//! gateway's own HTTP path a new call that cannot become a task skips even that: it is driven
//! as it runs, cancelled by its request's own token, and becomes a parked [`Flow`] only if it
//! asks something ([`first_round`]).
//! For a client that declared tasks, the request may instead be answered with a task once the
//! call's policy says so (`tasks`): from then on the task board follows the call.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;

use rmcp::ErrorData;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, InputRequest, InputRequiredResult, NumberOrString,
    ProgressToken,
};

use super::call::{self, CallContext, CallEnd, Door};
use super::channel::ClientChannel;
use super::flow_events::{self, Answer, EventSender, FlowEvent, TryRecvError};
use super::parked::{Flow, RoundChannel, Runner, read_answer};
use super::session::ClientSession;
use super::state::GatewayState;
use super::tasks;

/// One `tools/call` of a stateless client: a new call, or (with `requestState`) the next
/// round of a parked one, with the client's `inputResponses`.
pub(crate) async fn call_tool(
    gw: &Arc<GatewayState>,
    session: &Arc<ClientSession>,
    mut params: CallToolRequestParams,
    mut driver: CallContext,
) -> Result<CallToolResponse, ErrorData> {
    check_input_responses(&params)?;
    let token = driver.meta.get_progress_token();
    let flow = match params.request_state.take() {
        Some(state) => {
            let Some(mut flow) = gw.parked.take(&state) else {
                return Err(ErrorData::invalid_params(
                    "unknown or expired requestState: call the tool again without it",
                    None,
                ));
            };
            for (key, value) in params.input_responses.take().unwrap_or_default() {
                if let Some((request, answer)) = flow.asked.remove(&key) {
                    let _ = answer.send(read_answer(&request, value));
                }
            }
            flow
        }
        None => start(gw, session, params, &mut driver),
    };
    drive(gw, flow, driver, token).await
}

/// Every answer in `inputResponses` is a result object (an elicitation, sampling or roots
/// result): anything else is the client's protocol error, refused before the call starts or
/// resumes (unknown keys are ignored, as the revision asks).
fn check_input_responses(params: &CallToolRequestParams) -> Result<(), ErrorData> {
    let responses = params.input_responses.iter().flatten();
    match responses
        .into_iter()
        .find(|(_, answer)| !answer.is_object())
    {
        Some((key, _)) => Err(ErrorData::invalid_params(
            format!("inputResponses[{key:?}] is not an object: each answer is a result object"),
            None,
        )),
        None => Ok(()),
    }
}

/// Starts the call: its runner is driven by this request ([`drive`]) until it asks something,
/// becomes a task or the request goes away; then it goes on on a task of its own.
fn start(
    gw: &Arc<GatewayState>,
    session: &Arc<ClientSession>,
    params: CallToolRequestParams,
    driver: &mut CallContext,
) -> Flow {
    let (events, rx) = flow_events::channel();
    let mut door = driver.door.clone();
    // What the call needs of the request's `_meta` the driver has already read (its progress
    // token): the call takes it over.
    let mut meta = std::mem::take(&mut driver.meta);
    let task = tasks::plan(
        gw,
        &params.name,
        driver.tasks,
        &session.key(),
        driver.id.to_string(),
    );
    if let Some(plan) = &task {
        door = Door::Task(Box::new(door), plan.turn_id.clone());
        // A task reports the call's progress whether or not the request asked for it.
        if meta.get_progress_token().is_none() {
            meta.set_progress_token(ProgressToken(NumberOrString::String(TASK_TOKEN.into())));
        }
    }
    let context = CallContext::new(
        driver.id.clone(),
        meta,
        Arc::new(RoundChannel::new(events.clone())),
        door,
    );
    // The call's own cancel: the call outlives the request that started it.
    let cancel = context.ct.clone();
    let (gw2, session) = (gw.clone(), session.clone());
    let runner = runner(
        async move { call::call_tool(&gw2, &session, params, context).await },
        events,
        gw,
    );
    Flow {
        events: rx,
        asked: BTreeMap::new(),
        cancel,
        runner,
        task,
    }
}

/// A new call of the gateway's own HTTP path (`super::dispatch`), which cannot become a
/// task (its client declared no tasks) and has no `inputResponses` or `requestState`: the first
/// round of [`call_tool`], without its hand-over. The call takes the request's `ct` as its own
/// cancel — that `ct` fires only while the request waits for its answer, so the client closing
/// its response stops the call directly — and is driven right here as it runs. Only once it
/// asks something does it become a [`Flow`] like any other, parked with its question on a task
/// of its own; so a quick call costs no runner, no second cancel and no hand-over of its result.
/// (rmcp's `ct` may fire after the answer, so its requests go through [`call_tool`].)
pub(crate) async fn first_round(
    gw: &Arc<GatewayState>,
    session: &Arc<ClientSession>,
    params: CallToolRequestParams,
    driver: CallContext,
) -> Result<Round, ErrorData> {
    let token = driver.meta.get_progress_token();
    let (events, mut rx) = flow_events::channel();
    let progress = driver.channel.clone();
    let ct = driver.ct.clone();
    // The request's own context, its channel the call's rounds'.
    let context = CallContext {
        channel: Arc::new(RoundChannel::new(events.clone())),
        ..driver
    };
    let (gw2, session) = (gw.clone(), session.clone());
    let mut call: Pin<Box<dyn Future<Output = Result<CallEnd, ErrorData>> + Send>> =
        Box::pin(async move { call::answer_call(&gw2, &session, params, context).await });
    let mut asked = BTreeMap::new();
    let mut ended: Option<Result<CallEnd, ErrorData>> = None;
    loop {
        let event = match rx.try_recv() {
            Ok(event) => event,
            Err(_) => {
                // The call's end comes after what it sent before it (its last progress).
                if let Some(result) = ended.take() {
                    return result.map(Round::Ended);
                }
                if !asked.is_empty() {
                    // Its questions go to the client; the call goes on on a task of its own
                    // and ends with its `FlowEvent::Done`, as a call started by `start` does.
                    let flow = Flow {
                        events: rx,
                        asked,
                        cancel: ct,
                        runner: runner(
                            async move { call.await.map(CallEnd::into_result) },
                            events,
                            gw,
                        ),
                        task: None,
                    };
                    return Ok(Round::Answered(park(gw, flow)));
                }
                tokio::select! {
                    biased;
                    result = &mut call => {
                        ended = Some(result);
                        continue;
                    }
                    // `events` is held here: the channel never closes while this waits.
                    Some(event) = rx.recv() => event,
                }
            }
        };
        if let Some(answer) = follow(event, &mut asked, &token, &*progress).await {
            return answer.map(Round::Answered);
        }
    }
}

/// How the first round of a call ended: with the call's own end (its result as the engine gave
/// it, for the door to write straight), or answered otherwise (`input_required`).
pub(crate) enum Round {
    Ended(CallEnd),
    Answered(CallToolResponse),
}

type CallResult = Result<rmcp::model::CallToolResult, ErrorData>;

/// A call that may be parked, as its runner: `call`, then its end as an `Event::Done` on
/// `events`, for whichever request drives it then.
fn runner(
    call: impl Future<Output = CallResult> + Send + 'static,
    events: EventSender,
    gw: &GatewayState,
) -> Runner {
    Runner::inline(
        Box::pin(async move {
            let result = call.await;
            let _ = events.send(FlowEvent::Done(result));
        }),
        &gw.tasks,
    )
}

/// What one event of the call does for the request driving it: progress is relayed under the
/// request's token, a question is kept until the call is parked, a withdrawn one forgotten;
/// `Some` is the request's answer (the call's end).
async fn follow(
    event: FlowEvent,
    asked: &mut BTreeMap<String, (InputRequest, Answer)>,
    token: &Option<ProgressToken>,
    progress: &dyn ClientChannel,
) -> Option<Result<CallToolResponse, ErrorData>> {
    match event {
        FlowEvent::Progress(mut param) => {
            if let Some(token) = token {
                param.progress_token = token.clone();
                if let Err(e) = progress.notify_progress(param).await {
                    tracing::debug!(error = %e, "relaying progress failed");
                }
            }
        }
        FlowEvent::Ask {
            key,
            request,
            answer,
        } => {
            asked.insert(key, (request, answer));
        }
        FlowEvent::Withdraw(key) => {
            asked.remove(&key);
        }
        FlowEvent::Done(result) => return Some(result.map(CallToolResponse::Complete)),
    }
    None
}

/// The progress token of a call that may become a task and whose request gave none (never
/// sent to a client: a request relays progress under its own token only).
const TASK_TOKEN: &str = "toolwarden-task";

/// Drives a call for one request of its client: relays its progress under this request's
/// token, and answers with its result — or, once it asks something, with `input_required`
/// (the call parked until the client's next request). The client going away cancels it.
async fn drive(
    gw: &Arc<GatewayState>,
    mut flow: Flow,
    driver: CallContext,
    token: Option<ProgressToken>,
) -> Result<CallToolResponse, ErrorData> {
    // Made once: a call's request is polled again on every step of the call.
    let client_left = driver.ct.cancelled();
    tokio::pin!(client_left);
    loop {
        // What is already in comes first: an answer, or a question withdrawn since.
        let event = match flow.events.try_recv() {
            Ok(event) => Some(event),
            Err(TryRecvError::Disconnected) => None,
            Err(TryRecvError::Empty) if task_due(&flow) => {
                match tasks::start(gw, flow).await {
                    Ok(created) => {
                        if driver.ct.is_cancelled() {
                            // The client left while the task was recorded: nobody knows its id.
                            if let Some(task) = gw.task_board.get(&created.task.task_id) {
                                task.abandon();
                            }
                        }
                        return Ok(CallToolResponse::Task(created));
                    }
                    Err(back) => flow = *back,
                }
                continue;
            }
            Err(TryRecvError::Empty) if !flow.asked.is_empty() => {
                return Ok(park(gw, flow));
            }
            Err(TryRecvError::Empty) => {
                let task_at = flow.task.as_ref().map(|plan| plan.at);
                tokio::select! {
                    event = flow.events.recv() => event,
                    () = &mut client_left, if !flow.cancel.is_cancelled() => {
                        // The client stopped waiting: the call is aborted (with the reason its
                        // door gives), and its result, which comes at once, is for nobody.
                        flow.cancel.cancel();
                        flow.task = None;
                        continue;
                    }
                    () = until(task_at) => continue,
                    // A call not yet on a task of its own is driven here; its end is its
                    // `FlowEvent::Done`, read next.
                    () = flow.runner.run() => continue,
                }
            }
        };
        let Some(event) = event else {
            return Err(ErrorData::internal_error(
                "the call ended without a result",
                None,
            ));
        };
        if let Some(answer) = follow(event, &mut flow.asked, &token, &*driver.channel).await {
            return answer;
        }
    }
}

/// Whether the call is to become a task now: its plan's time has come, and its client has not
/// stopped waiting.
fn task_due(flow: &Flow) -> bool {
    flow.task
        .as_ref()
        .is_some_and(|plan| plan.at <= tokio::time::Instant::now())
        && !flow.cancel.is_cancelled()
}

/// Resolves at `at`; never without one.
async fn until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Parks the call with its open questions; the `input_required` result that asks them.
fn park(gw: &GatewayState, flow: Flow) -> CallToolResponse {
    let requests: BTreeMap<String, InputRequest> = flow
        .asked
        .iter()
        .map(|(key, (request, _))| (key.clone(), request.clone()))
        .collect();
    let state = gw.parked.park(flow);
    CallToolResponse::InputRequired(InputRequiredResult::new(Some(requests), Some(state)))
}
