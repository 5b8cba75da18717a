//! What every engine test shares: an engine configured from TOML, a set of test tools whose
//! behaviour is chosen by their input, a log of when each tool started and ended (in paused
//! tokio time), and helpers to read events and outcomes as JSON that can be compared whole.
//!
//! Test tools (in-process unless named `srv__…`):
//!
//! | tool | input | does |
//! |---|---|---|
//! | `sleep` | `{ms}` | sleeps `ms`, stops at once when cancelled; answers `slept {ms}ms` |
//! | `stubborn` | `{ms?}` | ignores cancels; sleeps `ms` (forever without it) |
//! | `blocking` | `{}` | a blocking tool that ignores cancels until [`Harness::release_blocking`] |
//! | `ticker` | `{every_ms, ms, beat?}` | reports progress (or, with `beat`, only heartbeats) every `every_ms` for `ms` |
//! | `echo` | `{q: string}` | answers its input as structured content |
//! | `fail` | `{}` | fails with its own error (`disk full`) |
//! | `srv__flaky` | `{fail?, error?, hang?, ms?}` | on server `srv`: its first `fail` runs with this input fail with `error` (`transport` or `crashed`); attempts up to `hang` never answer (but stop when asked); each run takes `ms` |
//! | `srv__late` | `{ms}` | on server `srv`: ignores every stop request and answers after `ms` |
//! | `srv__quiet` | `{}` | on server `srv`: never answers; a cancel makes it go quiet, which the backend can only tell once the stop is forced (as an MCP server honouring a cancel) |
//!
//! More sleep-like tools can be added under other names with [`Harness::add_sleep`], so that
//! their policy can differ (`[tools.write] concurrency = "exclusive"`).
// Test helpers: a failed unwrap is a failed test.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::time::Instant;
use toolwarden_core::protocol::{
    CallResult, Event, EventKind, SessionId, ToolAnnotations, ToolCall, ToolSpec, TurnId,
};
use toolwarden_core::{
    Attempt, AttemptEnd, AttemptError, Backend, BoxFuture, Config, Engine, InProcessTool, Received,
    Subscription, ToolContext, ToolError, ToolOutput, TurnRequest,
};

use pretty_assertions::assert_eq;

/// The session tests run in unless they say otherwise.
pub const SESSION: &str = "s1";

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// A call with id `id` to `tool`.
pub fn call(id: &str, tool: &str, input: Value) -> ToolCall {
    ToolCall::new(id, tool, input)
}

/// What the test tools did, in paused time since the harness was built.
pub struct Log {
    t0: Instant,
    lines: Mutex<Vec<(u64, u8, String)>>,
    runs: Mutex<BTreeMap<String, u32>>,
}

/// Logs `"{call} end"` when dropped: when the tool returns, or when its future is dropped.
pub struct Running {
    log: Arc<Log>,
    call: String,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.log.line(1, format!("{} end", self.call));
    }
}

impl Log {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            t0: Instant::now(),
            lines: Mutex::new(Vec::new()),
            runs: Mutex::new(BTreeMap::new()),
        })
    }

    fn line(&self, order: u8, text: String) {
        let at = self.t0.elapsed().as_millis() as u64;
        self.lines.lock().push((at, order, text));
    }

    /// A tool started running `call`; it ends when the guard is dropped.
    pub fn started(self: &Arc<Self>, tool: &str, call: &str) -> Running {
        *self.runs.lock().entry(tool.to_owned()).or_insert(0) += 1;
        self.line(2, format!("{call} start"));
        Running {
            log: self.clone(),
            call: call.to_owned(),
        }
    }

    /// How many times `tool` was run (attempts included).
    pub fn runs(&self, tool: &str) -> u32 {
        self.runs.lock().get(tool).copied().unwrap_or(0)
    }

    /// `(ms, "c1 start")` lines in time order; at one instant, ends before starts, then by name.
    pub fn timeline(&self) -> Vec<(u64, String)> {
        let mut lines = self.lines.lock().clone();
        lines.sort();
        lines.into_iter().map(|(at, _, text)| (at, text)).collect()
    }
}

