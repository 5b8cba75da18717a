//! The MCP gateway served over a byte-stream pair (as on stdio) to a Rust rmcp client, with
//! real `tw-test-server` processes behind it: listing, calls, progress, timeouts, cancels,
//! disconnects, server-initiated requests, list changes and approvals through elicitation.
#![allow(clippy::expect_used, clippy::unwrap_used, reason = "tests")]

mod support;

use std::time::Duration;

use pretty_assertions::assert_eq;
use rmcp::model::CancelledNotificationParam;
use serde_json::{Value, json};
use support::{
    TestClient, WAIT, call, call_with, connect, outcome, server_cancels, setup, start_call, text,
};
use toolwarden_core::protocol::EventKind;
use toolwarden_mcp::STATUS_TOOL;

fn names(tools: &[rmcp::model::Tool]) -> Vec<String> {
    let mut v: Vec<String> = tools.iter().map(|t| t.name.to_string()).collect();
    v.sort();
    v
}

#[tokio::test]
async fn lists_every_governed_tool_prefixed_with_annotations_and_the_status_tool() {
    let s = setup(&["t"], true, "").await;
    let (client, _serving, _shutdown) = connect(&s.gateway, TestClient::new()).await;
    let tools = client.peer().list_all_tools().await.unwrap();
    let listed = names(&tools);
    for expected in [
        "add",
        "counter",
        "guarded",
        "t__echo",
        "t__sleep",
        "t__wipe",
        STATUS_TOOL,
    ] {
        assert!(
            listed.contains(&expected.to_owned()),
            "{expected} missing from {listed:?}"
        );
    }
    assert!(
        !listed.iter().any(|n| n == "echo"),
        "MCP tools are prefixed: {listed:?}"
    );
    let echo = tools.iter().find(|t| t.name == "t__echo").unwrap();
    assert_eq!(
        serde_json::to_value(&echo.annotations).unwrap(),
        json!({"readOnlyHint": true})
    );
    assert_eq!(echo.description.as_deref(), Some("Answers its text."));
    let wipe = tools.iter().find(|t| t.name == "t__wipe").unwrap();
    assert_eq!(
        serde_json::to_value(&wipe.annotations).unwrap(),
        json!({"destructiveHint": true})
    );
    let status = tools.iter().find(|t| t.name == STATUS_TOOL).unwrap();
    assert_eq!(
        status.annotations.as_ref().and_then(|a| a.read_only_hint),
        Some(true)
    );
    let info = client.peer().peer_info().unwrap();
    assert_eq!(
        info.server_info.as_ref().map(|i| i.name.as_str()),
        Some("toolwarden")
    );
    let caps = serde_json::to_value(&info.capabilities).unwrap();
    for cap in ["tools", "prompts", "resources", "completions", "logging"] {
        assert!(caps.get(cap).is_some(), "{cap} is not advertised: {caps}");
    }
    drop(client);
    s.shutdown().await;
}

#[tokio::test]
async fn a_call_returns_the_tools_content_and_its_outcome() {
    let s = setup(&["t"], true, "").await;
    let (client, _serving, _shutdown) = connect(&s.gateway, TestClient::new()).await;
    let r = call(
        &client,
        "t__echo",
        json!({"text": "hi", "structured": true}),
    )
    .await;
    assert_eq!(text(&r), "hi");
    assert_eq!(r["isError"], json!(false));
    assert_eq!(r["structuredContent"], json!({"text": "hi"}));
    let o = outcome(&r);
    assert_eq!(o["status"], json!("ok"));
    assert_eq!(o["tool"], json!("t__echo"));
    assert_eq!(o["attempts"], json!(1));
    // In-process tools are governed the same way.
    let r = call(&client, "add", json!({"a": 2, "b": 3})).await;
    assert_eq!(text(&r), "5");
    // A tool's own error is an error result, not a JSON-RPC error.
    let r = call(&client, "t__fail", json!({})).await;
    assert_eq!(r["isError"], json!(true));
    assert_eq!(outcome(&r)["status"], json!("error"));
    assert_eq!(outcome(&r)["reason"], json!("tool_error"));
    // So is an unknown tool, and input that fails the schema.
    let r = call(&client, "t__nope", json!({})).await;
    assert_eq!(r["isError"], json!(true));
    assert_eq!(outcome(&r)["status"], json!("invalid"));
    assert_eq!(outcome(&r)["reason"], json!("unknown_tool"));
    assert!(text(&r).starts_with("[INVALID]"), "{}", text(&r));
    let r = call(&client, "add", json!({"a": "two"})).await;
    assert_eq!(outcome(&r)["reason"], json!("schema"));
    drop(client);
    s.shutdown().await;
}

