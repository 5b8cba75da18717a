//! The HTTP API at the router level (`tower::ServiceExt::oneshot`), on paused tokio time: every
//! deadline, keep-alive and approval timeout here runs in virtual time.

// clippy's allow-unwrap-in-tests covers #[test] functions only, not this file's helpers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use support::{Frame, SseReader, engine, get, normalized, post, post_empty, scrub, send};
use toolwarden_core::{Engine, InteractionRequest, Received};
use toolwarden_http::{HttpOptions, METRICS_CONTENT_TYPE, router};
use toolwarden_protocol::{EventKind, InteractionKind, ServerStateKind};
use tower::ServiceExt;

const HANG_TIMEOUT: &str = "[TIMEOUT] Tool \"hang\" exceeded its wall-clock limit of 1s and was cancelled. It may have partly run; check its effects before calling it again, or pass a larger timeout_ms.";

fn app(engine: &Engine) -> Router {
    router(engine.clone(), HttpOptions::default())
}

fn ok_outcome(call: &str, tool: &str) -> Value {
    json!({"status": "ok", "attempts": 1, "call_id": call, "turn_id": "<turn>", "tool": tool,
           "duration_ms": 0,
           "provenance": {"source": "tool", "fetched_at": "<ts>", "cache_hit": false, "digest": "<digest>"}})
}

fn timeout_outcome(call: &str) -> Value {
    json!({"status": "timeout", "kind": "total", "after_ms": 1000, "attempts": 1, "call_id": call,
           "turn_id": "<turn>", "tool": "hang", "duration_ms": 1000})
}

fn three_calls_anthropic() -> Value {
    json!({"session_id": "s1", "calls": [
        {"type": "tool_use", "id": "c1", "name": "echo", "input": {"text": "one"}},
        {"type": "tool_use", "id": "c2", "name": "hang", "input": {}, "timeout_ms": 1000},
        {"type": "tool_use", "id": "c3", "name": "echo", "input": {"text": "three"}},
    ]})
}

fn three_results_anthropic() -> Value {
    json!([
        {"type": "tool_result", "tool_use_id": "c1", "content": [{"type": "text", "text": "one"}],
         "is_error": false, "toolwarden": ok_outcome("c1", "echo")},
        {"type": "tool_result", "tool_use_id": "c2", "content": [{"type": "text", "text": HANG_TIMEOUT}],
         "is_error": true, "toolwarden": timeout_outcome("c2")},
        {"type": "tool_result", "tool_use_id": "c3", "content": [{"type": "text", "text": "three"}],
         "is_error": false, "toolwarden": ok_outcome("c3", "echo")},
    ])
}

/// Runs a JSON turn and answers `(status, body)` with the turn id checked and normalized.
async fn run_turn(app: &Router, body: &Value) -> (StatusCode, Value) {
    let (status, _, mut answer) = send(app, post("/v1/turns", body)).await;
    if status == StatusCode::OK {
        assert!(answer["turn_id"].as_str().unwrap().starts_with("t_"));
        answer["turn_id"] = json!("<turn>");
    }
    (status, normalized(answer))
}

#[tokio::test(start_paused = true)]
async fn a_hanging_call_times_out_between_two_results_in_call_order_anthropic() {
    let engine = engine();
    let started = tokio::time::Instant::now();
    let (status, answer) = run_turn(&app(&engine), &three_calls_anthropic()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        answer,
        json!({"turn_id": "<turn>", "session_id": "s1", "results": three_results_anthropic()})
    );
    assert_eq!(started.elapsed(), Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn a_hanging_call_times_out_between_two_results_in_call_order_openai() {
    let engine = engine();
    let body = json!({"session_id": "s1", "calls": [
        {"id": "c1", "type": "function", "function": {"name": "echo", "arguments": "{\"text\":\"one\"}"}},
        {"id": "c2", "type": "function", "function": {"name": "hang", "arguments": "{}"}, "timeout_ms": 1000},
        {"id": "c3", "type": "function", "function": {"name": "echo", "arguments": "{\"text\":\"three\"}"}},
    ]});
    let (status, answer) = run_turn(&app(&engine), &body).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        answer,
        json!({"turn_id": "<turn>", "session_id": "s1", "results": [
            {"role": "tool", "tool_call_id": "c1", "content": "one", "toolwarden": ok_outcome("c1", "echo")},
            {"role": "tool", "tool_call_id": "c2", "content": HANG_TIMEOUT, "toolwarden": timeout_outcome("c2")},
            {"role": "tool", "tool_call_id": "c3", "content": "three", "toolwarden": ok_outcome("c3", "echo")},
        ]})
    );
}

#[tokio::test(start_paused = true)]
async fn an_unknown_tool_is_a_result_not_a_400() {
    let engine = engine();
    let body = json!({"calls": [{"id": "x", "type": "function", "function": {"name": "nope", "arguments": "{}"}}]});
    let (status, answer) = run_turn(&app(&engine), &body).await;
    assert_eq!(status, StatusCode::OK);
    let outcome = &answer["results"][0]["toolwarden"];
    assert_eq!(
        (&outcome["status"], &outcome["reason"]),
        (&json!("invalid"), &json!("unknown_tool"))
    );
    assert!(
        answer["results"][0]["content"]
            .as_str()
            .unwrap()
            .starts_with("[INVALID]")
    );
}

#[tokio::test(start_paused = true)]
async fn images_become_anthropic_image_blocks() {
    let engine = engine();
    let body = json!({"calls": [{"id": "p", "name": "pic", "input": {}}]});
    let (status, answer) = run_turn(&app(&engine), &body).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        answer["results"][0]["content"],
        json!([
            {"type": "text", "text": "a dot"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0="}},
        ])
    );
    assert!(
        answer["session_id"].as_str().unwrap().starts_with("s_"),
        "a turn without a session gets a new one: {answer}"
    );
}

/// Posts a turn asking for SSE; answers the reader over its body.
async fn stream_turn(
    app: &Router,
    body: &Value,
) -> SseReader<impl futures::Stream<Item = Result<axum::body::Bytes, axum::Error>> + Unpin + use<>>
{
    let request = Request::post("/v1/turns")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "text/event-stream")
        .body(Body::from(body.to_string()))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        "text/event-stream"
    );
    SseReader::new(support::body_stream(response.into_body()))
}

