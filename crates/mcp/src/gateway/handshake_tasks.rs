//! Tasks toward handshake clients: the experimental tasks of the 2025-11-25 revision.
//!
//! A client of that revision declares a `tasks` capability at `initialize`, asks for a task
//! with `params.task` on `tools/call`, is answered at once with `{"task": {...}}`, and follows
//! the task with `tasks/get`, `tasks/result` (which waits for the outcome), `tasks/list` and
//! `tasks/cancel`. rmcp, which serves handshake clients, knows only the newer tasks extension
//! (`super::tasks`): it drops the capability and `params.task` as it reads a request, and
//! refuses a handshake client's `tasks/*`. So all of it is seen in the raw request, before
//! rmcp: over Streamable HTTP, `super::http` marks an `initialize` that declares the capability
//! (the handler then marks its session, and the answer gets `capabilities.tasks` added on its
//! way out), and `super::dispatch` hands a marked session's task requests here; on stdio,
//! `super::stdio_frames` does the same on the connection's lines.
//!
//! A task here is the same task as a stateless client's: the call runs on a task of its own
//! under its own policy, is recorded in the audit trail and followed by the task board before
//! the answer goes out (`tasks::start`), and `tasks/get`/`tasks/cancel` read and cancel it
//! there (`tasks::get`, `tasks::cancel`). Only the wire shape differs. `docs/GATEWAY.md`,
//! "Tasks", has the rules.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use http::Response;
use rmcp::ErrorData;
use rmcp::model::{
    CallToolRequestParams, CancelledNotificationParam, ErrorCode, GetTaskResult, JsonRpcError,
    NumberOrString, ProgressNotificationParam, ProgressToken, RequestId, RequestMetaObject,
    ServerRequest, Task, TaskPayload,
};
use rmcp::service::{Peer, RoleServer};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::call::{self, CallContext, Door};
use super::channel::{ClientChannel, Sent};
use super::flow_events::{self, FlowEvent};
use super::incoming::{Incoming, Params};
use super::parked::{Flow, Runner};
use super::passthrough;
use super::respond::{self, Answering, BoxBody, Out};
use super::session::ClientSession;
use super::state::GatewayState;
use super::tasks;

/// The revision whose tasks these are.
pub(crate) const REVISION: &str = "2025-11-25";

/// The `_meta` key naming the task a message belongs to.
const RELATED_TASK: &str = "io.modelcontextprotocol/related-task";

/// The progress token of a task's call whose request gave none (its progress goes to the
/// task's `statusMessage` only).
const TASK_TOKEN: &str = "toolwarden-task";

/// How long a `tasks/cancel` waits for the call to stop before it answers.
const CANCEL_WAIT: Duration = Duration::from_secs(5);

/// The methods served here for a session that declared tasks.
pub(crate) const METHODS: &[&str] = &["tasks/get", "tasks/result", "tasks/list", "tasks/cancel"];

/// Put in the HTTP request's extensions of an `initialize` that declares the `tasks`
/// capability of 2025-11-25 (rmcp drops the capability; the handler finds this instead).
#[derive(Clone, Copy, Debug)]
pub(crate) struct DeclaresTasks;

/// Whether `body` is an `initialize` of 2025-11-25 whose client declares `capabilities.tasks`.
pub(crate) fn declares_tasks(body: &[u8]) -> bool {
    // Most bodies are not an `initialize` with tasks: told apart without reading them.
    let has = |needle: &[u8]| memchr::memmem::find(body, needle).is_some();
    if !has(b"\"initialize\"") || !has(b"\"tasks\"") {
        return false;
    }
    /// What of an `initialize`'s parameters tells whether it declares tasks.
    #[derive(serde::Deserialize)]
    struct Initialize<'a> {
        #[serde(rename = "protocolVersion", borrow)]
        version: std::borrow::Cow<'a, str>,
        capabilities: Capabilities,
    }
    #[derive(serde::Deserialize)]
    struct Capabilities {
        #[serde(default)]
        tasks: Option<Value>,
    }
    let Some(message) = Incoming::parse(body) else {
        return false;
    };
    let (Some("initialize"), Params::Raw(params)) = (message.method, &message.params) else {
        return false;
    };
    serde_json::from_str::<Initialize<'_>>(params.get()).is_ok_and(|init| {
        init.version == REVISION
            && init
                .capabilities
                .tasks
                .as_ref()
                .is_some_and(Value::is_object)
    })
}