/// A latch a blocking tool waits on, and the signal that it started waiting.
#[derive(Default)]
struct Latch {
    open: std::sync::Mutex<bool>,
    cv: std::sync::Condvar,
    waiting: tokio::sync::Notify,
}

impl Latch {
    fn wait(&self) {
        self.waiting.notify_one();
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.cv.wait(open).unwrap();
        }
    }

    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.cv.notify_all();
    }
}

/// An engine with the test tools, its event stream, and the tools' log.
pub struct Harness {
    pub engine: Engine,
    pub events: Subscription,
    pub log: Arc<Log>,
    latch: Arc<Latch>,
    turns: u32,
    /// For tests that number their calls across turns.
    pub calls: u32,
}

/// The config every harness starts from: the scripted server `srv`.
const BASE_CONFIG: &str = r#"
[servers.srv]
command = "scripted-test-server"
"#;

impl Harness {
    /// An engine whose policies come from `config` (TOML, as in `toolwarden.toml`), with jitter
    /// seeded, the test tools registered and the server `srv` up.
    pub fn new(config: &str) -> Self {
        Self::with(config, |b| b)
    }

    /// Like [`Harness::new`], with more engine settings.
    pub fn with(
        config: &str,
        settings: impl FnOnce(toolwarden_core::EngineBuilder) -> toolwarden_core::EngineBuilder,
    ) -> Self {
        let src = format!("{BASE_CONFIG}\n{config}");
        let config = Config::parse(&src, "test.toml", &|_| None)
            .unwrap_or_else(|e| panic!("test config: {e}"));
        let engine = settings(Engine::builder().policies(Arc::new(config)).jitter_seed(7)).build();
        let events = engine.subscribe();
        let log = Log::new();
        let latch = Arc::new(Latch::default());
        let mut h = Self {
            engine,
            events,
            log,
            latch,
            turns: 0,
            calls: 0,
        };
        h.register_tools();
        // The scripted server's tools are pinned as it lists them (`tool_accepted`): that is
        // not what the tests watch.
        h.drain();
        h
    }

