//! The test server's tools. Each one exists to misbehave in one documented way.
//!
//! | tool | does |
//! |---|---|
//! | `echo {text, structured?}` | answers `text` (read-only hint); `structured` adds `structuredContent` |
//! | `sleep {ms}` | sleeps, honours a cancel |
//! | `progress {every_ms, count}` | sends `count` progress notifications with the request's token, then answers (structured content: the `progressToken` it was given); stops on a cancel |
//! | `hang {progress_every_ms?, answer_after_ms?}` | ignores cancels; optionally keeps sending progress; optionally answers after a while — *even after a cancel* (written by hand, since rmcp would drop it) |
//! | `crash {after_ms}` | the process exits with status 3 mid-call |
//! | `spawn_grandchild {progress_every_ms?}` | spawns `sleep 600`, reports its pid in progress messages (`grandchild pid N`), ignores cancels, never answers |
//! | `flood {bytes}` | a result with a text of `bytes` bytes |
//! | `garbage {mode}` | stdio only: `lines` writes non-JSON lines then answers; `broken_frame` writes a truncated answer frame for its own request and never answers properly; `bad_shape` writes a JSON answer for its request with neither `result` nor `error` |
//! | `cancels` | the `notifications/cancelled` received so far: `[{requestId, reason, tool, arguments}]`, naming the tool and arguments of the request each one cancelled |
//! | `wipe` | destructive-annotated, does nothing |
//! | `toggle_tools` | adds or removes the `bonus` tool and sends `notifications/tools/list_changed` |
//! | `fail` | a result with `isError: true` |
//! | `reject` | a JSON-RPC error (invalid params) |
//! | `pid` | the server's process id |
//! | `close_stdout` | stdio only: points stdout at `/dev/null` (the client sees its pipe close) and stays alive, never answering |
//! | `sample {prompt}` | asks its client `sampling/createMessage` with `prompt`; answers the model's text |
//! | `elicit {message}` | asks its client `elicitation/create` (a form with a string `answer`); answers `{action, content}` as JSON |
//! | `roots` | asks its client `roots/list`; answers the roots as JSON |
//! | `log {message}` | sends `notifications/message` (level `info`, logger `tw-test-server`, data `message`) |
//! | `touch {uri}` | sends `notifications/resources/updated` for `uri` |
//! | `lists_changed` | sends `notifications/resources/list_changed` and `notifications/prompts/list_changed` |
//! | `seen` | what the server saw besides calls: `{subscriptions, log_level, roots_changed}` |
//! | `task {ms, steps?, poll_ms?, ask?, ignore_cancel?}` | answers with a task to a client that declared the tasks extension (see `tasks.rs`) |
//! | `version` | the protocol version the request speaks (`2026-07-28` in its `_meta`, else the session's) |
//!
//! Besides tools it serves what a gateway passes through: a resource `test://static/hello`
//! (text `hello`), a template `test://items/{id}` (text `item ID`; an unknown URI is
//! `-32002`), a resource `test://hang/never` whose read is never answered (until cancelled; not
//! listed), subscriptions, a prompt `greet {name}` ("Hello, NAME!"), completion of
//! `greet`'s `name` (`alice`, `albert`, `bob`) and of the template's `id` (`1`, `2`, `3`), and
//! `logging/setLevel`. With `--tag TAG` it also serves `test://TAG/mine` (text `mine of TAG`)
//! and its greeting ends with ` (TAG)`.

#![allow(
    deprecated,
    reason = "sampling, roots, logging and resources/subscribe are deprecated by SEP-2577 \
              (MCP 2026-07-28), but the session-based revisions still use them"
)]

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rmcp::ErrorData as McpError;
use rmcp::model::{
    CallToolResult, ContentBlock, CreateMessageRequest, ElicitRequest, JsonObject,
    ListRootsRequest, LoggingMessageNotification, NumberOrString, ProgressNotificationParam,
    ProgressToken, RequestId, ServerNotification, ServerRequest, Tool, ToolAnnotations,
};
use rmcp::service::{RequestContext, RoleServer};
use serde_json::{Value, json};

use crate::state::TestServer;