/// What the gateway says it serves, in `capabilities.tasks` of its `initialize` answer.
fn capability() -> Value {
    json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}})
}

/// Adds `capabilities.tasks` to an `initialize` answer (a JSON-RPC message) that negotiated
/// 2025-11-25; whether it did.
pub(crate) fn advertise_in(message: &mut Value) -> bool {
    let Some(result) = message.get_mut("result").and_then(Value::as_object_mut) else {
        return false;
    };
    if result.get("protocolVersion").and_then(Value::as_str) != Some(REVISION) {
        return false;
    }
    let Some(capabilities) = result
        .get_mut("capabilities")
        .and_then(Value::as_object_mut)
    else {
        return false;
    };
    capabilities.insert("tasks".into(), capability());
    true
}

/// Rewrites one event-stream event (without its blank line) whose data is the `initialize`
/// answer; `None` leaves it as it is.
fn advertise_in_event(event: &str) -> Option<String> {
    let data: Vec<&str> = event
        .lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .map(|d| d.strip_prefix(' ').unwrap_or(d))
        .collect();
    if data.is_empty() {
        return None;
    }
    let mut message: Value = serde_json::from_str(&data.join("\n")).ok()?;
    if !advertise_in(&mut message) {
        return None;
    }
    let mut out = String::with_capacity(event.len() + 96);
    let mut written = false;
    for line in event.lines() {
        if line.starts_with("data:") {
            if !written {
                out.push_str("data: ");
                out.push_str(&message.to_string());
                out.push('\n');
                written = true;
            }
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    out.pop();
    Some(out)
}

/// rmcp's answer to an `initialize` that declared tasks, with `capabilities.tasks` added (an
/// event stream, as rmcp answers it, or a JSON body).
pub(crate) fn advertise(response: Response<BoxBody>) -> Response<BoxBody> {
    use futures::StreamExt as _;
    let (parts, body) = response.into_parts();
    let json = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let frames = http_body_util::BodyStream::new(body);
    let mut rewriter = Rewriter {
        json,
        ..Rewriter::default()
    };
    let stream = frames
        .map(Some)
        .chain(futures::stream::once(async { None }))
        .filter_map(move |frame| {
            let out = match frame {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => rewriter.push(&data),
                    Err(frame) => return std::future::ready(Some(Ok(frame))),
                },
                Some(Err(never)) => match never {},
                None => rewriter.finish(),
            };
            std::future::ready(out.map(|b| Ok(http_body::Frame::data(b))))
        });
    let mut parts = parts;
    parts.headers.remove(http::header::CONTENT_LENGTH);
    Response::from_parts(parts, BoxBody::new(http_body_util::StreamBody::new(stream)))
}

/// Rewrites the `initialize` answer in a body read piece by piece: its first event (or, for
/// JSON, the whole body), then passes the rest through.
#[derive(Default)]
struct Rewriter {
    json: bool,
    buf: Vec<u8>,
    done: bool,
}

impl Rewriter {
    fn push(&mut self, data: &[u8]) -> Option<Bytes> {
        if self.done {
            return Some(Bytes::copy_from_slice(data));
        }
        self.buf.extend_from_slice(data);
        if self.json {
            return None;
        }
        let mut out = Vec::new();
        while let Some(end) = find(&self.buf, b"\n\n") {
            let event: Vec<u8> = self.buf.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&event[..end]);
            match advertise_in_event(&text) {
                Some(rewritten) => {
                    out.extend_from_slice(rewritten.as_bytes());
                    out.extend_from_slice(b"\n\n");
                    out.append(&mut self.buf);
                    self.done = true;
                    break;
                }
                None => out.extend_from_slice(&event),
            }
        }
        (!out.is_empty()).then(|| Bytes::from(out))
    }

    fn finish(&mut self) -> Option<Bytes> {
        let mut rest = std::mem::take(&mut self.buf);
        if self.json
            && !self.done
            && let Ok(mut message) = serde_json::from_slice::<Value>(&rest)
            && advertise_in(&mut message)
        {
            rest = message.to_string().into_bytes();
        }
        (!rest.is_empty()).then(|| Bytes::from(rest))
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The way back to the client of a task's call: its progress goes to the task (and to the
/// client, under the token its request gave); its requests (an approval, a server's sampling or
/// elicitation) go to the client through its session, as any request outside a call does.
struct TaskChannel {
    events: flow_events::EventSender,
    peer: Option<Peer<RoleServer>>,
    /// The client gave a progress token: it hears the progress too.
    relay: bool,
}

impl ClientChannel for TaskChannel {
    fn notify_progress(
        &self,
        param: ProgressNotificationParam,
    ) -> BoxFuture<'_, Result<(), String>> {
        let _ = self.events.send(FlowEvent::Progress(param.clone()));
        match (&self.peer, self.relay) {
            (Some(peer), true) => Box::pin(async move {
                Peer::<RoleServer>::notify_progress(peer, param)
                    .await
                    .map_err(|e| e.to_string())
            }),
            _ => Box::pin(std::future::ready(Ok(()))),
        }
    }

    fn send_request(&self, request: ServerRequest) -> BoxFuture<'_, Result<Sent, ErrorData>> {
        match &self.peer {
            Some(peer) => ClientChannel::send_request(peer, request),
            None => Box::pin(std::future::ready(Err(ErrorData::internal_error(
                "the MCP client has no connection to ask through",
                None,
            )))),
        }
    }

    fn withdraw(&self, param: CancelledNotificationParam) {
        if let Some(peer) = &self.peer {
            ClientChannel::withdraw(peer, param);
        }
    }
}

