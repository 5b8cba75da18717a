//! Tasks toward clients (docs/GATEWAY.md, "Tasks"): a stateless (2026-07-28) client that
//! declares the `io.modelcontextprotocol/tasks` extension gets a task instead of a held request
//! when the tool's policy says so (`task`, `task_after`), and follows it with `tasks/get`,
//! answers it with `tasks/update` and stops it with `tasks/cancel`. Driven with raw JSON-RPC
//! over Streamable HTTP, each request its own (so each response stream closes with its answer:
//! a call that outlives the request that made it a task is not cancelled by that close).
#![allow(clippy::expect_used, clippy::unwrap_used, reason = "tests")]

mod support;

use std::time::Duration;

use futures::StreamExt as _;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use support::{WAIT, serve_http as serve, setup, setup_opts};
use toolwarden_mcp::GatewayOptions;

const V: &str = "2026-07-28";

/// A stateless client; `tasks` says whether it declares the tasks extension.
struct Client {
    http: reqwest::Client,
    url: String,
    tasks: bool,
    next: u64,
}

impl Client {
    fn new(url: &str, tasks: bool) -> Client {
        Client {
            http: reqwest::Client::new(),
            url: url.to_owned(),
            tasks,
            next: 0,
        }
    }

    /// Sends one request; its answer (after whatever came before it on the stream).
    async fn send(&mut self, method: &str, mut params: Value) -> Value {
        self.next += 1;
        let mut capabilities = json!({"elicitation": {"form": {}}});
        if self.tasks {
            capabilities["extensions"] = json!({"io.modelcontextprotocol/tasks": {}});
        }
        params["_meta"] = json!({
            "io.modelcontextprotocol/protocolVersion": V,
            "io.modelcontextprotocol/clientCapabilities": capabilities,
            "io.modelcontextprotocol/clientInfo": {"name": "tasks-test", "version": "0"},
        });
        let body = json!({"jsonrpc": "2.0", "id": self.next, "method": method, "params": params});
        let mut req = self
            .http
            .post(&self.url)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", V)
            .header("mcp-method", method);
        // The revision names the tool, or the task, in `Mcp-Name`.
        let params = &body["params"];
        if let Some(name) = params["name"].as_str().or(params["taskId"].as_str()) {
            req = req.header("mcp-name", name);
        }
        let resp = req.json(&body).send().await.unwrap();
        if !resp.status().is_success() {
            let status = resp.status();
            return json!({"http": status.as_u16(), "body": resp.text().await.unwrap()});
        }
        answer(resp).await
    }

    async fn call(&mut self, tool: &str, args: Value) -> Value {
        self.send("tools/call", json!({"name": tool, "arguments": args}))
            .await
    }

    async fn get(&mut self, task_id: &str) -> Value {
        self.send("tasks/get", json!({"taskId": task_id})).await
    }