    fn register_tools(&self) {
        let engine = &self.engine;
        self.add_sleep("sleep");

        let log = self.log.clone();
        engine.register(InProcessTool::new(
            "stubborn",
            "Ignores cancels",
            object_schema(json!({"ms": {"type": "integer"}})),
            move |input, ctx: ToolContext| {
                let running = log.started("stubborn", ctx.meta().call_id.as_str());
                async move {
                    let _running = running;
                    match input["ms"].as_u64() {
                        Some(n) => tokio::time::sleep(ms(n)).await,
                        None => std::future::pending().await,
                    }
                    Ok::<_, ToolError>("finished anyway")
                }
            },
        ));

        let log = self.log.clone();
        let latch = self.latch.clone();
        engine.register(InProcessTool::blocking(
            "blocking",
            "Blocks a thread, ignoring cancels, until released",
            object_schema(json!({})),
            move |_input, ctx: ToolContext| {
                let _running = log.started("blocking", ctx.meta().call_id.as_str());
                latch.wait();
                Ok::<_, ToolError>("released")
            },
        ));

        let log = self.log.clone();
        engine.register(InProcessTool::new(
            "ticker",
            "Reports progress every every_ms for ms",
            object_schema(json!({
                "every_ms": {"type": "integer", "minimum": 1},
                "ms": {"type": "integer"},
                "beat": {"type": "boolean"}
            })),
            move |input, ctx: ToolContext| {
                let running = log.started("ticker", ctx.meta().call_id.as_str());
                async move {
                    let _running = running;
                    let every = ms(input["every_ms"].as_u64().unwrap_or(1000));
                    let total = ms(input["ms"].as_u64().unwrap_or(0));
                    let beat_only = input["beat"].as_bool().unwrap_or(false);
                    let start = Instant::now();
                    let mut n = 0u32;
                    loop {
                        let next = (start + every * (n + 1)).min(start + total);
                        tokio::select! {
                            () = ctx.cancelled() => return Err(ToolError::new("cancelled")),
                            () = tokio::time::sleep_until(next) => {}
                        }
                        if next >= start + total {
                            return Ok(format!("ticked {n} times"));
                        }
                        n += 1;
                        if beat_only {
                            ctx.heartbeat();
                        } else {
                            ctx.progress(f64::from(n), None, Some(&format!("tick {n}")));
                        }
                    }
                }
            },
        ));

        let log = self.log.clone();
        engine.register(InProcessTool::new(
            "echo",
            "Answers its input",
            json!({"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}),
            move |input, ctx: ToolContext| {
                let running = log.started("echo", ctx.meta().call_id.as_str());
                async move {
                    let _running = running;
                    Ok::<_, ToolError>(input)
                }
            },
        ));

        let log = self.log.clone();
        engine.register(InProcessTool::new(
            "fail",
            "Fails with its own error",
            object_schema(json!({})),
            move |_input, ctx: ToolContext| {
                let running = log.started("fail", ctx.meta().call_id.as_str());
                async move {
                    let _running = running;
                    Err::<String, _>(ToolError::new("disk full"))
                }
            },
        ));

        let server = Arc::new(Scripted {
            log: self.log.clone(),
            runs_by_input: Mutex::new(BTreeMap::new()),
        });
        let spec =
            |name: &str| ToolSpec::new(name, "A scripted server tool", json!({"type": "object"}));
        engine.host(true).set_tools(
            "srv",
            server,
            vec![spec("flaky"), spec("late"), spec("quiet")],
        );
    }

    /// Registers another `sleep`-like tool named `name` (its policy comes from `[tools.NAME]`).
    pub fn add_sleep(&self, name: &str) {
        let log = self.log.clone();
        let tool = name.to_owned();
        self.engine.register(InProcessTool::new(
            name,
            "Sleeps ms, stopping at once when cancelled",
            object_schema(json!({"ms": {"type": "integer", "minimum": 0}})),
            move |input, ctx: ToolContext| {
                let running = log.started(&tool, ctx.meta().call_id.as_str());
                async move {
                    let _running = running;
                    let n = input["ms"].as_u64().unwrap_or(0);
                    tokio::select! {
                        () = ctx.cancelled() => Err(ToolError::new("cancelled")),
                        () = tokio::time::sleep(ms(n)) => Ok(format!("slept {n}ms")),
                    }
                }
            },
        ));
    }

    /// Registers a tool with annotations (e.g. `destructiveHint`) that answers `done`.
    pub fn add_annotated(&self, name: &str, annotations: ToolAnnotations) {
        let log = self.log.clone();
        let tool = name.to_owned();
        self.engine.register(
            InProcessTool::new(
                name,
                "An annotated tool",
                object_schema(json!({})),
                move |_input, ctx: ToolContext| {
                    let running = log.started(&tool, ctx.meta().call_id.as_str());
                    async move {
                        let _running = running;
                        Ok::<_, ToolError>("done")
                    }
                },
            )
            .annotations(annotations),
        );
    }

    /// Waits until a `blocking` tool runs on its thread (threads start in real time, not in
    /// paused time).
    pub async fn blocking_started(&self) {
        self.latch.waiting.notified().await;
    }

    /// Lets every `blocking` tool return.
    pub fn release_blocking(&self) {
        self.latch.open();
    }

    /// A turn of `calls` in session `s1`, with the next turn id (`t1`, `t2`, ...).
    pub fn turn(&mut self, calls: Vec<ToolCall>) -> TurnRequest {
        self.turn_in(SESSION, calls)
    }

    /// A turn of `calls` in `session`, with the next turn id.
    pub fn turn_in(&mut self, session: &str, calls: Vec<ToolCall>) -> TurnRequest {
        self.turns += 1;
        TurnRequest {
            session_id: Some(SessionId::new(session.to_owned())),
            turn_id: Some(TurnId::new(format!("t{}", self.turns))),
            calls,
            ..TurnRequest::default()
        }
    }

    /// Starts a turn of `calls` in session `s1` on its own task.
    pub fn start(&mut self, calls: Vec<ToolCall>) -> toolwarden_core::TurnHandle {
        let req = self.turn(calls);
        self.engine.start_turn(req).unwrap()
    }

    /// Runs one call as its own turn in session `s1`.
    pub async fn call(&mut self, id: &str, tool: &str, input: Value) -> Arc<CallResult> {
        self.run(call(id, tool, input)).await
    }

    /// Runs one call (hints and all) as its own turn in session `s1`.
    pub async fn run(&mut self, call: ToolCall) -> Arc<CallResult> {
        self.run_in(SESSION, call).await
    }

    /// Runs one call as its own turn in `session`.
    pub async fn run_in(&mut self, session: &str, call: ToolCall) -> Arc<CallResult> {
        let req = self.turn_in(session, vec![call]);
        let mut out = self.engine.run_turn(req).await.unwrap();
        out.results.pop().unwrap()
    }

    /// Every event already emitted and not yet read.
    pub fn drain(&mut self) -> Vec<Arc<Event>> {
        let mut out = Vec::new();
        while let Some(r) = self.events.try_recv() {
            match r {
                Received::Event(e) => out.push(e),
                Received::Lagged(n) => panic!("the test lost {n} events"),
            }
        }
        out
    }

    /// Reads events (letting paused time run) until one of type `ty` arrives; returns them all,
    /// that one last. Fails after an hour of paused time without it.
    pub async fn until(&mut self, ty: &str) -> Vec<Arc<Event>> {
        let mut out = Vec::new();
        let wait = async {
            loop {
                match self.events.recv().await {
                    Some(Received::Event(e)) => {
                        let done = e.kind.name() == ty;
                        out.push(e);
                        if done {
                            return;
                        }
                    }
                    Some(Received::Lagged(n)) => panic!("the test lost {n} events"),
                    None => panic!("the event bus closed"),
                }
            }
        };
        if tokio::time::timeout(secs(3600), wait).await.is_err() {
            panic!("no {ty} event within an hour; got {:?}", types(&out));
        }
        out
    }
}

/// An interactor that puts every question before a person who answers through
/// [`toolwarden_core::Interactions::answer`] (like the HTTP API and the dashboard).
pub struct Passive;

impl toolwarden_core::Interactor for Passive {
    fn name(&self) -> &str {
        "http"
    }

    fn can_answer(&self, _: &toolwarden_core::protocol::Interaction) -> bool {
        true
    }

    fn present(
        &self,
        _: &toolwarden_core::protocol::Interaction,
        _: toolwarden_core::AnswerSender,
    ) {
    }
}

impl Harness {
    /// Attaches a [`Passive`] interactor: approvals wait for an answer.
    pub fn attach_person(&self) {
        self.engine.interactions().attach(Arc::new(Passive));
    }
}

/// `{"type": "object", "properties": ...}`.
pub fn object_schema(properties: Value) -> Value {
    json!({"type": "object", "properties": properties})
}

/// A scripted MCP-like server: its tools' behaviour is chosen by their input.
struct Scripted {
    log: Arc<Log>,
    runs_by_input: Mutex<BTreeMap<String, u32>>,
}

impl Backend for Scripted {
    fn name(&self) -> &str {
        "srv"
    }

    fn start(&self, attempt: Attempt) -> BoxFuture<AttemptEnd> {
        let log = self.log.clone();
        let tool = format!("srv__{}", attempt.tool);
        let run = {
            let mut runs = self.runs_by_input.lock();
            let n = runs.entry(format!("{tool} {}", attempt.input)).or_insert(0);
            *n += 1;
            *n
        };
        Box::pin(async move {
            let _running = log.started(&tool, attempt.meta.call_id.as_str());
            let input = &*attempt.input;
            let took = ms(input["ms"].as_u64().unwrap_or(0));
            match &*attempt.tool {
                "late" => {
                    // Deaf to every stop request: answers when it is done.
                    tokio::time::sleep(took).await;
                    AttemptEnd::Done(Ok(ToolOutput::text("late answer")))
                }
                "quiet" => {
                    // Stopped when asked, but nothing shows it until the stop is forced.
                    attempt.stop.forced().await;
                    AttemptEnd::Stopped(toolwarden_core::protocol::StopHow::Cooperative)
                }
                _ => {
                    let hang = attempt.meta.attempt <= input["hang"].as_u64().unwrap_or(0) as u32;
                    let work = async {
                        if hang {
                            std::future::pending::<()>().await;
                        }
                        tokio::time::sleep(took).await;
                    };
                    tokio::select! {
                        () = attempt.stop.cancelled() => return AttemptEnd::Stopped(toolwarden_core::protocol::StopHow::Cooperative),
                        () = work => {}
                    }
                    let fail = u64::from(run) <= input["fail"].as_u64().unwrap_or(0);
                    if fail {
                        let message = format!("run {run} failed");
                        return AttemptEnd::Done(Err(match input["error"].as_str() {
                            Some("crashed") => AttemptError::Crashed(message),
                            _ => AttemptError::Transport(message),
                        }));
                    }
                    AttemptEnd::Done(Ok(ToolOutput::text(format!(
                        "ok on attempt {}",
                        attempt.meta.attempt
                    ))))
                }
            }
        })
    }
}

/// The `type` of each event.
pub fn types(events: &[Arc<Event>]) -> Vec<&'static str> {
    events.iter().map(|e| e.kind.name()).collect()
}

/// The events of type `ty`.
pub fn of_type<'a>(events: &'a [Arc<Event>], ty: &str) -> Vec<&'a Arc<Event>> {
    events.iter().filter(|e| e.kind.name() == ty).collect()
}