#[tokio::test]
async fn progress_reaches_the_client_under_its_own_token_and_stops_at_the_result() {
    let s = setup(&["t"], true, "").await;
    let client_handler = TestClient::new();
    let (client, _serving, _shutdown) = connect(&s.gateway, client_handler.clone()).await;
    let handle = start_call(
        &client,
        "t__progress",
        json!({"every_ms": 20, "count": 5}),
        json!({}),
    )
    .await;
    let token = handle.progress_token.clone();
    let r = handle.await_response().await.unwrap();
    let r = serde_json::to_value(r).unwrap();
    assert_eq!(text(&r), "done after 5 steps");
    let seen = client_handler
        .wait("five progress reports", |s| s.progress.len() >= 5)
        .await;
    // Late ones would arrive now.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let seen_after = client_handler.seen();
    assert_eq!(seen_after.progress.len(), 5, "{:?}", seen_after.progress);
    let mut values: Vec<f64> = seen.progress.iter().map(|p| p.progress).collect();
    assert!(seen.progress.iter().all(|p| p.progress_token == token));
    // rmcp hands each notification to its own task, so they may be seen out of order.
    values.sort_by(f64::total_cmp);
    assert_eq!(values, vec![1.0, 2.0, 3.0, 4.0, 5.0]);
    assert!(seen.progress.iter().all(|p| p.total == Some(5.0)));
    // In-process progress is relayed the same way.
    let handle = start_call(&client, "counter", json!({"count": 3}), json!({})).await;
    let token = handle.progress_token.clone();
    handle.await_response().await.unwrap();
    let seen = client_handler
        .wait("three more", |s| {
            s.progress
                .iter()
                .filter(|p| p.progress_token == token)
                .count()
                == 3
        })
        .await;
    let messages: Vec<String> = seen
        .progress
        .iter()
        .filter(|p| p.progress_token == token)
        .filter_map(|p| p.message.clone())
        .collect();
    assert_eq!(messages.len(), 3);
    drop(client);
    s.shutdown().await;
}

#[tokio::test]
async fn a_timeout_from_meta_or_policy_is_an_error_result_with_the_outcome() {
    let s = setup(
        &["t"],
        true,
        "[tools.\"t__hang\"]\ntimeout = \"300ms\"\ncancel_grace = \"200ms\"\n",
    )
    .await;
    let (client, _serving, _shutdown) = connect(&s.gateway, TestClient::new()).await;
    // The per-call hint in _meta.
    let r = call_with(
        &client,
        "t__sleep",
        json!({"ms": 10_000}),
        json!({"timeout_ms": 250}),
    )
    .await;
    assert_eq!(r["isError"], json!(true));
    let o = outcome(&r);
    assert_eq!(
        (
            o["status"].clone(),
            o["kind"].clone(),
            o["after_ms"].clone()
        ),
        (json!("timeout"), json!("total"), json!(250))
    );
    assert!(text(&r).starts_with("[TIMEOUT]"), "{}", text(&r));
    // toolwarden's own key works too.
    let r = call_with(
        &client,
        "t__sleep",
        json!({"ms": 10_000}),
        json!({"toolwarden/timeout_ms": 200}),
    )
    .await;
    assert_eq!(outcome(&r)["after_ms"], json!(200));
    // The policy's timeout.
    let r = call(&client, "t__hang", json!({})).await;
    let o = outcome(&r);
    assert_eq!(
        (o["status"].clone(), o["after_ms"].clone()),
        (json!("timeout"), json!(300))
    );
    // The server was told to stop, for that request, with the reason (the outcome comes at
    // once; the cancel goes out behind it).
    support::wait_for(|| async { server_cancels(&client, "t__cancels").await.len() == 3 }).await;
    let cancels = server_cancels(&client, "t__cancels").await;
    let reasons: Vec<(Value, Value)> = cancels
        .iter()
        .map(|c| (c["tool"].clone(), c["reason"].clone()))
        .collect();
    assert_eq!(
        reasons,
        vec![
            (json!("sleep"), json!("timeout")),
            (json!("sleep"), json!("timeout")),
            (json!("hang"), json!("timeout")),
        ]
    );
    drop(client);
    s.shutdown().await;
}