fn schema(props: Value) -> Arc<JsonObject> {
    let mut s = JsonObject::new();
    s.insert("type".into(), json!("object"));
    s.insert("properties".into(), props);
    Arc::new(s)
}

fn tool(name: &'static str, description: &'static str, props: Value) -> Tool {
    Tool::new(name, description, schema(props))
}

pub(crate) fn tools(bonus: bool) -> Vec<Tool> {
    let mut list = vec![
        Tool::new(
            "echo",
            crate::state::ECHO_DESCRIPTION
                .get()
                .cloned()
                .unwrap_or_else(|| "Answers its text.".to_owned()),
            schema(json!({"text": {"type": "string"}, "structured": {"type": "boolean"}})),
        )
        .with_annotations(ToolAnnotations::new().read_only(true)),
        tool(
            "sleep",
            "Sleeps, honouring cancels.",
            json!({"ms": {"type": "integer"}}),
        )
        .with_annotations(ToolAnnotations::new().idempotent(true)),
        tool(
            "progress",
            "Sends progress, then answers; stops on a cancel.",
            json!({"every_ms": {"type": "integer"}, "count": {"type": "integer"}}),
        ),
        tool(
            "hang",
            "Ignores cancels; may keep sending progress; may answer late.",
            json!({"progress_every_ms": {"type": "integer"}, "answer_after_ms": {"type": "integer"}}),
        ),
        tool(
            "crash",
            "The process exits mid-call.",
            json!({"after_ms": {"type": "integer"}}),
        ),
        tool(
            "spawn_grandchild",
            "Spawns a sleeping grandchild, reports its pid, hangs.",
            json!({"progress_every_ms": {"type": "integer"}}),
        ),
        tool(
            "flood",
            "Answers a huge text.",
            json!({"bytes": {"type": "integer"}}),
        ),
        tool(
            "garbage",
            "Writes garbage on stdout.",
            json!({"mode": {"type": "string", "enum": ["lines", "broken_frame", "bad_shape"]}}),
        ),
        tool(
            "cancels",
            "Lists the cancel notifications received.",
            json!({}),
        ),
        tool(
            "meta",
            "Answers the _meta of its own request (structured).",
            json!({}),
        ),
        tool("wipe", "Destructive (does nothing).", json!({}))
            .with_annotations(ToolAnnotations::new().destructive(true)),
        tool(
            "toggle_tools",
            "Adds or removes the bonus tool and says so.",
            json!({}),
        ),
        tool("fail", "Answers isError: true.", json!({})),
        tool("reject", "Answers a JSON-RPC error.", json!({})),
        tool("pid", "Answers the server's pid.", json!({})),
        tool(
            "close_stdout",
            "Closes its stdout pipe and lives on.",
            json!({}),
        ),
        tool(
            "sample",
            "Asks the client's model (sampling).",
            json!({"prompt": {"type": "string"}}),
        ),
        tool(
            "elicit",
            "Asks the client's user (elicitation).",
            json!({"message": {"type": "string"}}),
        ),
        tool("roots", "Asks the client for its roots.", json!({})),
        tool(
            "log",
            "Sends a log message.",
            json!({"message": {"type": "string"}}),
        ),
        tool(
            "touch",
            "Says a resource was updated.",
            json!({"uri": {"type": "string"}}),
        ),
        tool(
            "lists_changed",
            "Says its resource and prompt lists changed.",
            json!({}),
        ),
        tool("seen", "What the server saw besides calls.", json!({})),
        tool("version", "The request's protocol version.", json!({})),
        tool(
            "task",
            "Works as a task (to clients that declared the tasks extension).",
            json!({"ms": {"type": "integer"}, "steps": {"type": "integer"},
                "poll_ms": {"type": "integer"}, "ask": {"type": "boolean"},
                "ignore_cancel": {"type": "boolean"}}),
        ),
    ];
    if bonus {
        list.push(tool("bonus", "Listed after toggle_tools.", json!({})));
    }
    list
}

/// Builds one of rmcp's (mostly non-exhaustive) types from its wire form.
pub(crate) fn wire<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, McpError> {
    serde_json::from_value(value)
        .map_err(|e| McpError::internal_error(format!("tw-test-server: bad wire value: {e}"), None))
}