    /// Polls the task until its status is one of `statuses`; its last `tasks/get` answer.
    async fn until(&mut self, task_id: &str, statuses: &[&str]) -> Value {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let got = self.get(task_id).await;
            let status = got["result"]["status"].as_str().unwrap_or_default();
            if statuses.contains(&status) {
                return got;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "task {task_id} never reached {statuses:?}: {got}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The JSON-RPC answer of a JSON or event-stream response.
async fn answer(resp: reqwest::Response) -> Value {
    let json = resp
        .headers()
        .get("content-type")
        .is_some_and(|v| v.to_str().unwrap().starts_with("application/json"));
    if json {
        return resp.json().await.unwrap();
    }
    let mut body = resp.bytes_stream();
    let mut buf = String::new();
    let read = async {
        while let Some(chunk) = body.next().await {
            buf.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
            while let Some(end) = buf.find("\n\n") {
                let event: String = buf.drain(..end + 2).collect();
                for line in event.lines() {
                    if let Some(data) = line.strip_prefix("data:")
                        && let Ok(v) = serde_json::from_str::<Value>(data.trim())
                        && v.get("id").is_some()
                        && v.get("method").is_none()
                    {
                        return v;
                    }
                }
            }
        }
        panic!("no answer in the response");
    };
    tokio::time::timeout(WAIT, read)
        .await
        .expect("an answer in time")
}

/// The task id of a `CreateTaskResult` answer, after checking its shape.
fn created(r: &Value) -> String {
    let result = &r["result"];
    assert_eq!(result["resultType"], json!("task"), "{r}");
    assert_eq!(result["ttlMs"], json!(3_600_000), "{r}");
    assert_eq!(result["pollIntervalMs"], json!(1000), "{r}");
    assert!(result["createdAt"].as_str().unwrap().ends_with('Z'), "{r}");
    result["taskId"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_long_call_becomes_a_task_after_task_after_and_its_result_is_fetched() {
    let s = setup(
        &["t"],
        true,
        "[tools.\"t__sleep\"]\ntask_after = \"300ms\"\n\n\
         [tools.\"t__echo\"]\ntask = \"always\"\n\n\
         [tools.\"t__progress\"]\ntask = \"never\"\n",
    )
    .await;
    let (url, shutdown) = serve(&s.gateway).await;
    let mut c = Client::new(&url, true);

    // A quick call is answered as usual: it ended before task_after.
    let r = c.call("t__sleep", json!({"ms": 10})).await;
    assert_eq!(
        r["result"]["content"][0]["text"],
        json!("slept 10 ms"),
        "{r}"
    );

    // A longer one is answered with a task once it has run task_after; it runs on after its
    // request's stream has closed, and its result is fetched with tasks/get.
    let started = tokio::time::Instant::now();
    let r = c.call("t__sleep", json!({"ms": 3000})).await;
    let waited = started.elapsed();
    // Not before task_after; that it came before the call's end shows in the answer itself
    // (a task, still working).
    assert!(
        waited >= Duration::from_millis(300),
        "answered after {waited:?}"
    );
    let id = created(&r);
    assert_eq!(r["result"]["status"], json!("working"), "{r}");
    let got = c.get(&id).await;
    assert_eq!(got["result"]["status"], json!("working"), "{got}");
    assert_eq!(got["result"]["resultType"], json!("complete"), "{got}");
    let done = c.until(&id, &["completed"]).await;
    let result = &done["result"]["result"];
    assert_eq!(
        result["content"][0]["text"],
        json!("slept 3000 ms"),
        "{done}"
    );
    assert_eq!(result["isError"], json!(false), "{done}");
    assert_eq!(
        result["_meta"]["toolwarden/outcome"]["status"],
        json!("ok"),
        "{done}"
    );

    // `always`: a task at once, even for a quick tool.
    let r = c.call("t__echo", json!({"text": "at once"})).await;
    let id = created(&r);
    let done = c.until(&id, &["completed"]).await;
    assert_eq!(
        done["result"]["result"]["content"][0]["text"],
        json!("at once")
    );

    // `never`: the request is held until the result.
    let r = c
        .call("t__progress", json!({"every_ms": 200, "count": 2}))
        .await;
    assert_eq!(
        r["result"]["content"][0]["text"],
        json!("done after 2 steps")
    );

    // A client that did not declare tasks never gets one.
    let mut plain = Client::new(&url, false);
    let r = plain.call("t__echo", json!({"text": "held"})).await;
    assert_eq!(r["result"]["content"][0]["text"], json!("held"), "{r}");
    let r = plain.get(&id).await;
    let refused: Value = serde_json::from_str(r["body"].as_str().unwrap()).unwrap();
    assert_eq!(
        refused["error"]["code"],
        json!(-32021),
        "tasks/get needs the capability: {r}"
    );

    // An unknown task is an error.
    let r = c.get("task_nope").await;
    assert_eq!(r["error"]["code"], json!(-32602), "{r}");
    shutdown.cancel();
    s.shutdown().await;
}

#[tokio::test]
async fn a_task_reports_progress_and_tasks_cancel_stops_its_call_on_the_server() {
    let s = setup(&["t"], true, "[defaults]\ntask = \"always\"\n").await;
    let (url, shutdown) = serve(&s.gateway).await;
    let mut c = Client::new(&url, true);

    // The call's progress, while it runs: the status message and `_meta`.
    let r = c
        .call("t__progress", json!({"every_ms": 150, "count": 4}))
        .await;
    let id = created(&r);
    let deadline = tokio::time::Instant::now() + WAIT;
    let seen = loop {
        let got = c.get(&id).await;
        if got["result"]["statusMessage"]
            .as_str()
            .is_some_and(|m| m.starts_with("step"))
        {
            break got;
        }
        assert!(tokio::time::Instant::now() < deadline, "no progress: {got}");
        tokio::time::sleep(Duration::from_millis(30)).await;
    };
    let progress = &seen["result"]["_meta"]["toolwarden/progress"];
    assert_eq!(progress["total"], json!(4.0), "{seen}");
    let done = c.until(&id, &["completed"]).await;
    assert_eq!(
        done["result"]["result"]["content"][0]["text"],
        json!("done after 4 steps")
    );

    // tasks/cancel: the call ends cancelled{user}, and the server saw the cancel.
    let r = c.call("t__sleep", json!({"ms": 30000})).await;
    let id = created(&r);
    c.until(&id, &["working"]).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let ack = c.send("tasks/cancel", json!({"taskId": id})).await;
    assert_eq!(ack["result"], json!({"resultType": "complete"}), "{ack}");
    let got = c.until(&id, &["cancelled"]).await;
    assert!(got["result"].get("result").is_none(), "{got}");
    assert_eq!(s.outcome_of("t__sleep").await["status"], json!("cancelled"));
    assert_eq!(s.outcome_of("t__sleep").await["reason"], json!("user"));
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        // The status tool and `cancels` are quick: with `always` they are tasks too.
        let r = c.call("t__cancels", json!({})).await;
        let id = r["result"]["taskId"].as_str().unwrap().to_owned();
        let list = c.until(&id, &["completed"]).await;
        let cancels = &list["result"]["result"]["structuredContent"]["cancels"];
        if cancels
            .as_array()
            .is_some_and(|a| a.iter().any(|c| c["tool"] == json!("sleep")))
        {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no cancel: {list}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A task that ended cannot be cancelled.
    let r = c.send("tasks/cancel", json!({"taskId": id})).await;
    assert_eq!(r["error"]["code"], json!(-32602), "{r}");
    shutdown.cancel();
    s.shutdown().await;
}

#[tokio::test]
async fn tasks_update_answers_the_approval_a_task_asks() {
    let s = setup(&["t"], true, "[tools.guarded]\ntask = \"always\"\n").await;
    let (url, shutdown) = serve(&s.gateway).await;
    let mut c = Client::new(&url, true);
    let r = c.call("guarded", json!({"what": "deploy"})).await;
    let id = created(&r);
    let asking = c.until(&id, &["input_required"]).await;
    let requests = asking["result"]["inputRequests"].as_object().unwrap();
    assert_eq!(requests.len(), 1, "{asking}");
    let (key, asked) = requests.iter().next().unwrap();
    assert_eq!(asked["method"], json!("elicitation/create"), "{asking}");
    let ack = c
        .send(
            "tasks/update",
            json!({"taskId": id, "inputResponses":
                {key.clone(): {"action": "accept", "content": {"approve": true}}}}),
        )
        .await;
    assert_eq!(ack["result"], json!({"resultType": "complete"}), "{ack}");
    let done = c.until(&id, &["completed"]).await;
    assert_eq!(
        done["result"]["result"]["content"][0]["text"],
        json!("done"),
        "{done}"
    );
    shutdown.cancel();
    s.shutdown().await;
}

#[tokio::test]
async fn a_tasks_outcome_is_kept_for_its_ttl_then_forgotten() {
    let s = setup_opts(
        &[("t", &[][..])],
        "[defaults]\ntask = \"always\"\n",
        GatewayOptions {
            task_ttl: Duration::from_millis(300),
            task_poll_interval: Duration::from_millis(50),
            // The sweeper runs every quarter of this (at least every 100 ms).
            http_session_idle: Duration::from_millis(400),
            ..Default::default()
        },
    )
    .await;
    let (url, shutdown) = serve(&s.gateway).await;
    let mut c = Client::new(&url, true);
    let r = c.call("t__echo", json!({"text": "kept"})).await;
    assert_eq!(r["result"]["ttlMs"], json!(300), "{r}");
    assert_eq!(r["result"]["pollIntervalMs"], json!(50), "{r}");
    let id = r["result"]["taskId"].as_str().unwrap().to_owned();
    c.until(&id, &["completed"]).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let got = c.get(&id).await;
        if got["error"]["code"] == json!(-32602) {
            break;
        }
        assert_eq!(got["result"]["status"], json!("completed"), "{got}");
        assert!(tokio::time::Instant::now() < deadline, "never forgotten");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    s.shutdown().await;
}
