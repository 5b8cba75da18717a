//! Traces (docs/OBSERVABILITY.md): `toolwarden serve` with `[otel] endpoint` pointing at an
//! OTLP/HTTP receiver run by the test (axum on an ephemeral port, decoding the protobuf export
//! requests), and `tw-test-server`'s `meta` tool, which answers the `_meta` its request carried.

use std::sync::Arc;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::trace::v1::{Span, span::SpanKind, status::StatusCode};
use parking_lot::Mutex;
use pretty_assertions::assert_eq;
use prost::Message as _;
use serde_json::{Value, json};

use crate::serve::{config, serve};
use crate::util::{Dir, Running, http, marker};

const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

fn client_traceparent() -> String {
    format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01")
}

/// An OTLP/HTTP receiver: every span of every `POST /v1/traces`, decoded.
struct Receiver {
    url: String,
    spans: Arc<Mutex<Vec<Span>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    async fn start() -> Receiver {
        let spans: Arc<Mutex<Vec<Span>>> = Arc::default();
        let kept = spans.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(
                move |headers: axum::http::HeaderMap, body: axum::body::Bytes| async move {
                    assert_eq!(headers["content-type"], "application/x-protobuf");
                    let request = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                    for rs in request.resource_spans {
                        let resource = rs.resource.expect("a resource");
                        assert!(
                            resource.attributes.iter().any(|kv| kv.key == "service.name"
                                && string(kv.value.as_ref()) == Some("toolwarden")),
                            "{resource:?}"
                        );
                        for ss in rs.scope_spans {
                            kept.lock().extend(ss.spans);
                        }
                    }
                    axum::http::StatusCode::OK
                },
            ),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Receiver { url, spans, task }
    }

    /// Waits until `done` holds for the spans received; answers them.
    async fn wait_for(&self, done: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        for _ in 0..300 {
            {
                let spans = self.spans.lock();
                if done(&spans) {
                    return spans.clone();
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("spans never arrived: {:#?}", self.spans.lock());
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn string(v: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> Option<&str> {
    match v?.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(s),
        _ => None,
    }
}

fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a any_value::Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
}

fn attr_str<'a>(span: &'a Span, key: &str) -> Option<&'a str> {
    match attr(span, key)? {
        any_value::Value::StringValue(s) => Some(s),
        _ => None,
    }
}

fn attr_int(span: &Span, key: &str) -> Option<i64> {
    match attr(span, key)? {
        any_value::Value::IntValue(n) => Some(*n),
        _ => None,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn named<'a>(spans: &'a [Span], name: &str) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.name == name).collect()
}

fn one<'a>(spans: &'a [Span], name: &str) -> &'a Span {
    let found = named(spans, name);
    assert_eq!(found.len(), 1, "{name}: {spans:#?}");
    found[0]
}

/// The `_meta` the test server's `meta` tool saw: its answer's text (an HTTP API result block
/// and an MCP result alike).
fn seen_meta(result: &Value) -> Value {
    let text = result["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{result:#}"));
    serde_json::from_str(text).unwrap()
}

/// The `traceparent` the test server's `meta` tool saw: trace id and parent span id.
fn seen_traceparent(result: &Value) -> (String, String) {
    let meta = seen_meta(result);
    let tp = meta["traceparent"]
        .as_str()
        .unwrap_or_else(|| panic!("no traceparent in {meta:#}"));
    let parts: Vec<&str> = tp.split('-').collect();
    assert_eq!((parts.len(), parts[0], parts[3]), (4, "00", "01"), "{tp}");
    (parts[1].to_owned(), parts[2].to_owned())
}

async fn start(name: &str, extra: &str) -> (Dir, Running, String, String) {
    let dir = Dir::new();
    let mark = marker(name);
    dir.create("toolwarden.toml", &config(&mark, extra));
    let (server, url) = serve(&dir, &[]).await;
    server
        .wait_stderr("server \"test\" is up", Duration::from_secs(30))
        .await;
    (dir, server, url, mark)
}

async fn stop(server: Running, mark: &str) {
    crate::util::stop_clean(server, mark).await;
}

const FLAKY: &str = r#"
[tools."test__fail"]
idempotent = true
retries = 1
retry_on_tool_error = true
backoff = { initial = "1ms", max = "1ms" }
"#;