/// A JSON answer as text and structured content.
pub(crate) fn json_result(value: Value) -> CallToolResult {
    let mut r = text(value.to_string());
    r.structured_content = Some(value);
    r
}

pub(crate) fn service_error(what: &str, e: rmcp::ServiceError) -> McpError {
    match e {
        rmcp::ServiceError::McpError(e) => McpError::internal_error(
            format!("{what}: the client answered an error: {}", e.message),
            None,
        ),
        other => McpError::internal_error(format!("{what}: {other}"), None),
    }
}

pub(crate) const NAMES: [&str; 3] = ["alice", "albert", "bob"];
pub(crate) const ITEM_IDS: [&str; 3] = ["1", "2", "3"];

pub(crate) fn text(s: impl Into<String>) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(s)])
}

pub(crate) fn arg_u64(args: &JsonObject, key: &str) -> Option<u64> {
    args.get(key).and_then(Value::as_u64)
}

pub(crate) fn id_json(id: &RequestId) -> Value {
    match id {
        NumberOrString::Number(n) => json!(n),
        NumberOrString::String(s) => json!(s.as_ref()),
    }
}

async fn send_progress(
    ctx: &RequestContext<RoleServer>,
    token: &Option<ProgressToken>,
    progress: f64,
    total: Option<f64>,
    message: String,
) {
    let Some(token) = token else { return };
    let mut p = ProgressNotificationParam::new(token.clone(), progress).with_message(message);
    if let Some(total) = total {
        p = p.with_total(total);
    }
    let _ = ctx.peer.notify_progress(p).await;
}