/// Every event frame until the stream ends.
async fn all_frames<S>(reader: &mut SseReader<S>) -> Vec<Frame>
where
    S: futures::Stream<Item = Result<axum::body::Bytes, axum::Error>> + Unpin,
{
    let mut frames = Vec::new();
    while let Some(frame) = reader.next_event().await {
        frames.push(frame);
    }
    frames
}

#[tokio::test(start_paused = true)]
async fn sse_streams_the_turn_in_order_and_ends_with_turn_end_holding_the_json_answer() {
    let engine = engine();
    let app = app(&engine);
    let mut reader = stream_turn(&app, &three_calls_anthropic()).await;
    let frames = all_frames(&mut reader).await;

    // Framing: `id` is the seq, `event` the type, `data` the event; seqs increase by one.
    let seqs: Vec<u64> = frames
        .iter()
        .map(|f| f.id.as_deref().unwrap().parse().unwrap())
        .collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    for f in &frames {
        assert_eq!(f.event.as_deref(), f.data["type"].as_str());
        assert_eq!(f.id.as_deref(), Some(f.data["seq"].to_string().as_str()));
    }
    let turn_id = frames[0].data["turn_id"].clone();
    assert!(frames.iter().all(|f| f.data["turn_id"] == turn_id));

    let kinds: Vec<(String, Option<String>)> = frames
        .iter()
        .map(|f| {
            (
                f.data["type"].as_str().unwrap().to_owned(),
                f.data["call_id"].as_str().map(str::to_owned),
            )
        })
        .collect();
    let k = |t: &str, c: Option<&str>| (t.to_owned(), c.map(str::to_owned));
    assert_eq!(
        kinds,
        vec![
            k("turn_start", None),
            k("tool_start", Some("c1")),
            k("tool_result", Some("c1")),
            k("tool_start", Some("c2")),
            k("tool_start", Some("c3")),
            k("tool_result", Some("c3")),
            k("tool_timeout", Some("c2")),
            k("tool_result", Some("c2")),
            k("turn_end", None),
        ]
    );
    let end = &frames.last().unwrap().data;
    assert_eq!(end["outcome"], "partial");

    // The same turn answered as JSON has the same results.
    let (_, answer) = run_turn(&app, &three_calls_anthropic()).await;
    assert_eq!(normalized(end["results"].clone()), answer["results"]);
    assert_eq!(answer["results"], three_results_anthropic());
}

