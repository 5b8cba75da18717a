//! The HTTP turn API (docs/HTTP-API.md) end to end: `toolwarden serve` on an ephemeral port with
//! `tw-test-server` as `[servers.test]`, driven over real HTTP. `serve.rs` covers start-up,
//! health, one call, the CLI clients and shutdown; these cover turns that misbehave, the turn's
//! event stream, aborts and disconnects as seen on `/v1/events`, and metrics.

use std::time::Duration;

use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::serve::{config, serve, turn};
use crate::util::{Dir, Running, Sse, SseEvent, http, marker};

const EVENT_WAIT: Duration = Duration::from_secs(15);

/// `serve` with the test server (and `extra` config), once the server is up.
async fn start(name: &str, extra: &str, args: &[&str]) -> (Dir, Running, String, String) {
    let dir = Dir::new();
    let mark = marker(name);
    dir.create("toolwarden.toml", &config(&mark, extra));
    let (server, url) = serve(&dir, args).await;
    server
        .wait_stderr("server \"test\" is up", Duration::from_secs(30))
        .await;
    (dir, server, url, mark)
}

/// SIGTERM, exit 0, nothing of the test left running.
async fn stop(server: Running, mark: &str) {
    crate::util::stop_clean(server, mark).await;
}

/// `GET /v1/events`, subscribed before it returns.
async fn events(url: &str) -> Sse {
    let resp = http().get(format!("{url}/v1/events")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    Sse::new(resp)
}

fn is(event: &SseEvent, kind: &str, call_id: &str) -> bool {
    event.event == kind && event.data["call_id"] == call_id
}

/// A long call of `test__progress` (a report every 50 ms, `count` of them) with a unique
/// `count`, to find it among the server's cancels. Its first `tool_progress` event (paced: at
/// least 250 ms after the start) proves the server is running it — `tool_start` alone does
/// not: it comes before the request is sent, and a call cancelled before that never reaches
/// the server, so nothing is cancelled there.
fn long_call(count: u64) -> Value {
    json!({"every_ms": 50, "count": count})
}

fn unique_count() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    100_000 + u64::from(std::process::id() % 100_000) * 10 + n % 10
}