/// A `tools/call` with `params.task` of a session that declared tasks: starts the call and
/// answers `{"task": {...}}` once the task is recorded. A tool that never runs as a task (its
/// policy's `task = "never"`, or the gateway's status tool) is refused with `-32601`, as the
/// revision asks. When the audit trail cannot record the task, the call is answered with its
/// result instead, as if no task had been asked for.
async fn call(
    gw: &Arc<GatewayState>,
    session: &Arc<ClientSession>,
    params: CallToolRequestParams,
    id: RequestId,
    mut meta: RequestMetaObject,
    shutdown: CancellationToken,
) -> Result<(Value, Option<String>), ErrorData> {
    let Some(mut plan) = tasks::plan(gw, &params.name, true, &session.key(), id.to_string()) else {
        return Err(ErrorData::new(
            ErrorCode::METHOD_NOT_FOUND,
            format!(
                "tool {:?} does not run as a task (its policy says task = \"never\", or it is \
                 not a governed tool): call it without params.task",
                params.name
            ),
            None,
        ));
    };
    plan.at = tokio::time::Instant::now();
    let relay = meta.get_progress_token().is_some();
    if !relay {
        meta.set_progress_token(ProgressToken(NumberOrString::String(TASK_TOKEN.into())));
    }
    let (events, rx) = flow_events::channel();
    let channel = Arc::new(TaskChannel {
        events: events.clone(),
        peer: session.peer(),
        relay,
    });
    // The call is known by its turn, as a stateless one is; its handle firing (the client left
    // before it learned the task's id) is a client disconnect, or the shutdown.
    let door = Door::Task(Box::new(Door::Stream(shutdown)), plan.turn_id.clone());
    let context = CallContext::new(id, meta, channel, door);
    let cancel = context.ct.clone();
    let (gw2, session2) = (gw.clone(), session.clone());
    let runner = Runner::spawned(gw.tasks.spawn(async move {
        let result = call::call_tool(&gw2, &session2, params, context).await;
        let _ = events.send(FlowEvent::Done(result));
    }));
    let flow = Flow {
        events: rx,
        asked: BTreeMap::new(),
        cancel,
        runner,
        task: Some(plan),
    };
    match tasks::start(gw, flow).await {
        Ok(created) => Ok((
            json!({"task": task_json(&created.task)}),
            Some(created.task.task_id),
        )),
        Err(flow) => {
            let mut flow = *flow;
            loop {
                match flow.events.recv().await {
                    Some(FlowEvent::Done(result)) => return result.map(|r| (plain(&r), None)),
                    Some(_) => {}
                    None => {
                        return Err(ErrorData::internal_error(
                            "the call ended without a result",
                            None,
                        ));
                    }
                }
            }
        }
    }
}

/// A result as a handshake client reads it (no `resultType`).
fn plain(result: &impl serde::Serialize) -> Value {
    let mut value = serde_json::to_value(result).unwrap_or(Value::Null);
    if let Some(map) = value.as_object_mut() {
        map.remove("resultType");
    }
    value
}

/// A task as the 2025-11-25 revision writes it.
fn task_json(task: &Task) -> Value {
    let mut value = json!({
        "taskId": task.task_id,
        "status": task.status,
        "createdAt": task.created_at,
        "lastUpdatedAt": task.last_updated_at,
        "ttl": task.ttl_ms,
    });
    if let Some(poll) = task.poll_interval_ms {
        value["pollInterval"] = poll.into();
    }
    if let Some(message) = &task.status_message {
        value["statusMessage"] = message.clone().into();
    }
    value
}