/// Waits (in virtual time) until `engine` runs a turn whose calls are all `running`.
async fn until_running(engine: &Engine) -> String {
    loop {
        if let Some(turn) = engine.active_turns().first()
            && turn
                .calls
                .iter()
                .all(|c| c.state == toolwarden_protocol::CallState::Running)
        {
            return turn.turn_id.to_string();
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn aborting_a_turn_through_the_api_cancels_its_calls_and_is_idempotent_while_it_runs() {
    let engine = engine();
    let app = app(&engine);
    let body = json!({"session_id": "s1", "calls": [
        {"id": "a", "name": "hang", "input": {}},
        {"id": "b", "name": "hang", "input": {}},
    ]});
    let turn = tokio::spawn({
        let app = app.clone();
        async move { run_turn(&app, &body).await }
    });
    let turn_id = until_running(&engine).await;

    let (status, _, active) = send(&app, get("/v1/turns/active")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(active["turns"][0]["turn_id"], turn_id.as_str());
    assert_eq!(active["turns"][0]["session_id"], "s1");
    assert_eq!(active["turns"][0]["calls"][1]["call_id"], "b");
    assert_eq!(active["turns"][0]["calls"][1]["state"], "running");

    let abort = format!("/v1/turns/{turn_id}/abort");
    let (status, _, answer) = send(&app, post_empty(&abort)).await;
    assert_eq!(
        (status, answer),
        (StatusCode::OK, json!({"ok": true, "turn_id": turn_id}))
    );

    let (status, answer) = turn.await.unwrap();
    assert_eq!(status, StatusCode::OK);
    for (i, id) in ["a", "b"].iter().enumerate() {
        assert_eq!(
            answer["results"][i]["toolwarden"]["status"], "cancelled",
            "{answer}"
        );
        assert_eq!(answer["results"][i]["toolwarden"]["reason"], "user");
        assert_eq!(answer["results"][i]["tool_use_id"], *id);
    }

    // Finished: no longer running, so 404.
    let (status, _, answer) = send(&app, post_empty(&abort)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(answer["error"]["code"], "not_found");
    let (status, _, _) = send(&app, post_empty("/v1/turns/t_nope/abort")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test(start_paused = true)]
async fn a_second_abort_of_a_running_turn_is_also_ok() {
    let engine = engine();
    let app = app(&engine);
    let body = json!({"calls": [{"id": "a", "name": "hang", "input": {}}]});
    let turn = tokio::spawn({
        let app = app.clone();
        async move { run_turn(&app, &body).await }
    });
    let turn_id = until_running(&engine).await;
    let abort = format!("/v1/turns/{turn_id}/abort");
    let (first, second) = tokio::join!(
        send(&app, post_empty(&abort)),
        send(&app, post_empty(&abort))
    );
    assert_eq!((first.0, second.0), (StatusCode::OK, StatusCode::OK));
    turn.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn aborting_one_call_leaves_the_turn_running() {
    let engine = engine();
    let app = app(&engine);
    let body = json!({"calls": [
        {"id": "stuck", "name": "hang", "input": {}},
        {"id": "slow", "name": "sleep", "input": {"ms": 5000}},
    ]});
    let started = tokio::time::Instant::now();
    let turn = tokio::spawn({
        let app = app.clone();
        async move { run_turn(&app, &body).await }
    });
    let turn_id = until_running(&engine).await;
    let (status, _, answer) = send(
        &app,
        post_empty(&format!("/v1/turns/{turn_id}/calls/stuck/abort")),
    )
    .await;
    assert_eq!(
        (status, answer),
        (
            StatusCode::OK,
            json!({"ok": true, "turn_id": turn_id, "call_id": "stuck"})
        )
    );
    let (status, _, _) = send(
        &app,
        post_empty(&format!("/v1/turns/{turn_id}/calls/nope/abort")),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let (_, answer) = turn.await.unwrap();
    assert_eq!(answer["results"][0]["toolwarden"]["status"], "cancelled");
    assert_eq!(answer["results"][0]["toolwarden"]["reason"], "user");
    assert_eq!(answer["results"][1]["toolwarden"]["status"], "ok");
    assert_eq!(answer["results"][1]["content"][0]["text"], "slept");
    assert_eq!(started.elapsed(), Duration::from_secs(5));
}

/// The `tool_result` outcomes and `turn_abort` reasons of `turn_id` seen by `events`.
fn ends_of(events: &mut toolwarden_core::Subscription, turn_id: &str) -> Vec<Value> {
    let mut ends = Vec::new();
    while let Some(Received::Event(e)) = events.try_recv() {
        if e.scope.turn_id.as_ref().map(|t| t.as_str()) != Some(turn_id) {
            continue;
        }
        match &e.kind {
            EventKind::ToolResult { result, .. } => ends.push(json!({
                "tool_result": e.scope.call_id, "status": result.outcome.status.name(),
                "reason": serde_json::to_value(&result.outcome).unwrap()["reason"],
            })),
            EventKind::TurnAbort { reason } => ends.push(json!({"turn_abort": reason})),
            _ => {}
        }
    }
    ends
}

#[tokio::test(start_paused = true)]
async fn dropping_a_json_request_aborts_its_turn_as_client_disconnect() {
    let engine = engine();
    let app = app(&engine);
    let mut events = engine.subscribe();
    let body = json!({"calls": [{"id": "a", "name": "hang", "input": {}}]});
    let request = tokio::spawn({
        let app = app.clone();
        async move { send(&app, post("/v1/turns", &body)).await }
    });
    let turn_id = until_running(&engine).await;
    request.abort();
    let _ = request.await;
    while !engine.active_turns().is_empty() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(
        ends_of(&mut events, &turn_id),
        vec![
            json!({"turn_abort": "client_disconnect"}),
            json!({"tool_result": "a", "status": "cancelled", "reason": "client_disconnect"}),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn dropping_an_sse_stream_aborts_its_turn_as_client_disconnect() {
    let engine = engine();
    let app = app(&engine);
    let mut events = engine.subscribe();
    let body = json!({"calls": [{"id": "a", "name": "hang", "input": {}}]});
    let mut reader = stream_turn(&app, &body).await;
    let start = reader.next_event().await.unwrap();
    assert_eq!(start.event.as_deref(), Some("turn_start"));
    let turn_id = until_running(&engine).await;
    drop(reader);
    while !engine.active_turns().is_empty() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(
        ends_of(&mut events, &turn_id),
        vec![
            json!({"turn_abort": "client_disconnect"}),
            json!({"tool_result": "a", "status": "cancelled", "reason": "client_disconnect"}),
        ]
    );
}

/// Opens `GET path` as an event stream with optional `Last-Event-ID`.
async fn open_events(
    app: &Router,
    path: &str,
    last_event_id: Option<&str>,
) -> SseReader<impl futures::Stream<Item = Result<axum::body::Bytes, axum::Error>> + Unpin + use<>>
{
    let mut request = Request::get(path);
    if let Some(id) = last_event_id {
        request = request.header("last-event-id", id);
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    SseReader::new(support::body_stream(response.into_body()))
}

/// Reads event frames until one is a `turn_end`.
async fn until_turn_end<S>(reader: &mut SseReader<S>) -> Vec<Frame>
where
    S: futures::Stream<Item = Result<axum::body::Bytes, axum::Error>> + Unpin,
{
    let mut frames = Vec::new();
    loop {
        let frame = reader.next_event().await.unwrap();
        let end = frame.event.as_deref() == Some("turn_end");
        frames.push(frame);
        if end {
            return frames;
        }
    }
}

#[tokio::test(start_paused = true)]
async fn events_can_be_filtered_by_session() {
    let engine = engine();
    let app = app(&engine);
    let mut s1 = open_events(&app, "/v1/events?session_id=s1", None).await;
    let mut all = open_events(&app, "/v1/events", None).await;
    for session in ["s2", "s1"] {
        let body = json!({"session_id": session, "calls": [{"id": "a", "name": "echo", "input": {"text": "x"}}]});
        run_turn(&app, &body).await;
    }
    let frames = until_turn_end(&mut s1).await;
    assert!(
        frames.iter().all(|f| f.data["session_id"] == "s1"),
        "{frames:?}"
    );
    assert_eq!(
        frames
            .iter()
            .map(|f| f.event.clone().unwrap())
            .collect::<Vec<_>>(),
        vec!["turn_start", "tool_start", "tool_result", "turn_end"]
    );
    let first = until_turn_end(&mut all).await;
    let second = until_turn_end(&mut all).await;
    assert_eq!(first[0].data["session_id"], "s2");
    assert_eq!(second[0].data["session_id"], "s1");
    assert_eq!(
        frames.iter().map(|f| &f.data).collect::<Vec<_>>(),
        second.iter().map(|f| &f.data).collect::<Vec<_>>()
    );
}

#[tokio::test(start_paused = true)]
async fn last_event_id_resumes_from_the_replay_ring_and_says_when_events_are_lost() {
    let engine = engine();
    let opts = HttpOptions {
        replay_events: 6,
        ..HttpOptions::default()
    };
    let app = router(engine.clone(), opts);
    for text in ["one", "two", "three"] {
        let body = json!({"session_id": "s1", "calls": [{"id": "a", "name": "echo", "input": {"text": text}}]});
        run_turn(&app, &body).await;
    }
    // 3 turns of 4 events: seqs 1..=12; the ring keeps 7..=12.
    assert_eq!(engine.events().last_seq(), 12);

    let mut resumed = open_events(&app, "/v1/events", Some("8")).await;
    let ids: Vec<Option<String>> = [
        resumed.next_event().await.unwrap(),
        resumed.next_event().await.unwrap(),
    ]
    .into_iter()
    .map(|f| f.id)
    .collect();
    assert_eq!(ids, vec![Some("9".to_owned()), Some("10".to_owned())]);

    let mut gap = open_events(&app, "/v1/events", Some("2")).await;
    let notice = gap.next_event().await.unwrap();
    assert_eq!(
        notice,
        Frame {
            id: None,
            event: Some("lost".into()),
            data: json!({"type": "lost", "reason": "resume_gap", "after_seq": 2, "resumed_at_seq": 7, "missed": 4}),
            comment: None,
        }
    );
    assert_eq!(gap.next_event().await.unwrap().id.as_deref(), Some("7"));

    let mut ahead = open_events(&app, "/v1/events", Some("99")).await;
    let notice = ahead.next_event().await.unwrap();
    assert_eq!(
        notice.data,
        json!({"type": "lost", "reason": "unknown_seq", "after_seq": 99, "last_seq": 12})
    );

    // Caught up: nothing is replayed or lost; the next event is live.
    let mut current = open_events(&app, "/v1/events", Some("12")).await;
    let body = json!({"calls": [{"id": "a", "name": "echo", "input": {"text": "four"}}]});
    run_turn(&app, &body).await;
    assert_eq!(
        current.next_event().await.unwrap().id.as_deref(),
        Some("13")
    );

    let (status, _, answer) = send(
        &app,
        Request::get("/v1/events")
            .header("last-event-id", "x7")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        answer["error"]["message"],
        "Last-Event-ID: expected an event seq (a non-negative integer), got \"x7\""
    );
}

#[tokio::test(start_paused = true)]
async fn a_client_that_falls_behind_is_told_how_many_events_it_lost() {
    let engine = Engine::builder().event_capacity(16).build();
    support::tools(&engine);
    let app = app(&engine);
    let mut slow = open_events(&app, "/v1/events", None).await;
    for _ in 0..10 {
        let body = json!({"calls": [{"id": "a", "name": "echo", "input": {"text": "x"}}]});
        run_turn(&app, &body).await;
    }
    // 40 events into a ring of 16.
    let notice = slow.next_event().await.unwrap();
    assert_eq!(
        notice.data,
        json!({"type": "lost", "reason": "lagged", "missed": 24})
    );
    assert_eq!(slow.next_event().await.unwrap().id.as_deref(), Some("25"));
}

#[tokio::test(start_paused = true)]
async fn a_turn_stream_that_lost_its_turn_end_still_ends_with_one() {
    let engine = Engine::builder().event_capacity(16).build();
    support::tools(&engine);
    let app = app(&engine);
    let body = json!({"session_id": "s1", "calls": [{"id": "a", "name": "echo", "input": {"text": "mine"}}]});
    let mut mine = stream_turn(&app, &body).await;
    while engine.events().last_seq() < 4 || !engine.active_turns().is_empty() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Another turn's 22 events push this turn's 4 out of a bus of 16 before it is read.
    let calls: Vec<Value> = (0..10)
        .map(|i| json!({"id": format!("o{i}"), "name": "echo", "input": {"text": "other"}}))
        .collect();
    run_turn(&app, &json!({"calls": calls})).await;

    let frames = all_frames(&mut mine).await;
    assert_eq!(frames.len(), 2, "{frames:?}");
    assert_eq!(
        frames[0].data,
        json!({"type": "lost", "reason": "lagged", "missed": 10})
    );
    let end = &frames[1];
    assert_eq!(
        (end.id.as_deref(), end.event.as_deref()),
        (None, Some("turn_end"))
    );
    assert_eq!(
        normalized(end.data.clone()),
        json!({"seq": null, "ts": "<ts>", "session_id": "s1", "turn_id": "<turn>", "type": "turn_end",
               "outcome": "completed", "results": [
                   {"type": "tool_result", "tool_use_id": "a", "content": [{"type": "text", "text": "mine"}],
                    "is_error": false, "toolwarden": ok_outcome("a", "echo")}]})
    );
}

#[tokio::test(start_paused = true)]
async fn idle_streams_send_a_keep_alive_comment_every_15_seconds() {
    let engine = engine();
    let app = app(&engine);
    let mut stream = open_events(&app, "/v1/events", None).await;
    let started = tokio::time::Instant::now();
    let first = stream.next().await.unwrap();
    assert_eq!(first.comment.as_deref(), Some("keep-alive"));
    assert_eq!(started.elapsed(), Duration::from_secs(15));
    stream.next().await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_secs(30));
}

/// Starts a turn of one `ask` call; answers the request's task and the pending interaction.
async fn ask_turn(
    engine: &Engine,
    app: &Router,
) -> (tokio::task::JoinHandle<(StatusCode, Value)>, Value) {
    let body = json!({"session_id": "s1", "calls": [{"id": "a", "name": "ask", "input": {"path": "/etc"}}]});
    let turn = tokio::spawn({
        let app = app.clone();
        async move { run_turn(&app, &body).await }
    });
    while engine.interactions().pending().is_empty() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let (status, _, pending) = send(app, get("/v1/interactions")).await;
    assert_eq!(status, StatusCode::OK);
    (turn, pending["interactions"][0].clone())
}

#[tokio::test(start_paused = true)]
async fn an_approval_through_the_api_lets_the_call_run() {
    let engine = engine();
    let app = app(&engine);
    let (turn, interaction) = ask_turn(&engine, &app).await;
    let mut shown = interaction.clone();
    scrub(&mut shown);
    let id = interaction["id"].as_str().unwrap().to_owned();
    assert_eq!(
        shown,
        json!({"id": id, "kind": "approval", "message": "Allow tool \"ask\" to run with this input?",
               "principal": "local", "session_id": "s1", "turn_id": shown["turn_id"], "call_id": "a", "tool": "ask",
               "input": {"path": "/etc"}, "timeout_ms": 120000, "created_at": "<ts>", "deadline": "<ts>"})
    );
    let (status, _, answer) = send(
        &app,
        post(
            &format!("/v1/interactions/{id}"),
            &json!({"action": "approve"}),
        ),
    )
    .await;
    assert_eq!(
        (status, answer),
        (StatusCode::OK, json!({"ok": true, "interaction_id": id}))
    );
    let (_, answer) = turn.await.unwrap();
    assert_eq!(answer["results"][0]["toolwarden"]["status"], "ok");
    assert_eq!(answer["results"][0]["content"][0]["text"], "approved");

    // Answered: no longer pending.
    let (status, _, answer) = send(
        &app,
        post(
            &format!("/v1/interactions/{id}"),
            &json!({"action": "deny"}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        answer["error"]["message"],
        format!("interaction {id} is not pending (unknown, already answered or timed out)")
    );
}

#[tokio::test(start_paused = true)]
async fn a_denial_through_the_api_denies_the_call_with_the_reason() {
    let engine = engine();
    let app = app(&engine);
    let (turn, interaction) = ask_turn(&engine, &app).await;
    let id = interaction["id"].as_str().unwrap();
    let (status, _, _) = send(
        &app,
        post(
            &format!("/v1/interactions/{id}"),
            &json!({"action": "deny", "reason": "not /etc"}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (_, answer) = turn.await.unwrap();
    let outcome = &answer["results"][0]["toolwarden"];
    assert_eq!(
        (
            &outcome["status"],
            &outcome["decider"],
            &outcome["reason"],
            &outcome["detail"]
        ),
        (
            &json!("denied"),
            &json!("policy"),
            &json!("user"),
            &json!("not /etc")
        )
    );
}

#[tokio::test(start_paused = true)]
async fn an_unanswered_approval_times_out_as_a_denial_for_timeout() {
    let engine = engine();
    let app = app(&engine);
    let started = tokio::time::Instant::now();
    let (turn, _) = ask_turn(&engine, &app).await;
    let (_, answer) = turn.await.unwrap();
    let outcome = &answer["results"][0]["toolwarden"];
    assert_eq!(
        (&outcome["status"], &outcome["decider"], &outcome["reason"]),
        (&json!("denied"), &json!("policy"), &json!("timeout"))
    );
    assert_eq!(started.elapsed(), Duration::from_secs(120));
    let (_, _, pending) = send(&app, get("/v1/interactions")).await;
    assert_eq!(pending, json!({"interactions": []}));
}

#[tokio::test(start_paused = true)]
async fn headless_approvals_fail_at_once() {
    let engine = engine();
    let app = router(
        engine.clone(),
        HttpOptions {
            headless: true,
            ..HttpOptions::default()
        },
    );
    let body = json!({"calls": [{"id": "a", "name": "ask", "input": {}}]});
    let started = tokio::time::Instant::now();
    let (_, answer) = run_turn(&app, &body).await;
    let outcome = &answer["results"][0]["toolwarden"];
    assert_eq!(
        (&outcome["status"], &outcome["decider"], &outcome["reason"]),
        (
            &json!("denied"),
            &json!("headless"),
            &json!("no_interactor")
        )
    );
    assert_eq!(started.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn a_password_approval_must_carry_a_value() {
    let engine = engine();
    let app = app(&engine);
    let asker = tokio::spawn({
        let engine = engine.clone();
        async move {
            engine
                .interactions()
                .ask(
                    InteractionRequest {
                        kind: InteractionKind::Password,
                        message: "API key for server x".into(),
                        scope: Default::default(),
                        input: None,
                        details: None,
                        timeout: Duration::from_secs(120),
                        default_action: None,
                    },
                    std::future::pending(),
                )
                .await
        }
    });
    while engine.interactions().pending().is_empty() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let id = engine.interactions().pending()[0].id.to_string();
    let path = format!("/v1/interactions/{id}");
    let (status, _, answer) = send(&app, post(&path, &json!({"action": "approve"}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        answer["error"]["message"],
        format!(
            "value: missing; interaction {id} asks for a secret: an approval must carry a value"
        )
    );
    let (status, _, _) = send(
        &app,
        post(&path, &json!({"action": "approve", "value": "hunter2"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let end = asker.await.unwrap().unwrap();
    assert!(
        matches!(end, toolwarden_core::InteractionEnd::Answered(a) if a.value.as_deref() == Some("hunter2"))
    );
}

#[tokio::test(start_paused = true)]
async fn bad_answers_are_400_and_unknown_interactions_404() {
    let engine = engine();
    let app = app(&engine);
    let check = |body: Value, expected: &'static str| {
        let app = app.clone();
        async move {
            let (status, _, answer) = send(&app, post("/v1/interactions/i_nope", &body)).await;
            assert_eq!(
                (status, answer["error"]["message"].as_str().unwrap()),
                (StatusCode::BAD_REQUEST, expected),
                "{body}"
            );
        }
    };
    check(json!({}), "action: missing").await;
    check(
        json!({"action": "maybe"}),
        "action: expected \"approve\" or \"deny\", got \"maybe\"",
    )
    .await;
    check(
        json!({"action": "deny", "reason": 3}),
        "reason: expected a string, got 3",
    )
    .await;
    check(
        json!({"action": "deny", "reasons": "no"}),
        "reasons: unknown key; did you mean \"reason\"? expected action, value, reason",
    )
    .await;
    check(
        json!(["approve"]),
        "body: expected a JSON object {\"action\": \"approve\" | \"deny\", ...}",
    )
    .await;
    let (status, _, answer) = send(
        &app,
        post("/v1/interactions/i_nope", &json!({"action": "deny"})),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(answer["error"]["code"], "not_found");
}

#[tokio::test(start_paused = true)]
async fn with_a_token_every_path_but_healthz_needs_it() {
    let engine = engine();
    let app = router(
        engine.clone(),
        HttpOptions {
            token: Some("s3cret".into()),
            ..HttpOptions::default()
        },
    );
    let with = |auth: Option<&'static str>, path: &str| {
        let mut r = Request::get(path);
        if let Some(a) = auth {
            r = r.header(header::AUTHORIZATION, a);
        }
        r.body(Body::empty()).unwrap()
    };
    for path in ["/v1/tools", "/metrics", "/v1/turns/active", "/nowhere"] {
        let (status, headers, answer) = send(&app, with(None, path)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}");
        assert_eq!(answer["error"]["code"], "unauthorized");
        assert_eq!(
            headers[header::WWW_AUTHENTICATE],
            "Bearer realm=\"toolwarden\""
        );
        let (status, _, answer) = send(&app, with(Some("Bearer wrong"), path)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}");
        assert_eq!(answer["error"]["message"], "the bearer token is wrong");
    }
    let (status, _, _) = send(&app, with(Some("Bearer s3cret"), "/v1/tools")).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, _) = send(&app, with(Some("bearer s3cret"), "/v1/tools")).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, _) = send(&app, with(Some("Basic s3cret"), "/v1/tools")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _, _) = send(&app, with(None, "/healthz")).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn without_a_token_only_loopback_hosts_and_origins_are_served() {
    let engine = engine();
    let app = app(&engine);
    let req = |host: &'static str, origin: Option<&'static str>| {
        let mut r = Request::get("/v1/tools").header(header::HOST, host);
        if let Some(o) = origin {
            r = r.header(header::ORIGIN, o);
        }
        r.body(Body::empty()).unwrap()
    };
    let (status, _, _) = send(&app, req("127.0.0.1:7420", Some("http://127.0.0.1:7420"))).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, answer) = send(&app, req("evil.example:7420", None)).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(answer["error"]["code"], "forbidden");
    let (status, _, _) = send(&app, req("localhost:7420", Some("https://evil.example"))).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

#[tokio::test(start_paused = true)]
async fn the_mcp_endpoint_is_behind_the_host_guard_with_or_without_a_token() {
    for token in [None, Some("s3cret")] {
        let mcp = Router::new().route("/mcp", axum::routing::post(|| async { "mcp" }));
        let opts = HttpOptions {
            token: token.map(str::to_owned),
            ..HttpOptions::default()
        };
        let app = toolwarden_http::router_with(engine(), opts, Some(mcp));
        let req = |host: &'static str, origin: Option<&'static str>| {
            let mut r = Request::post("/mcp").header(header::HOST, host);
            if let Some(o) = origin {
                r = r.header(header::ORIGIN, o);
            }
            if token.is_some() {
                r = r.header(header::AUTHORIZATION, "Bearer s3cret");
            }
            r.body(Body::empty()).unwrap()
        };
        // Twice each: the second answer comes from what the guard remembers of the first.
        for _ in 0..2 {
            let ok = app
                .clone()
                .oneshot(req("127.0.0.1:7420", None))
                .await
                .unwrap();
            assert_eq!(ok.status(), StatusCode::OK, "{token:?}");
            let (status, _, answer) = send(&app, req("evil.example:7420", None)).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{token:?}");
            assert_eq!(answer["error"]["code"], "forbidden");
            let (status, _, _) = send(&app, req("localhost", Some("https://evil.example"))).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{token:?}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn bodies_over_the_limit_are_413() {
    let engine = engine();
    let app = router(
        engine.clone(),
        HttpOptions {
            max_body: 1024,
            ..HttpOptions::default()
        },
    );
    let big = "x".repeat(2000);
    let body = json!({"calls": [{"id": "a", "name": "echo", "input": {"text": big}}]});
    let (status, _, answer) = send(&app, post("/v1/turns", &body)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        answer,
        json!({"error": {"code": "payload_too_large", "message": "body: larger than the server's limit (max_body)"}})
    );
    let (status, _, _) = send(
        &app,
        post(
            "/v1/interactions/i_1",
            &json!({"action": "deny", "reason": big}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
}

/// Posts a raw body as JSON and expects a 400 saying `expected`.
async fn check_400(app: &Router, body: &str, expected: &str) {
    let request = Request::post("/v1/turns")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_owned()))
        .unwrap();
    let (status, _, answer) = send(app, request).await;
    assert_eq!(
        (status, answer),
        (
            StatusCode::BAD_REQUEST,
            json!({"error": {"code": "invalid_request", "message": expected}})
        ),
        "{body}"
    );
}

#[tokio::test(start_paused = true)]
async fn bad_turn_bodies_are_400_saying_what_and_where() {
    let engine = engine();
    let app = app(&engine);
    let f = |id: &str, args: &str| json!({"id": id, "type": "function", "function": {"name": "echo", "arguments": args}});
    let a = |id: &str| json!({"type": "tool_use", "id": id, "name": "echo", "input": {}});
    let cases: Vec<(String, &str)> = vec![
        ("".into(), "body: empty; expected a JSON object with \"calls\""),
        ("{\"calls\": [".into(), "body: malformed JSON: EOF while parsing a list at line 1 column 11"),
        ("[1]".into(), "body: expected a JSON object, got an array"),
        ("{}".into(), "calls: missing; a turn needs at least one call"),
        (json!({"calls": []}).to_string(), "calls: empty; a turn needs at least one call"),
        (json!({"calls": {}}).to_string(), "calls: expected an array, got an object"),
        (json!({"session_id": 7, "calls": [a("x")]}).to_string(), "session_id: expected a string, got a number"),
        (json!({"parent_turn_id": "", "calls": [a("x")]}).to_string(), "parent_turn_id: must not be empty"),
        (json!({"calls": ["echo"]}).to_string(),
         "calls[0]: expected an object (an Anthropic tool_use block or an OpenAI tool call), got a string"),
        (json!({"calls": [a("x"), f("y", "{}")]}).to_string(),
         "calls[1]: an OpenAI tool call, but calls[0] is an Anthropic tool_use block; one family per request"),
        (json!({"calls": [f("x", "{}"), a("y")]}).to_string(),
         "calls[1]: an Anthropic tool_use block, but calls[0] is an OpenAI tool call; one family per request"),
        (json!({"calls": [a("x"), a("y"), a("x")]}).to_string(),
         "calls[2].id: \"x\" is already the id of calls[0]; ids must be unique within a turn"),
        (json!({"calls": [f("x", "{}"), f("y", "{}"), f("z", "{\"a\": }")]}).to_string(),
         "calls[2].function.arguments: expected JSON, expected value at line 1 column 7"),
        (json!({"calls": [f("x", "[1]")]}).to_string(),
         "calls[0].function.arguments: expected a JSON object, got an array"),
        (json!({"calls": [{"id": "x", "type": "function", "function": {"name": "echo", "arguments": {}}}]}).to_string(),
         "calls[0].function.arguments: expected a string holding JSON, got an object"),
        (json!({"calls": [{"id": "x", "type": "function", "function": {"name": "echo"}}]}).to_string(),
         "calls[0].function.arguments: missing"),
        (json!({"calls": [{"id": "x", "type": "function"}]}).to_string(), "calls[0].function: missing"),
        (json!({"calls": [{"id": "x", "type": "function", "function": "echo"}]}).to_string(),
         "calls[0].function: expected an object, got a string"),
        (json!({"calls": [{"id": "x", "type": "function", "function": {"arguments": "{}"}}]}).to_string(),
         "calls[0].function.name: missing"),
        (json!({"calls": [{"type": "tool_use", "name": "echo"}]}).to_string(), "calls[0].id: missing"),
        (json!({"calls": [{"type": "tool_use", "id": "", "name": "echo"}]}).to_string(), "calls[0].id: must not be empty"),
        (json!({"calls": [{"type": "tool_use", "id": 5, "name": "echo"}]}).to_string(), "calls[0].id: expected a string, got a number"),
        (json!({"calls": [{"type": "tool_use", "id": "x"}]}).to_string(), "calls[0].name: missing"),
        (json!({"calls": [{"type": "tool_use", "id": "x", "name": "echo", "input": "hi"}]}).to_string(),
         "calls[0].input: expected an object, got a string"),
        (json!({"calls": [{"type": "text", "text": "hi"}]}).to_string(),
         "calls[0].type: expected \"tool_use\" (Anthropic) or \"function\" (OpenAI), got \"text\""),
        (json!({"calls": [{"type": "tool_use", "id": "x", "name": "echo", "timeout_ms": -5}]}).to_string(),
         "calls[0].timeout_ms: expected a non-negative integer of milliseconds, got -5"),
        (json!({"calls": [{"type": "tool_use", "id": "x", "name": "echo", "timeout_ms": "5s"}]}).to_string(),
         "calls[0].timeout_ms: expected a non-negative integer of milliseconds, got \"5s\""),
        // Unknown keys, wherever they stand, with the nearest known one.
        (json!({"session": "agent-1", "calls": [a("x")]}).to_string(),
         "session: unknown key; did you mean \"session_id\"? expected session_id, parent_turn_id, calls, detach"),
        (json!({"calls": [a("x")], "priority": 1}).to_string(),
         "priority: unknown key; expected session_id, parent_turn_id, calls, detach"),
        (json!({"calls": [{"type": "tool_use", "id": "x", "name": "echo", "timeout": 5}]}).to_string(),
         "calls[0].timeout: unknown key; did you mean \"timeout_ms\"? expected type, id, name, input, timeout_ms, idle_timeout_ms, cache_control, caller"),
        (json!({"calls": [{"id": "x", "type": "function", "function": {"name": "echo", "arguments": "{}"}, "idle_timeout": 5}]}).to_string(),
         "calls[0].idle_timeout: unknown key; did you mean \"idle_timeout_ms\"? expected id, type, function, index, timeout_ms, idle_timeout_ms"),
        (json!({"calls": [{"id": "x", "type": "function", "function": {"name": "echo", "arguments": "{}", "args": "{}"}}]}).to_string(),
         "calls[0].function.args: unknown key; expected name, arguments"),
    ];
    for (body, expected) in cases {
        check_400(&app, &body, expected).await;
    }
}

#[tokio::test(start_paused = true)]
async fn errors_are_json_with_fitting_statuses() {
    let engine = engine();
    let app = app(&engine);
    let (status, _, answer) = send(&app, get("/v2/nothing")).await;
    assert_eq!(
        (status, answer),
        (
            StatusCode::NOT_FOUND,
            json!({"error": {"code": "not_found", "message": "no endpoint at /v2/nothing"}})
        )
    );
    let (status, headers, answer) = send(&app, get("/v1/turns")).await;
    assert_eq!(
        (status, answer),
        (
            StatusCode::METHOD_NOT_ALLOWED,
            json!({"error": {"code": "method_not_allowed", "message": "/v1/turns does not accept GET"}})
        )
    );
    assert_eq!(headers[header::ALLOW], "POST");
    let request = Request::post("/v1/turns")
        .header(header::CONTENT_TYPE, "text/plain")
        .body(Body::from("{}"))
        .unwrap();
    let (status, _, answer) = send(&app, request).await;
    assert_eq!(
        (status, answer),
        (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            json!({"error": {"code": "unsupported_media_type", "message": "Content-Type: expected application/json, got text/plain"}})
        )
    );
    let (status, _, answer) = send(&app, post_empty("/v1/turns")).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(
        answer["error"]["message"],
        "Content-Type: missing; expected application/json"
    );
    let (status, _, answer) = send(&app, get("/v1/sessions/nobody/status")).await;
    assert_eq!(
        (status, answer),
        (
            StatusCode::NOT_FOUND,
            json!({"error": {"code": "not_found", "message": "session nobody is unknown"}})
        )
    );
}

#[tokio::test(start_paused = true)]
async fn session_status_and_tools_describe_what_ran() {
    let engine = engine();
    let app = app(&engine);
    run_turn(&app, &three_calls_anthropic()).await;
    let (status, _, answer) = send(&app, get("/v1/sessions/s1/status")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(answer["session_id"], "s1");
    assert_eq!(answer["counts"], json!({"ok": 2, "timeout": 1}));
    assert_eq!(answer["timed_out_tools"], json!({"hang": 1}));
    assert_eq!(answer["running"], json!([]));

    let (status, _, answer) = send(&app, get("/v1/tools")).await;
    assert_eq!(status, StatusCode::OK);
    let names: Vec<&str> = answer["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["ask", "echo", "hang", "pic", "sleep"]);
    let ask = &answer["tools"][0];
    assert_eq!(
        (
            &ask["backend"],
            &ask["backend_state"],
            &ask["breaker"],
            &ask["policy"]["approval"]
        ),
        (
            &json!("inprocess"),
            &json!("up"),
            &json!("closed"),
            &json!("ask")
        )
    );
}

#[tokio::test(start_paused = true)]
async fn metrics_show_every_spec_name_after_a_turn() {
    let engine = engine();
    let app = app(&engine);
    // Families without a sample are left out of the exposition: have a server report and an
    // approval time out, as well as the turn, so that every family has one.
    let host = engine.host(true);
    host.server_state("fs", ServerStateKind::Up, None);
    host.set_abandoned("fs", 0);
    run_turn(&app, &three_calls_anthropic()).await;
    run_turn(
        &app,
        &json!({"calls": [{"id": "a", "name": "ask", "input": {}}]}),
    )
    .await;
    let (status, headers, answer) = send(&app, get("/metrics")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers[header::CONTENT_TYPE], METRICS_CONTENT_TYPE);
    let text = answer["text"].as_str().unwrap();
    for name in [
        "toolwarden_tool_calls_total{tool=\"echo\",outcome=\"ok\"} 2",
        "toolwarden_tool_calls_total{tool=\"hang\",outcome=\"timeout\"} 1",
        "toolwarden_tool_call_duration_seconds_bucket{",
        "toolwarden_tool_errors_total{tool=\"hang\",reason=\"timeout_total\"} 1",
        "toolwarden_tool_cache_hits_total{tool=\"echo\"} 0",
        "toolwarden_tool_calls_in_flight{tool=\"hang\"} 0",
        "toolwarden_abandoned_calls{server=\"fs\"} 0",
        "toolwarden_breaker_state{tool=\"echo\"} 0",
        "toolwarden_interactions_total{kind=\"approval\",outcome=\"timed_out\"} 1",
        "toolwarden_turns_total{outcome=\"partial\"} 2",
        "toolwarden_server_up{server=\"fs\"} 1",
    ] {
        assert!(text.contains(name), "{name} missing from:\n{text}");
    }
}

#[tokio::test(start_paused = true)]
async fn healthz_answers_with_server_states() {
    let engine = engine();
    let app = app(&engine);
    let (status, _, answer) = send(&app, get("/healthz")).await;
    assert_eq!(
        (status, answer),
        (
            StatusCode::OK,
            json!({"status": "ok", "store": "skipped", "redis": "skipped", "servers": {}})
        )
    );
    let host = engine.host(true);
    host.server_state("fs", ServerStateKind::Up, None);
    host.server_state(
        "web",
        ServerStateKind::Down,
        Some("connection refused".into()),
    );
    let (status, _, answer) = send(&app, get("/healthz")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        answer["servers"],
        json!({"fs": {"state": "up"}, "web": {"state": "down", "detail": "connection refused"}})
    );
}