impl TestServer {
    pub(crate) async fn run(
        &self,
        name: &str,
        args: JsonObject,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let token = ctx.meta.get_progress_token();
        match name {
            "echo" => {
                let t = args
                    .get("text")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                let mut r = text(t.clone());
                if args.get("structured").and_then(Value::as_bool) == Some(true) {
                    r.structured_content = Some(json!({"text": t}));
                }
                Ok(r)
            }
            "sleep" => {
                let ms = arg_u64(&args, "ms").unwrap_or(1000);
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(ms)) => Ok(text(format!("slept {ms} ms"))),
                    _ = ctx.ct.cancelled() => Ok(text("cancelled")),
                }
            }
            "progress" => {
                let every = Duration::from_millis(arg_u64(&args, "every_ms").unwrap_or(50));
                let count = arg_u64(&args, "count").unwrap_or(5);
                for i in 1..=count {
                    tokio::select! {
                        _ = tokio::time::sleep(every) => {}
                        _ = ctx.ct.cancelled() => return Ok(text("cancelled")),
                    }
                    send_progress(
                        &ctx,
                        &token,
                        i as f64,
                        Some(count as f64),
                        format!("step {i}"),
                    )
                    .await;
                }
                // Says which token it was given, so tests can tell whose token reached it.
                let mut r = text(format!("done after {count} steps"));
                r.structured_content = Some(json!({"progressToken": token}));
                Ok(r)
            }
            "hang" => {
                let every = arg_u64(&args, "progress_every_ms").map(Duration::from_millis);
                let answer_after = arg_u64(&args, "answer_after_ms").map(Duration::from_millis);
                let start = tokio::time::Instant::now();
                let mut n = 0.0;
                loop {
                    if let Some(after) = answer_after
                        && start.elapsed() >= after
                    {
                        break;
                    }
                    let tick = every.unwrap_or(Duration::from_millis(50));
                    tokio::time::sleep(tick).await;
                    if every.is_some() {
                        n += 1.0;
                        send_progress(&ctx, &token, n, None, "still working".into()).await;
                    }
                }
                if ctx.ct.is_cancelled()
                    && let Some(injector) = &self.state.injector
                {
                    // rmcp drops the answer of a cancelled request; a misbehaving server
                    // answers anyway, so write the frame by hand.
                    let frame = json!({"jsonrpc": "2.0", "id": id_json(&ctx.id),
                        "result": {"content": [{"type": "text", "text": "late answer"}]}});
                    injector.write(format!("{frame}\n").into_bytes()).await;
                }
                Ok(text("late answer"))
            }
            "crash" => {
                let ms = arg_u64(&args, "after_ms").unwrap_or(0);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                eprintln!("tw-test-server: crashing on purpose");
                std::process::exit(3);
            }
            "spawn_grandchild" => {
                let every =
                    Duration::from_millis(arg_u64(&args, "progress_every_ms").unwrap_or(100));
                let child = std::process::Command::new("sleep")
                    .arg("600")
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .map_err(|e| McpError::internal_error(format!("spawn sleep: {e}"), None))?;
                let pid = child.id();
                let mut n = 0.0;
                loop {
                    n += 1.0;
                    send_progress(&ctx, &token, n, None, format!("grandchild pid {pid}")).await;
                    tokio::time::sleep(every).await;
                }
            }
            "flood" => {
                let bytes = arg_u64(&args, "bytes").unwrap_or(1 << 20) as usize;
                Ok(text("x".repeat(bytes)))
            }
            "garbage" => {
                let Some(injector) = &self.state.injector else {
                    return Ok(CallToolResult::error(vec![ContentBlock::text(
                        "garbage needs the stdio transport",
                    )]));
                };
                let id = id_json(&ctx.id);
                match args.get("mode").and_then(Value::as_str).unwrap_or("lines") {
                    "lines" => {
                        injector.write(b"this is not json\n".to_vec()).await;
                        injector.write(b"{\"unterminated\": [1, 2\n".to_vec()).await;
                        injector.write(b"\xff\xfe\xfd binary\n".to_vec()).await;
                        injector.write(b"\n".to_vec()).await;
                        Ok(text("survived"))
                    }
                    "broken_frame" => {
                        let frame = format!(
                            "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{{\"content\":[{{\"type\":\"text\",\"text\":\"trunc\n"
                        );
                        injector.write(frame.into_bytes()).await;
                        ctx.ct.cancelled().await;
                        Ok(text("cancelled"))
                    }
                    "bad_shape" => {
                        let frame = json!({"jsonrpc": "2.0", "id": id, "unexpected": true});
                        injector.write(format!("{frame}\n").into_bytes()).await;
                        ctx.ct.cancelled().await;
                        Ok(text("cancelled"))
                    }
                    other => Err(McpError::invalid_params(
                        format!("unknown garbage mode {other:?}"),
                        None,
                    )),
                }
            }
            "meta" => {
                let meta = serde_json::to_value(&ctx.meta).unwrap_or(Value::Null);
                let mut r = text(meta.to_string());
                r.structured_content = Some(json!({"meta": meta}));
                Ok(r)
            }
            "cancels" => {
                // Named here, not when the cancel arrived: rmcp handles each message on its
                // own task, so a cancel may be seen before its call was registered.
                let calls = self.state.calls.lock().clone();
                let list: Vec<Value> = self
                    .state
                    .cancels
                    .lock()
                    .iter()
                    .map(|c| {
                        let call = calls
                            .get(&c["requestId"].to_string())
                            .cloned()
                            .unwrap_or(Value::Null);
                        json!({"requestId": c["requestId"], "reason": c["reason"],
                            "tool": call.get("tool"), "arguments": call.get("arguments")})
                    })
                    .collect();
                let list = Value::Array(list);
                let mut r = text(list.to_string());
                r.structured_content = Some(json!({"cancels": list}));
                Ok(r)
            }
            "wipe" => Ok(text("nothing was wiped")),
            "toggle_tools" => {
                let now = !self.state.bonus.fetch_xor(true, Ordering::SeqCst);
                let _ = ctx.peer.notify_tool_list_changed().await;
                self.state
                    .tell_listeners(ServerNotification::ToolListChangedNotification(
                        Default::default(),
                    ))
                    .await;
                Ok(text(if now {
                    "bonus tool added"
                } else {
                    "bonus tool removed"
                }))
            }
            "bonus" if self.state.bonus.load(Ordering::SeqCst) => Ok(text("bonus")),
            "fail" => Ok(CallToolResult::error(vec![ContentBlock::text(
                "failed on purpose",
            )])),
            "reject" => Err(McpError::invalid_params("rejected on purpose", None)),
            "pid" => Ok(text(std::process::id().to_string())),
            "close_stdout" => {
                let null = std::fs::File::create("/dev/null")
                    .map_err(|e| McpError::internal_error(format!("open /dev/null: {e}"), None))?;
                nix::unistd::dup2_stdout(&null)
                    .map_err(|e| McpError::internal_error(format!("dup2: {e}"), None))?;
                // The pump may write through a descriptor of its own: close that too.
                if let Some(injector) = &self.state.injector {
                    injector.close().await;
                }
                std::future::pending().await
            }
            "sample" => {
                let prompt = args.get("prompt").and_then(Value::as_str).unwrap_or("hi");
                let request = ServerRequest::CreateMessageRequest(CreateMessageRequest::new(wire(
                    json!({"messages": [{"role": "user", "content": {"type": "text", "text": prompt}}],
                           "maxTokens": 100}),
                )?));
                let answer = ctx
                    .peer
                    .send_request(request)
                    .await
                    .map_err(|e| service_error("sampling/createMessage", e))?;
                let answer = serde_json::to_value(&answer).unwrap_or(Value::Null);
                let said = answer
                    .pointer("/content/text")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                Ok(text(said))
            }
            "elicit" => {
                let message = args.get("message").and_then(Value::as_str).unwrap_or("?");
                let request = ServerRequest::ElicitRequest(ElicitRequest::new(wire(json!({
                    "mode": "form",
                    "message": message,
                    "requestedSchema": {"type": "object",
                        "properties": {"answer": {"type": "string"}}}
                }))?));
                let answer = ctx
                    .peer
                    .send_request(request)
                    .await
                    .map_err(|e| service_error("elicitation/create", e))?;
                let answer = serde_json::to_value(&answer).unwrap_or(Value::Null);
                Ok(json_result(json!({"action": answer.get("action"),
                    "content": answer.get("content")})))
            }
            "roots" => {
                let request = ServerRequest::ListRootsRequest(ListRootsRequest::default());
                let answer = ctx
                    .peer
                    .send_request(request)
                    .await
                    .map_err(|e| service_error("roots/list", e))?;
                Ok(json_result(
                    serde_json::to_value(&answer).unwrap_or(Value::Null),
                ))
            }
            "log" => {
                let message = args
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let notification = ServerNotification::LoggingMessageNotification(
                    LoggingMessageNotification::new(wire(json!({
                        "level": "info", "logger": "tw-test-server", "data": message
                    }))?),
                );
                let _ = ctx.peer.send_notification(notification).await;
                Ok(text("logged"))
            }
            "touch" => {
                let uri = args.get("uri").and_then(Value::as_str).unwrap_or_default();
                let _ = ctx
                    .peer
                    .notify_resource_updated(wire(json!({"uri": uri}))?)
                    .await;
                self.state
                    .tell_listeners(ServerNotification::ResourceUpdatedNotification(
                        rmcp::model::ResourceUpdatedNotification::new(wire(json!({"uri": uri}))?),
                    ))
                    .await;
                Ok(text(format!("touched {uri}")))
            }
            "lists_changed" => {
                let _ = ctx.peer.notify_resource_list_changed().await;
                let _ = ctx.peer.notify_prompt_list_changed().await;
                for notification in [
                    ServerNotification::ResourceListChangedNotification(Default::default()),
                    ServerNotification::PromptListChangedNotification(Default::default()),
                ] {
                    self.state.tell_listeners(notification).await;
                }
                Ok(text("said so"))
            }
            "version" => Ok(text(
                ctx.protocol_version()
                    .map(|v| v.to_string())
                    .unwrap_or_default(),
            )),
            "seen" => Ok(json_result(json!({
                "subscriptions": *self.state.subscriptions.lock(),
                "log_level": *self.state.log_level.lock(),
                "roots_changed": *self.state.roots_changed.lock(),
            }))),
            other => Err(McpError::invalid_params(
                format!("unknown tool {other:?}"),
                None,
            )),
        }
    }
}