/// `tasks/get`'s answer: the task, with its last progress in `_meta`.
fn got_json(got: &GetTaskResult) -> Value {
    let mut value = task_json(&got.task.task);
    if let Some(meta) = &got.meta {
        value["_meta"] = serde_json::to_value(meta).unwrap_or(Value::Null);
    }
    value
}

fn task_id(params: &Value) -> Result<&str, ErrorData> {
    params
        .get("taskId")
        .and_then(Value::as_str)
        .ok_or_else(|| ErrorData::invalid_params("params.taskId (a string) is required", None))
}

/// `tasks/result`: waits until the task has ended, then answers what its call answered — its
/// `CallToolResult` (also a governed failure, with `isError: true`), or the JSON-RPC error of a
/// failed task — with the task named in `_meta`.
async fn result(gw: &GatewayState, who: &str, task_id: &str) -> Result<Value, ErrorData> {
    loop {
        let got = tasks::get(gw, who, task_id).await?;
        let poll = got.task.task.poll_interval_ms.unwrap_or(1000);
        let related = |mut value: Value| {
            if let Some(map) = value.as_object_mut() {
                map.remove("resultType");
                let meta = map
                    .entry("_meta")
                    .or_insert_with(|| Value::Object(Map::new()));
                if let Some(meta) = meta.as_object_mut() {
                    meta.insert(RELATED_TASK.into(), json!({"taskId": task_id}));
                }
            }
            value
        };
        match got.task.payload {
            TaskPayload::Completed { result } => return Ok(related(Value::Object(result))),
            TaskPayload::Failed { error } => {
                return Err(serde_json::from_value::<ErrorData>(Value::Object(error))
                    .unwrap_or_else(|e| {
                        ErrorData::internal_error(format!("the task failed ({e})"), None)
                    }));
            }
            TaskPayload::Cancelled => {
                // What the call answered: an `isError` result with its `cancelled{user}` outcome.
                if let Some(live) = gw.task_board.get(task_id)
                    && let super::task_board::Seen::Done(answer) = live.snapshot().seen
                {
                    return answer.map(|r| related(plain(&r)));
                }
                return Err(ErrorData::internal_error(
                    format!("task {task_id} was cancelled"),
                    Some(json!({"toolwarden/outcome": {"status": "cancelled", "reason": "user"}})),
                ));
            }
            _ => match gw.task_board.get(task_id) {
                Some(live) => live.done().await,
                // Run elsewhere (another replica): its outcome is read from the trail.
                None => tokio::time::sleep(Duration::from_millis(poll)).await,
            },
        }
    }
}

/// `tasks/cancel`: cancels the task's call (`cancelled{user}`) through the cancellation tree,
/// waits (up to 5 s) for it to stop, and answers the task as it is then.
async fn cancel(gw: &GatewayState, who: &str, task_id: &str) -> Result<Value, ErrorData> {
    tasks::cancel(gw, who, task_id).await?;
    if let Some(live) = gw.task_board.get(task_id) {
        let _ = tokio::time::timeout(CANCEL_WAIT, live.done()).await;
    }
    Ok(task_json(&tasks::get(gw, who, task_id).await?.task.task))
}

/// `tasks/list`: the session's own tasks the gateway holds, oldest first, in one page.
async fn list(gw: &GatewayState, session: &ClientSession) -> Result<Value, ErrorData> {
    let mut listed = Vec::new();
    let who = &session.principal.name;
    for task in gw.task_board.of_session(&session.key()) {
        if let Ok(got) = tasks::get(gw, who, &task.record.task_id).await {
            listed.push(task_json(&got.task.task));
        }
    }
    Ok(json!({"tasks": listed}))
}

/// Answers one of [`METHODS`] of a session that declared tasks.
async fn dispatch(
    gw: &GatewayState,
    session: &ClientSession,
    method: &str,
    params: &Value,
) -> Result<Value, ErrorData> {
    let who = &session.principal.name;
    match method {
        "tasks/get" => Ok(got_json(&tasks::get(gw, who, task_id(params)?).await?)),
        "tasks/result" => result(gw, who, task_id(params)?).await,
        "tasks/cancel" => cancel(gw, who, task_id(params)?).await,
        "tasks/list" => list(gw, session).await,
        other => Err(ErrorData::new(
            ErrorCode::METHOD_NOT_FOUND,
            format!("{other} is not served"),
            None,
        )),
    }
}