#[tokio::test]
async fn a_client_cancel_reaches_the_backend_server_for_that_request_only() {
    let s = setup(&["t"], true, "").await;
    let (client, _serving, _shutdown) = connect(&s.gateway, TestClient::new()).await;
    let keep = start_call(&client, "t__sleep", json!({"ms": 1500}), json!({})).await;
    let stop = start_call(&client, "t__sleep", json!({"ms": 30_000}), json!({})).await;
    s.event("both calls started", |e| {
        matches!(e.kind, EventKind::ToolStart { ref input, .. } if input["ms"] == json!(30_000))
    })
    .await;
    client
        .peer()
        .notify_cancelled(CancelledNotificationParam::new(
            Some(stop.id.clone()),
            Some("the user pressed Esc".into()),
        ))
        .await
        .unwrap();
    let o = s
        .event("the cancelled call's result", |e| {
            e.scope.call_id.as_ref().map(|c| c.as_str()) == Some(stop.id.to_string().as_str())
                && matches!(e.kind, EventKind::ToolResult { .. })
        })
        .await;
    let EventKind::ToolResult { result, .. } = &o.kind else {
        unreachable!()
    };
    assert_eq!(
        serde_json::to_value(&result.outcome.status).unwrap(),
        json!({"status": "cancelled", "reason": "user"})
    );
    // The other call goes on and answers.
    let r = serde_json::to_value(keep.await_response().await.unwrap()).unwrap();
    assert_eq!(text(&r), "slept 1500 ms");
    support::wait_for(|| async { !server_cancels(&client, "t__cancels").await.is_empty() }).await;
    let cancels = server_cancels(&client, "t__cancels").await;
    assert_eq!(cancels.len(), 1, "{cancels:?}");
    assert_eq!(cancels[0]["tool"], json!("sleep"), "{cancels:?}");
    assert_eq!(cancels[0]["arguments"], json!({"ms": 30_000}));
    assert_eq!(cancels[0]["reason"], json!("user"));
    drop(client);
    s.shutdown().await;
}

#[tokio::test]
async fn a_client_that_disconnects_ends_its_calls_as_client_disconnect() {
    let s = setup(&["t"], true, "").await;
    let (client, serving, _shutdown) = connect(&s.gateway, TestClient::new()).await;
    let _pending = start_call(&client, "t__sleep", json!({"ms": 30_000}), json!({})).await;
    s.event("the call started", |e| {
        matches!(e.kind, EventKind::ToolStart { .. })
    })
    .await;
    assert_eq!(s.gateway.clients(), 1);
    client.cancel().await.unwrap();
    let o = s.outcome_of("t__sleep").await;
    assert_eq!(o["status"], json!("cancelled"));
    assert_eq!(o["reason"], json!("client_disconnect"));
    tokio::time::timeout(WAIT, serving)
        .await
        .expect("the gateway stops serving the gone client")
        .unwrap()
        .unwrap();
    assert_eq!(s.gateway.clients(), 0);
    // The server heard about it.
    let (client, _serving, _shutdown) = connect(&s.gateway, TestClient::new()).await;
    support::wait_for(|| async { !server_cancels(&client, "t__cancels").await.is_empty() }).await;
    let cancels = server_cancels(&client, "t__cancels").await;
    assert_eq!(cancels.len(), 1, "{cancels:?}");
    assert_eq!(cancels[0]["reason"], json!("client_disconnect"));
    drop(client);
    s.shutdown().await;
}

#[tokio::test]
async fn shutdown_ends_the_calls_as_shutdown_and_stops_serving() {
    let s = setup(&["t"], true, "").await;
    let (client, serving, shutdown) = connect(&s.gateway, TestClient::new()).await;
    let _pending = start_call(&client, "t__sleep", json!({"ms": 30_000}), json!({})).await;
    s.event("the call started", |e| {
        matches!(e.kind, EventKind::ToolStart { .. })
    })
    .await;
    shutdown.cancel();
    let o = s.outcome_of("t__sleep").await;
    assert_eq!(o["reason"], json!("shutdown"));
    tokio::time::timeout(WAIT, serving)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    drop(client);
    s.shutdown().await;
}

