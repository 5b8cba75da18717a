//! Tasks toward clients (docs/GATEWAY.md, "Tasks"): a stateless (2026-07-28) client that
//! declares the `io.modelcontextprotocol/tasks` extension gets a task instead of a held request
//! when the tool's policy says so (`task`, `task_after`), and follows it with `tasks/get`,
//! answers it with `tasks/update` and stops it with `tasks/cancel`. Driven with raw JSON-RPC
//! over Streamable HTTP, each request its own (so each response stream closes with its answer:
//! a call that outlives the request that made it a task is not cancelled by that close).
#![allow(clippy::expect_used, clippy::unwrap_used, reason = "tests")]

mod support;

use std::time::Duration;

use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use support::{WAIT, answer, poll, serve_http as serve, setup, setup_opts};
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
        poll(
            &format!("task {task_id} never reached {statuses:?}"),
            async || self.get(task_id).await,
            |got| statuses.contains(&got["result"]["status"].as_str().unwrap_or_default()),
        )
        .await
    }
}

/// Whether a result of the test server's `cancels` tool lists the cancel of a `sleep`.
fn saw_sleep_cancelled(result: &Value) -> bool {
    result["structuredContent"]["cancels"]
        .as_array()
        .is_some_and(|a| a.iter().any(|c| c["tool"] == json!("sleep")))
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
    let seen = poll(
        "no progress",
        async || c.get(&id).await,
        |got| {
            got["result"]["statusMessage"]
                .as_str()
                .is_some_and(|m| m.starts_with("step"))
        },
    )
    .await;
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
    poll(
        "no cancel",
        async || {
            // The status tool and `cancels` are quick: with `always` they are tasks too.
            let r = c.call("t__cancels", json!({})).await;
            let id = r["result"]["taskId"].as_str().unwrap().to_owned();
            c.until(&id, &["completed"]).await
        },
        |list| saw_sleep_cancelled(&list["result"]["result"]),
    )
    .await;
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
    poll(
        "never forgotten",
        async || {
            let got = c.get(&id).await;
            if got["error"]["code"] != json!(-32602) {
                assert_eq!(got["result"]["status"], json!("completed"), "{got}");
            }
            got
        },
        |got| got["error"]["code"] == json!(-32602),
    )
    .await;
    shutdown.cancel();
    s.shutdown().await;
}

// --- Handshake clients: the experimental tasks of 2025-11-25 -------------------------------

const HANDSHAKE: &str = "2025-11-25";

/// A handshake client (2025-11-25) over Streamable HTTP, raw.
struct Handshake {
    http: reqwest::Client,
    url: String,
    session: String,
    next: u64,
    /// The `initialize` answer.
    init: Value,
}

impl Handshake {
    /// Initializes, declaring `capabilities`.
    async fn open(url: &str, capabilities: Value) -> Handshake {
        let http = reqwest::Client::new();
        let (session, resp) =
            support::http_initialize(&http, url, HANDSHAKE, capabilities, "handshake-tasks").await;
        let init = answer(resp).await;
        let c = Handshake {
            http,
            url: url.to_owned(),
            session,
            next: 0,
            init,
        };
        let ack = c
            .post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        assert!(ack.status().is_success());
        c
    }

    async fn post(&self, body: &Value) -> reqwest::Response {
        self.http
            .post(&self.url)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", &self.session)
            .header("mcp-protocol-version", HANDSHAKE)
            .json(body)
            .send()
            .await
            .unwrap()
    }

    async fn send(&mut self, method: &str, params: Value) -> Value {
        self.next += 1;
        let resp = self
            .post(&json!({"jsonrpc": "2.0", "id": self.next, "method": method, "params": params}))
            .await;
        if !resp.status().is_success() {
            let status = resp.status();
            return json!({"http": status.as_u16(), "body": resp.text().await.unwrap()});
        }
        answer(resp).await
    }

    /// `tools/call` with `params.task`.
    async fn call_task(&mut self, tool: &str, args: Value) -> Value {
        self.send(
            "tools/call",
            json!({"name": tool, "arguments": args, "task": {"ttl": 60_000}}),
        )
        .await
    }

    async fn get(&mut self, task_id: &str) -> Value {
        self.send("tasks/get", json!({"taskId": task_id})).await
    }
}