#[tokio::test]
async fn a_turn_under_a_clients_traceparent_exports_turn_call_and_attempt_spans() {
    let receiver = Receiver::start().await;
    let extra = format!("{FLAKY}\n[otel]\nendpoint = \"{}\"\n", receiver.url);
    let (_dir, server, url, mark) = start("otel-turn", &extra).await;

    let resp = http()
        .post(format!("{url}/v1/turns"))
        .header("traceparent", client_traceparent())
        .json(&json!({"calls": [
            {"id": "m", "name": "test__meta", "input": {}},
            {"id": "f", "name": "test__fail", "input": {}},
        ]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(
        answer["results"][0]["toolwarden"]["status"], "ok",
        "{answer:#}"
    );
    assert_eq!(
        answer["results"][1]["toolwarden"]["attempts"], 2,
        "{answer:#}"
    );

    let spans = receiver
        .wait_for(|s| s.iter().any(|s| s.name == "toolwarden.turn"))
        .await;
    // Everything is in the client's trace.
    for s in &spans {
        assert_eq!(hex(&s.trace_id), CLIENT_TRACE, "{s:#?}");
    }
    let turn = one(&spans, "toolwarden.turn");
    assert_eq!(hex(&turn.parent_span_id), CLIENT_SPAN);
    assert_eq!(turn.kind, SpanKind::Internal as i32);
    assert_eq!(
        attr_str(turn, "toolwarden.turn.id"),
        answer["turn_id"].as_str()
    );
    assert_eq!(
        attr_str(turn, "gen_ai.conversation.id"),
        answer["session_id"].as_str()
    );
    assert_eq!(attr_str(turn, "enduser.id"), Some("local"));
    assert_eq!(attr_str(turn, "toolwarden.turn.outcome"), Some("partial"));
    assert_eq!(turn.flags & 0x300, 0x300, "the client's span is remote");

    // The calls hang under the turn.
    let meta_call = one(&spans, "execute_tool test__meta");
    let fail_call = one(&spans, "execute_tool test__fail");
    for (call, id) in [(meta_call, "m"), (fail_call, "f")] {
        assert_eq!(call.parent_span_id, turn.span_id);
        assert_eq!(call.kind, SpanKind::Internal as i32);
        assert_eq!(
            attr_str(call, "gen_ai.operation.name"),
            Some("execute_tool")
        );
        assert_eq!(attr_str(call, "gen_ai.tool.call.id"), Some(id));
        assert!(call.start_time_unix_nano >= turn.start_time_unix_nano);
        assert!(call.end_time_unix_nano <= turn.end_time_unix_nano);
    }
    assert_eq!(attr_str(meta_call, "gen_ai.tool.name"), Some("test__meta"));
    assert_eq!(
        attr_str(meta_call, "gen_ai.tool.description"),
        Some("Answers the _meta of its own request (structured).")
    );
    assert_eq!(
        meta_call.status.as_ref().unwrap().code,
        StatusCode::Unset as i32
    );
    assert_eq!(attr_str(meta_call, "error.type"), None);
    assert_eq!(attr_str(fail_call, "error.type"), Some("tool_error"));
    assert_eq!(
        fail_call.status.as_ref().unwrap().code,
        StatusCode::Error as i32
    );
    assert_eq!(attr_int(fail_call, "toolwarden.attempts"), Some(2));

    // Attempts: MCP client spans under their call, named by the server's own tool name.
    let meta_attempt = one(&spans, "tools/call meta");
    assert_eq!(meta_attempt.parent_span_id, meta_call.span_id);
    assert_eq!(meta_attempt.kind, SpanKind::Client as i32);
    assert_eq!(
        attr_str(meta_attempt, "mcp.method.name"),
        Some("tools/call")
    );
    assert_eq!(attr_str(meta_attempt, "gen_ai.tool.name"), Some("meta"));
    assert_eq!(attr_str(meta_attempt, "gen_ai.tool.call.id"), Some("m"));
    assert_eq!(attr_str(meta_attempt, "toolwarden.server"), Some("test"));
    let mut fail_attempts = named(&spans, "tools/call fail");
    fail_attempts.sort_by_key(|s| attr_int(s, "toolwarden.attempt"));
    assert_eq!(fail_attempts.len(), 2, "{spans:#?}");
    for (n, a) in fail_attempts.iter().enumerate() {
        assert_eq!(attr_int(a, "toolwarden.attempt"), Some(n as i64 + 1));
        assert_eq!(a.parent_span_id, fail_call.span_id);
        assert_eq!(attr_str(a, "error.type"), Some("tool_error"));
    }
    assert!(fail_attempts[0].end_time_unix_nano <= fail_attempts[1].start_time_unix_nano);
    assert_ne!(fail_attempts[0].span_id, fail_attempts[1].span_id);

    // The server was handed its attempt's span as the parent of its own work, beside the
    // progress token rmcp adds.
    assert!(
        seen_meta(&answer["results"][0])
            .get("progressToken")
            .is_some()
    );
    let (trace, parent) = seen_traceparent(&answer["results"][0]);
    assert_eq!(trace, CLIENT_TRACE);
    assert_eq!(parent, hex(&meta_attempt.span_id));

    let metrics = http()
        .get(format!("{url}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("toolwarden_otel_spans_dropped_total 0"),
        "{metrics}"
    );
    stop(server, &mark).await;
}

#[tokio::test]
async fn mcp_clients_hand_their_trace_in_meta_or_a_header_and_shutdown_flushes_spans() {
    let receiver = Receiver::start().await;
    let extra = format!("[otel]\nendpoint = \"{}/\"\n", receiver.url);
    let (_dir, server, url, mark) = start("otel-mcp", &extra).await;

    let post = |session: Option<&str>, body: Value| {
        let mut req = http()
            .post(format!("{url}/mcp"))
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Some(id) = session {
            req = req
                .header("mcp-session-id", id)
                .header("mcp-protocol-version", "2025-06-18");
        }
        req
    };
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "otel-test", "version": "1"}}});
    let resp = post(None, init).send().await.unwrap();
    let session = resp.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    message(resp).await;
    let resp = post(
        Some(&session),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(resp.status(), 202);

    // `_meta.traceparent` of the request.
    let in_meta = "00-11111111111111111111111111111111-2222222222222222-01";
    let resp = post(
        Some(&session),
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "test__meta", "arguments": {}, "_meta": {"traceparent": in_meta}}}),
    )
    .send()
    .await
    .unwrap();
    let by_meta = message(resp).await;
    // A `traceparent` header, when `_meta` has none.
    let resp = post(
        Some(&session),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "test__meta", "arguments": {}}}),
    )
    .header("traceparent", client_traceparent())
    .send()
    .await
    .unwrap();
    let by_header = message(resp).await;

    // Stopping sends what is queued (the batch delay has not passed yet).
    stop(server, &mark).await;
    let spans = receiver.spans.lock().clone();
    for (answer, trace, parent) in [
        (
            &by_meta,
            "11111111111111111111111111111111",
            "2222222222222222",
        ),
        (&by_header, CLIENT_TRACE, CLIENT_SPAN),
    ] {
        let result = &answer["result"];
        let (seen_trace, seen_parent) = seen_traceparent(result);
        assert_eq!(seen_trace, trace, "{result:#}");
        let in_trace: Vec<&Span> = spans.iter().filter(|s| hex(&s.trace_id) == trace).collect();
        let names: Vec<&str> = in_trace.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names.len(), 3, "{names:?}");
        let turn = in_trace
            .iter()
            .find(|s| s.name == "toolwarden.turn")
            .unwrap();
        let call = in_trace
            .iter()
            .find(|s| s.name == "execute_tool test__meta")
            .unwrap();
        let attempt = in_trace
            .iter()
            .find(|s| s.name == "tools/call meta")
            .unwrap();
        assert_eq!(hex(&turn.parent_span_id), parent);
        assert_eq!(call.parent_span_id, turn.span_id);
        assert_eq!(attempt.parent_span_id, call.span_id);
        assert_eq!(seen_parent, hex(&attempt.span_id));
        // The gateway's call id is the JSON-RPC request's id.
        assert_eq!(
            attr_str(call, "gen_ai.tool.call.id"),
            Some(answer["id"].to_string().as_str())
        );
    }
}