/// The JSON-RPC answer to request `id`.
fn answer(id: &RequestId, result: Result<Value, ErrorData>) -> Bytes {
    let message = match result {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err(error) => {
            serde_json::to_value(JsonRpcError::new(Some(id.clone()), error)).unwrap_or(Value::Null)
        }
    };
    Bytes::from(message.to_string())
}

/// Serves `tasks/*` of a session that declared tasks over Streamable HTTP: JSON when the
/// answer is quick, an event stream (kept alive) while `tasks/result` waits. A client that
/// closes the response stops the wait, not the task.
pub(crate) async fn serve_method(
    gw: &Arc<GatewayState>,
    session: Arc<ClientSession>,
    answering: &Answering,
    method: &str,
    id: RequestId,
    params: Result<Value, ErrorData>,
) -> Response<BoxBody> {
    let (out, rx) = mpsc::unbounded_channel();
    let (gw2, method) = (gw.clone(), method.to_owned());
    let work = async move {
        let work = async {
            match params {
                Ok(params) => dispatch(&gw2, &session, &method, &params).await,
                Err(e) => Err(e),
            }
        };
        let result = tokio::select! {
            biased;
            result = work => result,
            () = out.closed() => return,
        };
        let _ = out.send(Out::Answer(answer(&id, result)));
    };
    respond::respond(gw, Box::pin(work), rx, answering).await
}

/// `tools/list` for a session that declared tasks: the gateway's tools, each saying whether
/// it may run as a task (`execution.taskSupport`: `"optional"`, or `"forbidden"` for a tool
/// whose policy says `task = "never"` and for the gateway's own status tool). rmcp's tools have
/// no `execution`, so the list is answered here.
fn tools_list(gw: &GatewayState, session: &ClientSession) -> Value {
    let tools: Vec<Value> = gw
        .tools_for(&session.principal.name)
        .iter()
        .map(|tool| {
            let mut value = serde_json::to_value(tool).unwrap_or(Value::Null);
            let support = if tasks::allowed(gw, &tool.name) {
                "optional"
            } else {
                "forbidden"
            };
            value["execution"] = json!({"taskSupport": support});
            value
        })
        .collect();
    json!({"tools": tools})
}

/// The answer (a JSON-RPC message, no line end) to a request of a session that declared tasks
/// that is one of [`METHODS`], `tools/list`, or a `tools/call` with `params.task` — as read
/// from a byte stream (`super::stdio_frames`). `None`: not such a request (rmcp serves it).
/// The wait of a `tasks/result` ends with the session.
pub(crate) fn answer_raw(
    gw: &Arc<GatewayState>,
    session: &Arc<ClientSession>,
    mut message: Incoming<'_>,
    shutdown: &CancellationToken,
) -> Option<BoxFuture<'static, Bytes>> {
    if !message.is_request() {
        return None;
    }
    let id = message.id.clone()?;
    let (gw, session) = (gw.clone(), session.clone());
    match message.method? {
        "tools/list" => {
            let deadline = passthrough::until(&gw, &message.meta()).at;
            Some(Box::pin(async move {
                gw.first_starts_by(deadline).await;
                answer(&id, Ok(tools_list(&gw, &session)))
            }))
        }
        "tools/call" => {
            let params = message.call_params()?;
            params.task.as_ref()?;
            let mut call = CallToolRequestParams::new(params.name);
            call.arguments = params.arguments;
            let (meta, shutdown) = (params.meta.rest, shutdown.clone());
            Some(Box::pin(async move {
                let result = self::call(&gw, &session, call, id.clone(), meta, shutdown).await;
                answer(&id, result.map(|(value, _)| value))
            }))
        }
        method if METHODS.contains(&method) => {
            let method = method.to_owned();
            let params = message.params_value();
            Some(Box::pin(async move {
                let result = match params {
                    Ok(params) => tokio::select! {
                        result = dispatch(&gw, &session, &method, &params) => result,
                        () = session.ended() => Err(ErrorData::internal_error("the session ended", None)),
                    },
                    Err(e) => Err(ErrorData::invalid_params(
                        format!("malformed params: {e}"),
                        None,
                    )),
                };
                answer(&id, result)
            }))
        }
        _ => None,
    }
}