/// An event as JSON without what differs from run to run or is checked elsewhere: `seq`, `ts`,
/// `session_id`, and `principal` (the harness's turns are `local`'s: checked here). Turn ids are
/// the harness's (`t1`, ...), so they stay.
pub fn shape(event: &Event) -> Value {
    let mut v = serde_json::to_value(event).unwrap();
    let obj = v.as_object_mut().unwrap();
    if let Some(principal) = obj.remove("principal") {
        assert_eq!(principal, "local", "{event:?}");
    }
    obj.remove("seq");
    obj.remove("ts");
    obj.remove("session_id");
    v
}

/// The shapes of the events of type `ty`.
pub fn shapes(events: &[Arc<Event>], ty: &str) -> Vec<Value> {
    of_type(events, ty).into_iter().map(|e| shape(e)).collect()
}

/// A result's outcome as JSON, without the turn id and the wall-clock `fetched_at` of its
/// provenance.
pub fn outcome(result: &CallResult) -> Value {
    let mut v = serde_json::to_value(&result.outcome).unwrap();
    let obj = v.as_object_mut().unwrap();
    obj.remove("turn_id");
    if let Some(p) = obj.get_mut("provenance").and_then(Value::as_object_mut) {
        p.remove("fetched_at");
    }
    v
}

/// Checks a result whole: its outcome (see [`outcome`]), its text, and that `is_error` agrees
/// with its status.
pub fn check(result: &CallResult, expected_outcome: Value, expected_text: &str) {
    assert_eq!(outcome(result), expected_outcome, "outcome");
    assert_eq!(result.text(), expected_text, "text");
    assert_eq!(
        result.is_error,
        expected_outcome["status"] != "ok",
        "is_error"
    );
}

/// The outcome's status fields only (`{"status": "timeout", "kind": "total", "after_ms": 5000}`),
/// for comparing many results at once.
pub fn status(result: &CallResult) -> Value {
    let mut v = serde_json::to_value(&result.outcome.status).unwrap();
    v["call_id"] = json!(result.outcome.call_id);
    v
}

/// The `EventKind` of an event, for matching.
pub fn kind(event: &Event) -> &EventKind {
    &event.kind
}

/// The lines of the Prometheus text whose metric name starts with `prefix`, sorted.
pub fn metric_lines(text: &str, prefix: &str) -> Vec<String> {
    let mut lines: Vec<String> = text
        .lines()
        .filter(|l| !l.starts_with('#') && l.starts_with(prefix))
        .map(str::to_owned)
        .collect();
    lines.sort();
    lines
}
