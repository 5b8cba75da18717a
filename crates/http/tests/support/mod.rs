//! Shared helpers: an engine with in-process tools, requests, and answers read as JSON or SSE.

// clippy's allow-unwrap-in-tests covers #[test] functions only, not helpers.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code, unreachable_pub)]

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use toolwarden_core::{Engine, InProcessTool, ToolError, ToolOutput};
use toolwarden_protocol::{Approval, Content};
use tower::ServiceExt;

fn object(properties: Value) -> Value {
    json!({"type": "object", "properties": properties})
}

/// The tools every test may call:
/// - `echo {text}` answers its text at once;
/// - `hang` runs until cancelled, then stops cooperatively;
/// - `sleep {ms}` sleeps that long, then answers `slept`;
/// - `ask` needs a person's approval, then answers `approved`;
/// - `pic` answers a text and an image block.
pub fn tools(engine: &Engine) {
    engine.register(InProcessTool::new(
        "echo",
        "Answers its text",
        object(json!({"text": {"type": "string"}})),
        |input, _ctx| async move {
            Ok::<_, ToolError>(input["text"].as_str().unwrap_or_default().to_owned())
        },
    ));
    engine.register(InProcessTool::new(
        "hang",
        "Runs until cancelled",
        object(json!({})),
        |_input, ctx| async move {
            ctx.cancelled().await;
            Ok::<_, ToolError>("stopped")
        },
    ));
    engine.register(InProcessTool::new(
        "sleep",
        "Sleeps ms milliseconds",
        object(json!({"ms": {"type": "integer"}})),
        |input, ctx| async move {
            let ms = input["ms"].as_u64().unwrap_or(0);
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(ms)) => {}
                () = ctx.cancelled() => {}
            }
            Ok::<_, ToolError>("slept")
        },
    ));
    engine.register(
        InProcessTool::new(
            "ask",
            "Runs once approved",
            object(json!({})),
            |_input, _ctx| async move { Ok::<_, ToolError>("approved") },
        )
        .approval(Approval::Ask),
    );
    engine.register(InProcessTool::new(
        "pic",
        "Answers a picture",
        object(json!({})),
        |_input, _ctx| async move {
            Ok::<_, ToolError>(ToolOutput {
                content: vec![
                    Content::text("a dot"),
                    Content::from_value(
                        json!({"type": "image", "data": "iVBORw0=", "mimeType": "image/png"}),
                    ),
                ],
                structured_content: None,
                is_error: false,
            })
        },
    ));
}

/// An engine with the test tools.
pub fn engine() -> Engine {
    let engine = Engine::new();
    tools(&engine);
    engine
}

/// A JSON POST.
pub fn post(path: &str, body: &Value) -> Request<Body> {
    Request::post(path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

/// A GET.
pub fn get(path: &str) -> Request<Body> {
    Request::get(path).body(Body::empty()).unwrap()
}

/// A POST without a body.
pub fn post_empty(path: &str) -> Request<Body> {
    Request::post(path).body(Body::empty()).unwrap()
}

/// Sends a request and reads the whole answer as JSON (`Value::Null` for an empty or non-JSON
/// body, with the text kept under `"text"`).
pub async fn send(app: &Router, request: Request<Body>) -> (StatusCode, HeaderMap, Value) {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let value = serde_json::from_slice(&bytes).unwrap_or_else(|_| {
        if bytes.is_empty() {
            Value::Null
        } else {
            json!({"text": String::from_utf8_lossy(&bytes)})
        }
    });
    (status, headers, value)
}

/// Replaces what differs between runs — wall-clock stamps and digests — with placeholders.
pub fn scrub(v: &mut Value) {
    match v {
        Value::Object(obj) => {
            for (k, v) in obj.iter_mut() {
                match (k.as_str(), &*v) {
                    ("fetched_at" | "ts" | "created_at" | "deadline", Value::String(_)) => {
                        *v = json!("<ts>")
                    }
                    ("digest", Value::String(d)) => {
                        assert!(d.starts_with("sha256:"), "{d}");
                        *v = json!("<digest>");
                    }
                    _ => scrub(v),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(scrub),
        _ => {}
    }
}

/// One parsed SSE event: its `id`, `event` name, and `data` as JSON; a comment has only
/// `comment`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Frame {
    pub id: Option<String>,
    pub event: Option<String>,
    pub data: Value,
    pub comment: Option<String>,
}

/// Reads SSE events from a byte stream, frame by frame.
pub struct SseReader<S> {
    body: S,
    buf: String,
}

impl<S, E> SseReader<S>
where
    S: futures::Stream<Item = Result<axum::body::Bytes, E>> + Unpin,
    E: std::fmt::Debug,
{
    pub fn new(body: S) -> Self {
        Self {
            body,
            buf: String::new(),
        }
    }

    /// The next frame; `None` at the end of the stream.
    pub async fn next(&mut self) -> Option<Frame> {
        use futures::StreamExt;
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                return Some(parse_frame(&block));
            }
            let chunk = self.body.next().await?.unwrap();
            self.buf.push_str(&String::from_utf8_lossy(&chunk));
        }
    }

    /// The next frame that is an event (skipping keep-alive comments).
    pub async fn next_event(&mut self) -> Option<Frame> {
        loop {
            let frame = self.next().await?;
            if frame.comment.is_none() {
                return Some(frame);
            }
        }
    }
}

fn parse_frame(block: &str) -> Frame {
    let mut frame = Frame::default();
    let mut data = String::new();
    for line in block.lines() {
        if let Some(c) = line.strip_prefix(':') {
            frame.comment = Some(c.trim().to_owned());
        } else if let Some((field, value)) = line.split_once(':') {
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "id" => frame.id = Some(value.to_owned()),
                "event" => frame.event = Some(value.to_owned()),
                "data" => {
                    if !data.is_empty() {
                        data.push('\n');
                    }
                    data.push_str(value);
                }
                _ => {}
            }
        }
    }
    if !data.is_empty() {
        frame.data = serde_json::from_str(&data).unwrap();
    }
    frame
}

/// The body of a router answer as a stream of byte chunks.
pub fn body_stream(
    body: Body,
) -> impl futures::Stream<Item = Result<axum::body::Bytes, axum::Error>> + Unpin {
    body.into_data_stream()
}

/// The JSON results of a turn, with the turn id replaced by `<turn>` and stamps scrubbed.
pub fn normalized(mut results: Value) -> Value {
    scrub(&mut results);
    fn strip_turn(v: &mut Value) {
        match v {
            Value::Object(obj) => {
                if obj.contains_key("turn_id") {
                    obj.insert("turn_id".into(), json!("<turn>"));
                }
                obj.values_mut().for_each(strip_turn);
            }
            Value::Array(items) => items.iter_mut().for_each(strip_turn),
            _ => {}
        }
    }
    strip_turn(&mut results);
    results
}