/// The task of a 2025-11-25 `CreateTaskResult` answer, after checking its shape.
fn handshake_created(r: &Value) -> String {
    let task = &r["result"]["task"];
    assert_eq!(task["status"], json!("working"), "{r}");
    assert_eq!(task["ttl"], json!(3_600_000), "{r}");
    assert_eq!(task["pollInterval"], json!(1000), "{r}");
    assert!(task["createdAt"].as_str().unwrap().ends_with('Z'), "{r}");
    assert!(r["result"].get("resultType").is_none(), "{r}");
    task["taskId"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_handshake_client_that_declares_tasks_gets_one_and_fetches_its_result() {
    let s = setup(&["t"], true, "[tools.\"t__progress\"]\ntask = \"never\"\n").await;
    let (url, shutdown) = serve(&s.gateway).await;
    let mut c = Handshake::open(&url, json!({"tasks": {"list": {}, "cancel": {}}})).await;
    assert_eq!(c.init["result"]["protocolVersion"], json!(HANDSHAKE));
    assert_eq!(
        c.init["result"]["capabilities"]["tasks"],
        json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}),
        "{}",
        c.init
    );

    // tools/list says which tools may run as a task.
    let tools = c.send("tools/list", json!({})).await;
    let support = |name: &str| {
        tools["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == json!(name))
            .map(|t| t["execution"]["taskSupport"].clone())
    };
    assert_eq!(support("t__sleep"), Some(json!("optional")), "{tools}");
    assert_eq!(support("t__progress"), Some(json!("forbidden")), "{tools}");
    assert_eq!(
        support("toolwarden__status"),
        Some(json!("forbidden")),
        "{tools}"
    );

    // Answered at once with the task; the call runs on.
    let started = tokio::time::Instant::now();
    let r = c.call_task("t__sleep", json!({"ms": 1500})).await;
    assert!(started.elapsed() < Duration::from_millis(1500), "{r}");
    let id = handshake_created(&r);
    let got = c.get(&id).await;
    assert_eq!(got["result"]["taskId"], json!(id), "{got}");
    assert_eq!(got["result"]["status"], json!("working"), "{got}");
    assert_eq!(got["result"]["pollInterval"], json!(1000), "{got}");
    let listed = c.send("tasks/list", json!({})).await;
    assert_eq!(
        listed["result"]["tasks"][0]["taskId"],
        json!(id),
        "{listed}"
    );

    // tasks/result waits for the outcome: the call's CallToolResult, naming its task.
    let r = c.send("tasks/result", json!({"taskId": id})).await;
    assert!(started.elapsed() >= Duration::from_millis(1500), "{r}");
    let result = &r["result"];
    assert_eq!(result["content"][0]["text"], json!("slept 1500 ms"), "{r}");
    assert_eq!(result["isError"], json!(false), "{r}");
    assert_eq!(
        result["_meta"]["toolwarden/outcome"]["status"],
        json!("ok"),
        "{r}"
    );
    assert_eq!(
        result["_meta"]["io.modelcontextprotocol/related-task"],
        json!({"taskId": id}),
        "{r}"
    );
    let got = c.get(&id).await;
    assert_eq!(got["result"]["status"], json!("completed"), "{got}");

    // Without params.task, a call is held as always.
    let r = c
        .send(
            "tools/call",
            json!({"name": "t__echo", "arguments": {"text": "held"}}),
        )
        .await;
    assert_eq!(r["result"]["content"][0]["text"], json!("held"), "{r}");
    // A tool whose policy never makes a task, and the gateway's own tool: -32601.
    let r = c
        .call_task("t__progress", json!({"every_ms": 10, "count": 1}))
        .await;
    assert_eq!(r["error"]["code"], json!(-32601), "{r}");
    let r = c.call_task("toolwarden__status", json!({})).await;
    assert_eq!(r["error"]["code"], json!(-32601), "{r}");
    // An unknown task: -32602.
    let r = c.send("tasks/result", json!({"taskId": "task_nope"})).await;
    assert_eq!(r["error"]["code"], json!(-32602), "{r}");

    // A handshake client that does not declare tasks: nothing changes for it.
    let mut plain = Handshake::open(&url, json!({})).await;
    assert!(
        plain.init["result"]["capabilities"].get("tasks").is_none(),
        "{}",
        plain.init
    );
    let tools = plain.send("tools/list", json!({})).await;
    assert!(
        tools["result"]["tools"][0].get("execution").is_none(),
        "{tools}"
    );
    let r = plain.call_task("t__echo", json!({"text": "no task"})).await;
    assert_eq!(r["result"]["content"][0]["text"], json!("no task"), "{r}");
    let r = plain.get(&id).await;
    assert!(r.get("result").is_none(), "{r}");
    shutdown.cancel();
    s.shutdown().await;
}

#[tokio::test]
async fn tasks_cancel_of_a_handshake_task_stops_its_call_on_the_server() {
    let s = setup(&["t"], true, "").await;
    let (url, shutdown) = serve(&s.gateway).await;
    let mut c = Handshake::open(&url, json!({"tasks": {"cancel": {}}})).await;
    let r = c.call_task("t__sleep", json!({"ms": 30_000})).await;
    let id = handshake_created(&r);
    s.event("the call started", |e| {
        matches!(e.kind, toolwarden_protocol::EventKind::ToolStart { .. })
    })
    .await;
    // A tasks/result waiting on another request ends with the cancel.
    let mut waiter = Handshake {
        http: c.http.clone(),
        url: c.url.clone(),
        session: c.session.clone(),
        next: 100,
        init: Value::Null,
    };
    let waited = id.clone();
    let waiting =
        tokio::spawn(async move { waiter.send("tasks/result", json!({"taskId": waited})).await });
    let ack = c.send("tasks/cancel", json!({"taskId": id})).await;
    assert_eq!(ack["result"]["taskId"], json!(id), "{ack}");
    assert_eq!(ack["result"]["status"], json!("cancelled"), "{ack}");
    let got = c.get(&id).await;
    assert_eq!(got["result"]["status"], json!("cancelled"), "{got}");
    let o = s.outcome_of("t__sleep").await;
    assert_eq!(
        (o["status"].clone(), o["reason"].clone()),
        (json!("cancelled"), json!("user"))
    );
    // What the call answered: its cancelled outcome.
    let r = tokio::time::timeout(WAIT, waiting).await.unwrap().unwrap();
    assert_eq!(r["result"]["isError"], json!(true), "{r}");
    assert_eq!(
        r["result"]["_meta"]["toolwarden/outcome"]["reason"],
        json!("user"),
        "{r}"
    );
    // The server saw the cancel of its sleep.
    poll(
        "no cancel",
        async || {
            c.send("tools/call", json!({"name": "t__cancels", "arguments": {}}))
                .await
        },
        |r| saw_sleep_cancelled(&r["result"]),
    )
    .await;
    // A task that ended cannot be cancelled.
    let r = c.send("tasks/cancel", json!({"taskId": id})).await;
    assert_eq!(r["error"]["code"], json!(-32602), "{r}");
    shutdown.cancel();
    s.shutdown().await;
}

#[tokio::test]
async fn a_handshake_task_ends_with_its_session() {
    let s = setup(&["t"], true, "").await;
    let (url, shutdown) = serve(&s.gateway).await;
    let mut c = Handshake::open(&url, json!({"tasks": {}})).await;
    let r = c.call_task("t__sleep", json!({"ms": 30_000})).await;
    handshake_created(&r);
    s.event("the call started", |e| {
        matches!(e.kind, toolwarden_protocol::EventKind::ToolStart { .. })
    })
    .await;
    let closed = c
        .http
        .delete(&c.url)
        .header("mcp-session-id", &c.session)
        .header("mcp-protocol-version", HANDSHAKE)
        .send()
        .await
        .unwrap();
    assert!(closed.status().is_success(), "{}", closed.status());
    let o = s.outcome_of("t__sleep").await;
    assert_eq!(
        (o["status"].clone(), o["reason"].clone()),
        (json!("cancelled"), json!("client_disconnect"))
    );
    shutdown.cancel();
    s.shutdown().await;
}

/// A handshake client on stdio (an in-memory pipe the gateway serves as stdio), raw.
struct StdioHandshake {
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>>,
    write: tokio::io::WriteHalf<tokio::io::DuplexStream>,
    next: u64,
    /// Answers read while waiting for another.
    early: Vec<Value>,
}

impl StdioHandshake {
    async fn send_raw(&mut self, message: Value) {
        use tokio::io::AsyncWriteExt as _;
        self.write
            .write_all(format!("{message}\n").as_bytes())
            .await
            .unwrap();
    }

    /// Sends a request; its answer (what else comes before it is skipped).
    async fn send(&mut self, method: &str, params: Value) -> Value {
        self.next += 1;
        let id = self.next;
        self.send_raw(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        self.answer(id).await
    }

    async fn answer(&mut self, id: u64) -> Value {
        if let Some(at) = self.early.iter().position(|v| v["id"] == json!(id)) {
            return self.early.remove(at);
        }
        loop {
            let line = tokio::time::timeout(WAIT, self.lines.next_line())
                .await
                .expect("a line in time")
                .unwrap()
                .expect("the gateway is still there");
            let v: Value = serde_json::from_str(&line).unwrap();
            if v.get("method").is_none() {
                if v["id"] == json!(id) {
                    return v;
                }
                self.early.push(v);
            }
        }
    }
}

#[tokio::test]
async fn a_handshake_client_on_stdio_gets_a_task_and_its_result_and_cancels_one() {
    let s = setup(&["t"], true, "").await;
    let open = async |capabilities: Value| {
        // A small pipe: rmcp's lines are written in pieces, and wait for room.
        let support::Pipe {
            lines,
            write,
            serving,
            ..
        } = support::serve_pipe(&s.gateway, 4096);
        let mut c = StdioHandshake {
            lines,
            write,
            next: 0,
            early: Vec::new(),
        };
        let init = c
            .send(
                "initialize",
                json!({"protocolVersion": HANDSHAKE, "capabilities": capabilities,
                       "clientInfo": {"name": "stdio-tasks", "version": "0"}}),
            )
            .await;
        c.send_raw(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        (c, init, serving)
    };

    let (mut c, init, serving) = open(json!({"tasks": {}})).await;
    assert_eq!(
        init["result"]["capabilities"]["tasks"],
        json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}),
        "{init}"
    );
    let tools = c.send("tools/list", json!({})).await;
    let sleep = tools["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == json!("t__sleep"))
        .unwrap()
        .clone();
    assert_eq!(sleep["execution"]["taskSupport"], json!("optional"));
    // A task, at once; its result from tasks/result.
    let r = c
        .send(
            "tools/call",
            json!({"name": "t__sleep", "arguments": {"ms": 300}, "task": {}}),
        )
        .await;
    let id = handshake_created(&r);
    let got = c.send("tasks/get", json!({"taskId": id})).await;
    assert_eq!(got["result"]["status"], json!("working"), "{got}");
    let r = c.send("tasks/result", json!({"taskId": id})).await;
    assert_eq!(
        r["result"]["content"][0]["text"],
        json!("slept 300 ms"),
        "{r}"
    );
    let listed = c.send("tasks/list", json!({})).await;
    assert_eq!(listed["result"]["tasks"][0]["status"], json!("completed"));
    // A call without a task goes to rmcp, as always, while the gateway answers beside it.
    let r = c
        .send(
            "tools/call",
            json!({"name": "t__echo", "arguments": {"text": "held"}}),
        )
        .await;
    assert_eq!(r["result"]["content"][0]["text"], json!("held"), "{r}");
    // A long line of rmcp's (far over the pipe's size) reaches the client whole, while the
    // gateway answers a task request beside it.
    let long = "x".repeat(200_000);
    c.send_raw(json!({"jsonrpc": "2.0", "id": 1000, "method": "tools/call",
        "params": {"name": "t__echo", "arguments": {"text": long}}}))
        .await;
    let listed = c.send("tasks/list", json!({})).await;
    assert_eq!(listed["result"]["tasks"].as_array().unwrap().len(), 1);
    let r = c.answer(1000).await;
    assert_eq!(r["result"]["content"][0]["text"], json!(long));
    // tasks/cancel stops the call.
    let r = c
        .send(
            "tools/call",
            json!({"name": "t__sleep", "arguments": {"ms": 30_000}, "task": {}}),
        )
        .await;
    let id = handshake_created(&r);
    let ack = c.send("tasks/cancel", json!({"taskId": id})).await;
    assert_eq!(ack["result"]["status"], json!("cancelled"), "{ack}");
    let r = c.send("tasks/result", json!({"taskId": id})).await;
    assert_eq!(
        r["result"]["_meta"]["toolwarden/outcome"]["reason"],
        json!("user"),
        "{r}"
    );
    drop(c);
    tokio::time::timeout(WAIT, serving)
        .await
        .unwrap()
        .unwrap()
        .unwrap();

    // A client that does not declare tasks: its initialize offers none, and its calls are
    // held as always.
    let (mut plain, init, serving) = open(json!({})).await;
    assert!(
        init["result"]["capabilities"].get("tasks").is_none(),
        "{init}"
    );
    let r = plain
        .send(
            "tools/call",
            json!({"name": "t__echo", "arguments": {"text": "no task"}, "task": {}}),
        )
        .await;
    assert_eq!(r["result"]["content"][0]["text"], json!("no task"), "{r}");
    drop(plain);
    tokio::time::timeout(WAIT, serving)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    s.shutdown().await;
}