/// The cancels `tw-test-server` received for the [`long_call`] with `count`.
async fn server_cancels(url: &str, count: u64) -> Vec<Value> {
    let mut found = Vec::new();
    for _ in 0..250 {
        let answer = turn(
            url,
            json!([{"id": "cancels", "name": "test__cancels", "input": {}}]),
        )
        .await;
        assert_eq!(
            answer["results"][0]["toolwarden"]["status"], "ok",
            "{answer:#}"
        );
        let text = answer["results"][0]["content"][0]["text"].as_str().unwrap();
        let list: Vec<Value> = serde_json::from_str(text).unwrap();
        found = list
            .into_iter()
            .filter(|c| c["arguments"] == long_call(count))
            .collect();
        if !found.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    found
}

/// Replaces what differs between two runs of the same turn: ids, times, durations, and the
/// digest (of the whole output, whose structured part names the per-request progress token).
fn normalized(mut results: Value) -> Value {
    for result in results.as_array_mut().unwrap() {
        let outcome = &mut result["toolwarden"];
        outcome["turn_id"] = json!("T");
        outcome["duration_ms"] = json!(0);
        if outcome.get("provenance").is_some() {
            outcome["provenance"]["fetched_at"] = json!("AT");
            outcome["provenance"]["digest"] = json!("D");
        }
    }
    results
}

/// An echo, a call that hangs (500 ms deadline), and a call that reports progress for 400 ms
/// (tool_progress events are paced: at most one per 250 ms, the first 250 ms after the start).
fn anthropic_turn() -> Value {
    json!([
        {"type": "tool_use", "id": "c1", "name": "test__echo", "input": {"text": "one"}},
        {"type": "tool_use", "id": "c2", "name": "test__hang", "input": {}, "timeout_ms": 500},
        {"type": "tool_use", "id": "c3", "name": "test__progress", "input": {"every_ms": 100, "count": 4}}
    ])
}

#[tokio::test]
async fn a_turn_whose_middle_call_hangs_answers_two_results_and_a_timeout_in_order() {
    let (_dir, server, url, mark) = start("api-order", "", &[]).await;

    // Anthropic tool_use blocks in, tool_result blocks out.
    let started = tokio::time::Instant::now();
    let answer = turn(&url, anthropic_turn()).await;
    assert!(started.elapsed() < Duration::from_secs(5), "{answer:#}");
    let results = answer["results"].as_array().unwrap();
    assert_eq!(results.len(), 3, "{answer:#}");
    let ids: Vec<_> = results.iter().map(|r| r["tool_use_id"].clone()).collect();
    assert_eq!(ids, [json!("c1"), json!("c2"), json!("c3")]);
    assert!(results.iter().all(|r| r["type"] == "tool_result"));
    let errors: Vec<_> = results.iter().map(|r| r["is_error"].clone()).collect();
    assert_eq!(errors, [json!(false), json!(true), json!(false)]);
    assert_eq!(
        results[0]["content"],
        json!([{"type": "text", "text": "one"}])
    );
    let timeout = &results[1]["toolwarden"];
    assert_eq!(
        (&timeout["status"], &timeout["kind"], &timeout["after_ms"]),
        (&json!("timeout"), &json!("total"), &json!(500)),
        "{timeout:#}"
    );
    let text = results[1]["content"][0]["text"].as_str().unwrap();
    assert!(
        text.starts_with("[TIMEOUT] Tool \"test__hang\" exceeded its wall-clock limit of 500ms"),
        "{text}"
    );
    assert_eq!(
        results[2]["content"],
        json!([{"type": "text", "text": "done after 4 steps"}])
    );
    assert_eq!(results[2]["toolwarden"]["status"], "ok");
    let turn_id = answer["turn_id"].as_str().unwrap();
    assert!(
        results
            .iter()
            .all(|r| r["toolwarden"]["turn_id"] == turn_id)
    );

    // OpenAI tool calls in, tool messages out.
    let answer = turn(
        &url,
        json!([
            {"id": "call_1", "type": "function", "function": {"name": "test__echo", "arguments": "{\"text\":\"one\"}"}},
            {"id": "call_2", "type": "function", "function": {"name": "test__hang", "arguments": "{}"}, "timeout_ms": 500},
            {"id": "call_3", "type": "function", "function": {"name": "test__progress", "arguments": "{\"every_ms\":50,\"count\":3}"}}
        ]),
    )
    .await;
    let results = answer["results"].as_array().unwrap();
    assert_eq!(results.len(), 3, "{answer:#}");
    assert!(results.iter().all(|r| r["role"] == "tool"));
    let ids: Vec<_> = results.iter().map(|r| r["tool_call_id"].clone()).collect();
    assert_eq!(ids, [json!("call_1"), json!("call_2"), json!("call_3")]);
    assert_eq!(results[0]["content"], "one");
    assert!(
        results[1]["content"]
            .as_str()
            .unwrap()
            .starts_with("[TIMEOUT]"),
        "{answer:#}"
    );
    assert_eq!(results[1]["toolwarden"]["status"], "timeout");
    assert_eq!(results[1]["toolwarden"]["after_ms"], 500);
    assert_eq!(results[2]["content"], "done after 3 steps");
    let statuses: Vec<_> = results
        .iter()
        .map(|r| r["toolwarden"]["status"].clone())
        .collect();
    assert_eq!(statuses, [json!("ok"), json!("timeout"), json!("ok")]);

    stop(server, &mark).await;
}

#[tokio::test]
async fn the_turns_event_stream_comes_in_order_and_ends_with_the_json_answers_results() {
    let (_dir, server, url, mark) = start("api-sse", "", &[]).await;
    let json_answer = turn(&url, anthropic_turn()).await;

    let resp = http()
        .post(format!("{url}/v1/turns"))
        .header("accept", "text/event-stream")
        .json(&json!({"session_id": "sse-1", "calls": anthropic_turn()}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut stream = Sse::new(resp);
    let mut seen = Vec::new();
    while let Some(event) = stream.next(EVENT_WAIT).await {
        seen.push(event);
    }
    let kinds: Vec<&str> = seen.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(kinds.first(), Some(&"turn_start"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"turn_end"), "{kinds:?}");
    assert_eq!(kinds.iter().filter(|k| **k == "turn_end").count(), 1);
    let turn_id = seen[0].data["turn_id"].clone();
    let mut last_seq = 0;
    for event in &seen {
        // Framing: `event:` is the type, `id:` the seq, which only grows.
        assert_eq!(event.data["type"], event.event.as_str());
        assert_eq!(event.id, event.data["seq"].as_u64(), "{:?}", event);
        let seq = event.id.unwrap();
        assert!(seq > last_seq, "seq {seq} after {last_seq}");
        last_seq = seq;
        assert_eq!(event.data["turn_id"], turn_id, "{:?}", event);
        assert_eq!(event.data["session_id"], "sse-1");
    }
    let position = |kind: &str, call: &str| {
        seen.iter()
            .position(|e| is(e, kind, call))
            .unwrap_or_else(|| panic!("no {kind} for {call}: {kinds:?}"))
    };
    for call in ["c1", "c2", "c3"] {
        assert!(position("tool_start", call) < position("tool_result", call));
    }
    // The hung call timed out before its result; the progress call reported progress.
    assert!(position("tool_start", "c2") < position("tool_timeout", "c2"));
    assert!(position("tool_timeout", "c2") < position("tool_result", "c2"));
    let progress: Vec<f64> = seen
        .iter()
        .filter(|e| is(e, "tool_progress", "c3"))
        .filter_map(|e| e.data["progress"].as_f64())
        .collect();
    assert!(!progress.is_empty(), "{kinds:?}");
    assert!(progress.windows(2).all(|w| w[0] < w[1]), "{progress:?}");
    assert!(position("tool_progress", "c3") < position("tool_result", "c3"));

    // turn_end carries the results the JSON answer has (same renderer), and each call's
    // tool_result carried its outcome.
    let end = seen.last().unwrap();
    assert_eq!(end.data["outcome"], "partial");
    let results = end.data["results"].clone();
    for (i, call) in ["c1", "c2", "c3"].iter().enumerate() {
        let result_event = &seen[position("tool_result", call)];
        assert_eq!(result_event.data["outcome"], results[i]["toolwarden"]);
    }
    assert_eq!(
        normalized(results),
        normalized(json_answer["results"].clone())
    );

    stop(server, &mark).await;
}

#[tokio::test]
async fn an_abort_through_the_api_ends_the_running_call_as_the_users_and_reaches_the_server() {
    let (_dir, server, url, mark) = start("api-abort", "", &[]).await;
    let mut events = events(&url).await;
    let count = unique_count();
    let pending = tokio::spawn({
        let url = url.clone();
        async move {
            turn(
                &url,
                json!([
                    {"id": "quick", "name": "test__echo", "input": {"text": "done"}},
                    {"id": "slow", "name": "test__progress", "input": long_call(count)}
                ]),
            )
            .await
        }
    });
    let seen = events
        .collect(EVENT_WAIT, |seen| {
            seen.iter().any(|e| is(e, "tool_progress", "slow"))
                && seen.iter().any(|e| is(e, "tool_result", "quick"))
        })
        .await;
    let running = seen
        .iter()
        .find(|e| is(e, "tool_progress", "slow"))
        .unwrap();
    let turn_id = running.data["turn_id"].as_str().unwrap().to_owned();

    let resp = http()
        .post(format!("{url}/v1/turns/{turn_id}/abort"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.json::<Value>().await.unwrap(),
        json!({"ok": true, "turn_id": turn_id})
    );

    // The outcome at once, then (after cancel_grace) how the work stopped: the server
    // honoured the cancel.
    let seen = events
        .collect(EVENT_WAIT, |seen| {
            seen.iter().any(|e| is(e, "tool_stopped", "slow"))
        })
        .await;
    let find = |kind: &str| {
        seen.iter()
            .position(|e| e.event == kind && e.data["turn_id"] == turn_id.as_str())
            .unwrap_or_else(|| panic!("no {kind}: {seen:#?}"))
    };
    let (abort, result, stopped) = (
        find("turn_abort"),
        find("tool_result"),
        find("tool_stopped"),
    );
    assert_eq!(seen[abort].data["reason"], "user");
    assert_eq!(seen[result].data["call_id"], "slow");
    assert_eq!(seen[result].data["outcome"]["status"], "cancelled");
    assert_eq!(seen[result].data["outcome"]["reason"], "user");
    assert_eq!(seen[stopped].data["how"], "cooperative", "{seen:#?}");
    assert!(result < stopped);
    let answer = pending.await.unwrap();
    assert_eq!(answer["results"][0]["toolwarden"]["status"], "ok");
    assert_eq!(answer["results"][1]["toolwarden"]["status"], "cancelled");
    assert_eq!(answer["results"][1]["toolwarden"]["reason"], "user");

    // The server was told, for that request, with the reason.
    let cancels = server_cancels(&url, count).await;
    assert_eq!(cancels.len(), 1, "{cancels:?}");
    assert_eq!(cancels[0]["tool"], "progress");
    assert_eq!(cancels[0]["reason"], "user");
    // An ended turn is not abortable.
    let again = http()
        .post(format!("{url}/v1/turns/{turn_id}/abort"))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 404);

    stop(server, &mark).await;
}

#[tokio::test]
async fn a_client_that_closes_its_connection_mid_turn_cancels_the_call_as_a_disconnect() {
    let (_dir, server, url, mark) = start("api-disconnect", "", &[]).await;
    let mut events = events(&url).await;

    // A JSON request whose client goes away: the request (and its connection) is dropped.
    let count = unique_count();
    let request = tokio::spawn({
        let url = url.clone();
        async move {
            http()
                .post(format!("{url}/v1/turns"))
                .json(&json!({"calls": [{"id": "gone-json", "name": "test__progress", "input": long_call(count)}]}))
                .send()
                .await
        }
    });
    events
        .until(EVENT_WAIT, |e| is(e, "tool_progress", "gone-json"))
        .await;
    request.abort();
    disconnected(&mut events, "gone-json").await;
    let cancels = server_cancels(&url, count).await;
    assert_eq!(cancels.len(), 1, "{cancels:?}");
    assert_eq!(cancels[0]["reason"], "client_disconnect");

    // An event-stream request whose client stops reading and closes the stream.
    let count = unique_count();
    let resp = http()
        .post(format!("{url}/v1/turns"))
        .header("accept", "text/event-stream")
        .json(&json!({"calls": [{"id": "gone-sse", "name": "test__progress", "input": long_call(count)}]}))
        .send()
        .await
        .unwrap();
    let mut stream = Sse::new(resp);
    stream
        .until(EVENT_WAIT, |e| is(e, "tool_progress", "gone-sse"))
        .await;
    drop(stream);
    disconnected(&mut events, "gone-sse").await;
    let cancels = server_cancels(&url, count).await;
    assert_eq!(cancels.len(), 1, "{cancels:?}");
    assert_eq!(cancels[0]["reason"], "client_disconnect");

    stop(server, &mark).await;
}

/// Reads `/v1/events` until call `call_id` ended and its turn was aborted; asserts both say
/// `client_disconnect`.
async fn disconnected(events: &mut Sse, call_id: &str) {
    let seen = events
        .collect(EVENT_WAIT, |seen| {
            let result = seen.iter().find(|e| is(e, "tool_result", call_id));
            result.is_some_and(|r| {
                seen.iter()
                    .any(|e| e.event == "turn_abort" && e.data["turn_id"] == r.data["turn_id"])
            })
        })
        .await;
    let result = seen.iter().find(|e| is(e, "tool_result", call_id)).unwrap();
    assert_eq!(result.data["outcome"]["status"], "cancelled");
    assert_eq!(result.data["outcome"]["reason"], "client_disconnect");
    let abort = seen
        .iter()
        .find(|e| e.event == "turn_abort" && e.data["turn_id"] == result.data["turn_id"])
        .unwrap();
    assert_eq!(abort.data["reason"], "client_disconnect");
}

/// Every metric family of docs/GOVERNANCE.md ("Metrics"). Families appear once they have a sample
/// (docs/HTTP-API.md), so the turns exercise each: an ok call, a cache hit, a timeout whose server
/// keeps working (abandoned), a destructive call denied because nothing can confirm it (an
/// interaction), the server's state.
#[tokio::test]
async fn metrics_name_every_spec_metric_after_turns_and_healthz_answers() {
    let (_dir, server, url, mark) = start(
        "api-metrics",
        "[tools.\"test__echo\"]\ncache_ttl = \"1m\"\n[tools.\"test__hang\"]\ncancel_grace = \"200ms\"\n",
        &["--headless"],
    )
    .await;
    let mut events = events(&url).await;
    let answer = turn(
        &url,
        json!([
            {"id": "m1", "name": "test__echo", "input": {"text": "cached"}},
            {"id": "m2", "name": "test__hang", "input": {"progress_every_ms": 50}, "timeout_ms": 300},
            {"id": "m3", "name": "test__wipe", "input": {}}
        ]),
    )
    .await;
    let statuses: Vec<_> = answer["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["toolwarden"]["status"].clone())
        .collect();
    assert_eq!(statuses, [json!("ok"), json!("timeout"), json!("denied")]);
    let again = turn(
        &url,
        json!([{"id": "m4", "name": "test__echo", "input": {"text": "cached"}}]),
    )
    .await;
    assert_eq!(
        again["results"][0]["toolwarden"]["provenance"]["cache_hit"],
        true
    );
    let stopped = events
        .until(EVENT_WAIT, |e| is(e, "tool_stopped", "m2"))
        .await;
    assert_eq!(stopped.data["how"], "abandoned");

    let resp = http().get(format!("{url}/metrics")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    for name in [
        "toolwarden_tool_calls_total",
        "toolwarden_tool_call_duration_seconds",
        "toolwarden_tool_errors_total",
        "toolwarden_tool_cache_hits_total",
        "toolwarden_tool_calls_in_flight",
        "toolwarden_abandoned_calls",
        "toolwarden_breaker_state",
        "toolwarden_interactions_total",
        "toolwarden_turns_total",
        "toolwarden_server_up",
    ] {
        assert!(
            text.lines()
                .any(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name}_"))),
            "no sample of {name} in /metrics:\n{text}"
        );
    }
    for sample in [
        "toolwarden_tool_calls_total{tool=\"test__hang\",outcome=\"timeout\"} 1",
        "toolwarden_tool_errors_total{tool=\"test__hang\",reason=\"timeout_total\"} 1",
        "toolwarden_tool_cache_hits_total{tool=\"test__echo\"} 1",
        "toolwarden_abandoned_calls{server=\"test\"} 1",
        "toolwarden_breaker_state{tool=\"test__hang\"} 0",
        "toolwarden_interactions_total{kind=\"confirm\",outcome=\"no_interactor\"} 1",
        "toolwarden_turns_total{outcome=\"partial\"} 1",
        "toolwarden_turns_total{outcome=\"completed\"} 1",
        "toolwarden_server_up{server=\"test\"} 1",
    ] {
        assert!(
            text.lines().any(|l| l == sample),
            "no {sample:?} in:\n{text}"
        );
    }

    let health = http().get(format!("{url}/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let health: Value = health.json().await.unwrap();
    assert_eq!(health["status"], "ok", "{health:#}");
    assert_eq!(health["servers"]["test"]["state"], "up", "{health:#}");

    stop(server, &mark).await;
}