/// Serves `tools/list` of a session that declared tasks (see [`tools_list`]), within the
/// deadline of its `_meta`.
pub(crate) async fn serve_list(
    gw: &GatewayState,
    session: &ClientSession,
    id: &RequestId,
    meta: &RequestMetaObject,
) -> Response<BoxBody> {
    gw.first_starts_by(passthrough::until(gw, meta).at).await;
    let mut response = Response::new(BoxBody::new(http_body_util::Full::new(answer(
        id,
        Ok(tools_list(gw, session)),
    ))));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

/// Serves a `tools/call` with `params.task` of a session that declared tasks.
pub(crate) async fn serve_call(
    gw: &Arc<GatewayState>,
    session: Arc<ClientSession>,
    answering: &Answering,
    params: CallToolRequestParams,
    id: RequestId,
    meta: RequestMetaObject,
) -> Response<BoxBody> {
    let (out, rx) = mpsc::unbounded_channel();
    let (gw2, shutdown) = (gw.clone(), answering.shutdown.clone());
    let work = async move {
        let result = call(&gw2, &session, params, id.clone(), meta, shutdown).await;
        if out.is_closed() {
            // The client left before it learned the task's id: nobody can follow it.
            if let Ok((_, Some(task_id))) = &result
                && let Some(task) = gw2.task_board.get(task_id)
            {
                task.abandon();
            }
            return;
        }
        let _ = out.send(Out::Answer(answer(&id, result.map(|(value, _)| value))));
    };
    respond::respond(gw, Box::pin(work), rx, answering).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn only_an_initialize_of_2025_11_25_with_tasks_declares_them() {
        let init = |version: &str, capabilities: Value| {
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                   "params": {"protocolVersion": version, "capabilities": capabilities,
                              "clientInfo": {"name": "c", "version": "1"}}})
            .to_string()
        };
        assert!(declares_tasks(
            init(REVISION, json!({"tasks": {"list": {}}})).as_bytes()
        ));
        assert!(!declares_tasks(init(REVISION, json!({})).as_bytes()));
        assert!(!declares_tasks(
            init("2025-06-18", json!({"tasks": {}})).as_bytes()
        ));
        assert!(!declares_tasks(b"not json"));
    }

    fn initialize_answer(version: &str) -> Value {
        json!({"jsonrpc": "2.0", "id": 1, "result": {"protocolVersion": version,
               "capabilities": {"tools": {}}, "serverInfo": {"name": "tw", "version": "1"}}})
    }

    #[test]
    fn the_initialize_answer_gains_the_tasks_capability_in_an_event_stream() {
        let data = initialize_answer(REVISION).to_string();
        let body = format!("id: 0\nretry: 3000\n\nevent: message\ndata: {data}\n\n");
        let mut rewriter = Rewriter::default();
        let (head, tail) = body.split_at(body.len() / 2);
        let mut out = Vec::new();
        for piece in [head, tail] {
            if let Some(b) = rewriter.push(piece.as_bytes()) {
                out.extend_from_slice(&b);
            }
        }
        if let Some(b) = rewriter.finish() {
            out.extend_from_slice(&b);
        }
        let out = String::from_utf8(out).unwrap();
        let mut expected = initialize_answer(REVISION);
        expected["result"]["capabilities"]["tasks"] = capability();
        assert_eq!(
            out,
            format!("id: 0\nretry: 3000\n\nevent: message\ndata: {expected}\n\n")
        );
    }

    #[test]
    fn another_revisions_answer_is_left_alone() {
        let data = initialize_answer("2025-06-18").to_string();
        let body = format!("data: {data}\n\n");
        let mut rewriter = Rewriter::default();
        assert_eq!(
            rewriter.push(body.as_bytes()),
            Some(Bytes::from(body.clone()))
        );
        let mut json = Rewriter {
            json: true,
            ..Rewriter::default()
        };
        assert_eq!(json.push(data.as_bytes()), None);
        assert_eq!(json.finish(), Some(Bytes::from(data)));
    }

    #[test]
    fn tasks_are_written_as_the_revision_has_them() {
        let task = Task::new(
            "task_1",
            rmcp::model::TaskStatus::Working,
            "2026-11-24T07:00:00.000Z",
            "2026-11-24T07:00:01.000Z",
        )
        .with_ttl_ms(3_600_000)
        .with_poll_interval_ms(1000);
        assert_eq!(
            task_json(&task),
            json!({"taskId": "task_1", "status": "working",
                   "createdAt": "2026-11-24T07:00:00.000Z",
                   "lastUpdatedAt": "2026-11-24T07:00:01.000Z",
                   "ttl": 3_600_000, "pollInterval": 1000})
        );
    }
}