#[tokio::test]
async fn the_status_tool_tells_the_model_how_its_calls_are_doing() {
    let s = setup(&["t"], true, "").await;
    let (client, _serving, _shutdown) = connect(&s.gateway, TestClient::new()).await;
    let r = call(&client, STATUS_TOOL, json!({})).await;
    assert!(text(&r).contains("Running now: nothing."), "{}", text(&r));
    call_with(
        &client,
        "t__sleep",
        json!({"ms": 5000}),
        json!({"timeout_ms": 100}),
    )
    .await;
    call(&client, "t__fail", json!({})).await;
    let _running = start_call(&client, "t__sleep", json!({"ms": 30_000}), json!({})).await;
    s.event("the long call started", |e| {
        matches!(e.kind, EventKind::ToolStart { ref input, .. } if input["ms"] == json!(30_000))
    })
    .await;
    let r = call(&client, STATUS_TOOL, json!({})).await;
    let t = text(&r);
    assert!(t.contains("Running now (1):"), "{t}");
    assert!(t.contains("- t__sleep (call"), "{t}");
    assert!(t.contains("Tools that timed out: t__sleep (1×)"), "{t}");
    assert!(t.contains("error (tool_error)"), "{t}");
    let st = &r["structuredContent"];
    assert_eq!(st["running"].as_array().map(Vec::len), Some(1));
    assert_eq!(st["timed_out_tools"], json!({"t__sleep": 1}));
    drop(client);
    s.shutdown().await;
}

#[tokio::test]
async fn a_servers_sampling_elicitation_and_roots_requests_reach_the_calling_client() {
    let s = setup(&["t"], true, "").await;
    let client_handler = TestClient::new();
    let (client, _serving, _shutdown) = connect(&s.gateway, client_handler.clone()).await;
    let r = call(&client, "t__sample", json!({"prompt": "what is 6*7?"})).await;
    assert_eq!(text(&r), "sampled: what is 6*7?");
    let r = call(&client, "t__elicit", json!({"message": "Your answer?"})).await;
    assert_eq!(
        r["structuredContent"],
        json!({"action": "accept", "content": {"answer": "42", "approve": true}})
    );
    let seen = client_handler.seen();
    assert_eq!(seen.elicitations[0]["message"], json!("Your answer?"));
    let r = call(&client, "t__roots", json!({})).await;
    assert_eq!(
        r["structuredContent"]["roots"],
        json!([{"uri": "file:///work", "name": "work"}])
    );
    // A client without those capabilities: the server is told so, as an error.
    let (bare, _serving2, _shutdown2) = connect(&s.gateway, TestClient::bare()).await;
    let r = call(&bare, "t__sample", json!({"prompt": "x"})).await;
    assert_eq!(r["isError"], json!(true));
    assert!(text(&r).contains("does not support"), "{}", text(&r));
    drop(client);
    drop(bare);
    s.shutdown().await;
}

#[tokio::test]
async fn a_servers_tool_list_change_reaches_the_clients() {
    let s = setup(&["t"], true, "").await;
    let client_handler = TestClient::new();
    let (client, _serving, _shutdown) = connect(&s.gateway, client_handler.clone()).await;
    let before = names(&client.peer().list_all_tools().await.unwrap());
    assert!(!before.contains(&"t__bonus".to_owned()));
    call(&client, "t__toggle_tools", json!({})).await;
    client_handler
        .wait("tools/list_changed", |s| s.tools_changed >= 1)
        .await;
    let after = names(&client.peer().list_all_tools().await.unwrap());
    assert!(after.contains(&"t__bonus".to_owned()), "{after:?}");
    let r = call(&client, "t__bonus", json!({})).await;
    assert_eq!(text(&r), "bonus");
    drop(client);
    s.shutdown().await;
}