#[tokio::test]
async fn without_otel_a_clients_traceparent_reaches_the_server_unchanged() {
    let (_dir, server, url, mark) = start("otel-off", "").await;
    let resp = http()
        .post(format!("{url}/v1/turns"))
        .header("traceparent", client_traceparent())
        .json(&json!({"calls": [{"id": "m", "name": "test__meta", "input": {}}]}))
        .send()
        .await
        .unwrap();
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(
        seen_traceparent(&answer["results"][0]),
        (CLIENT_TRACE.to_owned(), CLIENT_SPAN.to_owned())
    );
    // No context, none passed on.
    let resp = http()
        .post(format!("{url}/v1/turns"))
        .json(&json!({"calls": [{"id": "m", "name": "test__meta", "input": {}}]}))
        .send()
        .await
        .unwrap();
    let answer: Value = resp.json().await.unwrap();
    let meta = seen_meta(&answer["results"][0]);
    assert_eq!(meta.get("traceparent"), None, "{meta:#}");
    assert!(meta.get("progressToken").is_some(), "{meta:#}");
    stop(server, &mark).await;
}

/// The JSON-RPC message of a response: its body, or the first non-empty `data:` of an event
/// stream.
async fn message(resp: reqwest::Response) -> Value {
    let text = resp.text().await.unwrap();
    let json = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:").map(str::trim))
        .find(|d| !d.is_empty())
        .unwrap_or(text.as_str());
    serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {text}"))
}