#[tokio::test]
async fn approvals_are_asked_of_the_client_through_elicitation() {
    let s = setup(&["t"], true, "[tools.guarded]\napproval_timeout = \"2s\"\n").await;
    let client_handler = TestClient::new();
    let (client, _serving, _shutdown) = connect(&s.gateway, client_handler.clone()).await;
    // Approved.
    let r = call(&client, "guarded", json!({"what": "deploy"})).await;
    assert_eq!(text(&r), "done");
    let asked = client_handler.seen().elicitations[0].clone();
    assert!(
        asked["message"].as_str().unwrap().contains("guarded"),
        "{asked}"
    );
    assert_eq!(
        asked["requestedSchema"]["properties"]["approve"]["type"],
        json!("boolean")
    );
    // Declined.
    *client_handler.elicit_answer.lock() = Some(json!({"action": "decline"}));
    let r = call(&client, "guarded", json!({"what": "deploy again"})).await;
    let o = outcome(&r);
    assert_eq!(
        (
            o["status"].clone(),
            o["decider"].clone(),
            o["reason"].clone()
        ),
        (json!("denied"), json!("policy"), json!("user"))
    );
    // Never answered: the deadline denies it, and the elicitation is withdrawn.
    *client_handler.elicit_answer.lock() = None;
    let r = call(&client, "guarded", json!({"what": "once more"})).await;
    let o = outcome(&r);
    assert_eq!(
        (o["status"].clone(), o["reason"].clone()),
        (json!("denied"), json!("timeout"))
    );
    client_handler
        .wait("the elicitation withdrawn", |s| !s.cancelled.is_empty())
        .await;
    // A client without elicitation (and nothing else attached): headless, denied at once.
    let (bare, _serving2, _shutdown2) = connect(&s.gateway, TestClient::bare()).await;
    let r = call(&bare, "guarded", json!({})).await;
    let o = outcome(&r);
    assert_eq!(
        (o["decider"].clone(), o["reason"].clone()),
        (json!("headless"), json!("no_interactor"))
    );
    drop(client);
    drop(bare);
    s.shutdown().await;
}

/// Reads JSON-RPC lines until one satisfies `done`; returns every line read.
async fn read_until(
    lines: &mut tokio::io::Lines<
        tokio::io::BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>,
    >,
    done: impl Fn(&Value) -> bool,
) -> Vec<Value> {
    let mut read = Vec::new();
    loop {
        let line = tokio::time::timeout(WAIT, lines.next_line())
            .await
            .expect("a line in time")
            .unwrap()
            .expect("the gateway is still there");
        let v: Value = serde_json::from_str(&line).unwrap();
        let stop = done(&v);
        read.push(v);
        if stop {
            return read;
        }
    }
}

#[tokio::test]
async fn progress_tokens_are_mapped_both_ways_on_the_wire() {
    use tokio::io::AsyncWriteExt as _;
    let s = setup(&["t"], true, "").await;
    let support::Pipe {
        mut lines,
        write: mut w,
        serving,
        ..
    } = support::serve_pipe(&s.gateway, 1 << 20);
    let mut send = async |v: Value| {
        w.write_all(format!("{v}\n").as_bytes()).await.unwrap();
    };
    send(
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"}}}),
    )
    .await;
    read_until(&mut lines, |v| v["id"] == json!(0)).await;
    send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
    send(
        json!({"jsonrpc": "2.0", "id": "call-1", "method": "tools/call", "params": {
        "name": "t__progress", "arguments": {"every_ms": 20, "count": 3},
        "_meta": {"progressToken": "the-clients-token"}}}),
    )
    .await;
    let read = read_until(&mut lines, |v| v["id"] == json!("call-1")).await;
    let (answer, before) = read.split_last().unwrap();
    let progress: Vec<(Value, Value)> = before
        .iter()
        .filter(|v| v["method"] == json!("notifications/progress"))
        .map(|v| {
            (
                v["params"]["progressToken"].clone(),
                v["params"]["progress"].clone(),
            )
        })
        .collect();
    // The client sees its own token, in order, before the answer...
    assert_eq!(
        progress,
        vec![
            (json!("the-clients-token"), json!(1.0)),
            (json!("the-clients-token"), json!(2.0)),
            (json!("the-clients-token"), json!(3.0)),
        ]
    );
    // ...while the server was given another one (rmcp's own).
    let servers_token = &answer["result"]["structuredContent"]["progressToken"];
    assert!(servers_token.is_number(), "{answer}");
    // Nothing follows the answer.
    send(json!({"jsonrpc": "2.0", "id": "after", "method": "ping"})).await;
    let after = read_until(&mut lines, |v| v["id"] == json!("after")).await;
    assert_eq!(after.len(), 1, "{after:?}");
    drop(w);
    drop(lines);
    tokio::time::timeout(WAIT, serving)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    s.shutdown().await;
}
