//! The engine: the public API that front doors and Rust programs use. It owns the registry of
//! tools, the running turns and the servers' states, and hands turns to `turn`, which hands each
//! call to `call`: the engine never reaches into a call.

mod host;
mod inner;
mod shared;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::task::TaskTracker;
use toolwarden_protocol::{
    ActiveTurn, BreakerInfo, BreakerStateKind, CallId, CallResult, CancelReason, Content,
    EventKind, Outcome, Policy, ServerNotUp, ServerStateKind, SessionId, SessionKey, SessionStatus,
    Status, ToolCall, ToolInfo, ToolSpec, TurnId,
};

use crate::backend::{Backend, BackendHost};
use crate::cache::Cache;
use crate::call::CallEnv;
use crate::config::Config;
use crate::events::{EventBus, EventSink, Subscription};
use crate::ids::new_id;
use crate::inproc::{InProcessBackend, InProcessTool};
use crate::interaction::Interactions;
use crate::metrics::Metrics;
use crate::policy::{PolicySource, ToolOrigin};
use crate::registry::Registry;
use crate::retry::Jitter;
use crate::servers::{ServerStatus, Servers};
use crate::shared::SharedState;
use crate::store::{self, AuditStore, StoreUnavailable};
use crate::turn::{
    NotFound, TurnError, TurnHandle, TurnOutput, TurnRequest, TurnRuntime, drive_turn, prepare,
};

use host::Host;
use inner::EngineInner;

/// Where a tool runs (see [`Engine::tool_backing`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolBacking {
    /// The MCP server that serves it, for a server's tool.
    pub server: Option<String>,
    /// The backend's name (the server's name, `exec`, `inprocess`).
    pub backend: String,
    /// The backend's own name for the tool (without a `SERVER__` prefix).
    pub tool: std::sync::Arc<str>,
    /// Its description.
    pub description: Option<String>,
}

/// Settings of an engine.
pub struct EngineBuilder {
    policies: Arc<dyn PolicySource>,
    event_capacity: usize,
    jitter_seed: Option<u64>,
    interaction_ceiling: Duration,
    headless: bool,
    cache_entries: usize,
    blocking_threads: usize,
    store: Option<Arc<dyn AuditStore>>,
    store_wait: std::time::Duration,
    shared: Option<Arc<dyn SharedState>>,
    metrics: Option<Arc<Metrics>>,
    trace_sink: Option<Arc<dyn EventSink>>,
    hook_transport: Option<Arc<dyn crate::hooks::HookTransport>>,
}

impl Default for EngineBuilder {
    fn default() -> Self {
        Self {
            store_wait: store::DEFAULT_STORE_WAIT,
            policies: Arc::new(Config::builtin()),
            event_capacity: crate::events::DEFAULT_CAPACITY,
            jitter_seed: None,
            interaction_ceiling: Duration::from_secs(15 * 60),
            headless: false,
            cache_entries: 10_000,
            blocking_threads: 64,
            store: None,
            shared: None,
            metrics: None,
            trace_sink: None,
            hook_transport: None,
        }
    }
}

impl EngineBuilder {
    /// Where tools' policies come from (default: [`Config::builtin`]).
    pub fn policies(mut self, policies: Arc<dyn PolicySource>) -> Self {
        self.policies = policies;
        self
    }

    /// How many events a subscriber may fall behind before it loses some.
    pub fn event_capacity(mut self, capacity: usize) -> Self {
        self.event_capacity = capacity;
        self
    }

    /// Seeds retry jitter (for reproducible tests).
    pub fn jitter_seed(mut self, seed: u64) -> Self {
        self.jitter_seed = Some(seed);
        self
    }

    /// The ceiling of every interaction's deadline (default 15 min).
    pub fn interaction_ceiling(mut self, ceiling: Duration) -> Self {
        self.interaction_ceiling = ceiling;
        self
    }

    /// Headless: nothing can answer an interaction; calls needing approval are denied at once.
    pub fn headless(mut self, headless: bool) -> Self {
        self.headless = headless;
        self
    }

    /// How many results the cache keeps at most.
    pub fn cache_entries(mut self, entries: usize) -> Self {
        self.cache_entries = entries;
        self
    }

    /// How many blocking in-process tools may run at once.
    pub fn blocking_threads(mut self, threads: usize) -> Self {
        self.blocking_threads = threads.max(1);
        self
    }

    /// The audit trail every event is appended to (see [`crate::store`]).
    pub fn store(mut self, store: Arc<dyn AuditStore>) -> Self {
        self.store = Some(store);
        self
    }

    /// How long a call whose `tool_start` cannot be committed (`before_execution`, the trail
    /// unwritable) waits for the trail before it ends `error{store}` without running (default
    /// [`store::DEFAULT_STORE_WAIT`]; zero: at once).
    pub fn store_wait(mut self, wait: std::time::Duration) -> Self {
        self.store_wait = wait;
        self
    }

    /// State shared with other replicas (docs/SCALE-OUT.md); without it, everything is local.
    pub fn shared(mut self, shared: Arc<dyn SharedState>) -> Self {
        self.shared = Some(shared);
        self
    }

    /// How `[hooks]` are reached (HTTP, commands). Without it, every hook fails, and its
    /// `on_error` decides.
    pub fn hook_transport(mut self, transport: Arc<dyn crate::hooks::HookTransport>) -> Self {
        self.hook_transport = Some(transport);
        self
    }

    /// The metrics the engine counts into (default: its own), for parts built before it that
    /// count into them too (the shared state).
    pub fn metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Exports spans: every turn gets a span in a trace (the `trace` of `turn_start`), each
    /// attempt's backend is told its attempt's span as the context to pass on, and `sink` gets
    /// every event to build the spans from (see the `toolwarden-otel` crate). Without it, a
    /// client's trace context is passed on to backends unchanged and no ids are made.
    pub fn trace_sink(mut self, sink: Arc<dyn EventSink>) -> Self {
        self.trace_sink = Some(sink);
        self
    }

    /// The engine.
    pub fn build(self) -> Engine {
        let bus = Arc::new(EventBus::new(self.event_capacity));
        let metrics = self.metrics.unwrap_or_else(|| Arc::new(Metrics::new()));
        let interactions =
            Interactions::new(bus.clone(), metrics.clone(), self.interaction_ceiling);
        interactions.set_headless(self.headless);
        // `seq` continues after the trail's, and every event is appended to it.
        let store = self
            .store
            .map(|s| store::attach(&bus, &metrics, s, self.store_wait));
        let export_spans = self.trace_sink.is_some();
        if let Some(sink) = self.trace_sink {
            bus.add_sink(sink);
        }
        let registry = Arc::new(Registry::new(self.policies, metrics.clone()));
        let env = CallEnv {
            bus: bus.clone(),
            cache: Cache::new(self.cache_entries),
            jitter: Jitter::new(self.jitter_seed),
            tracker: TaskTracker::new(),
            interactions,
            store,
            shared: self.shared,
            exclusive_tools: registry.exclusive_tools(),
            export_spans,
            guards: registry.guards_cell(),
            hook_transport: self.hook_transport,
            metrics: metrics.clone(),
            pins: Arc::default(),
        };
        let inner = Arc::new(EngineInner {
            remote_events: tokio::sync::broadcast::channel(self.event_capacity.max(16)).0,
            task_answerer: parking_lot::RwLock::new(None),
            registry,
            servers: Arc::new(Servers::new(metrics.clone(), bus)),
            inproc: Arc::new(InProcessBackend::new(
                self.blocking_threads,
                metrics.clone(),
            )),
            turns: Arc::new(TurnRuntime::new(env, metrics)),
        });
        Engine { inner }
    }
}

/// The toolwarden engine. Cheap to clone; every clone is the same engine.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<EngineInner>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("tools", &self.inner.registry.list().len())
            .finish_non_exhaustive()
    }
}

impl Default for Engine {
    fn default() -> Self {
        Self::new()
    }
}

impl Engine {
    /// An engine on built-in defaults.
    pub fn new() -> Self {
        EngineBuilder::default().build()
    }

    /// Settings for an engine.
    pub fn builder() -> EngineBuilder {
        EngineBuilder::default()
    }

    /// Registers (or replaces) an in-process tool.
    pub fn register(&self, tool: InProcessTool) {
        let (spec, layer, handler) = tool.into_parts();
        self.inner.inproc.insert(&spec.name, handler);
        let origin = ToolOrigin::InProcess(Box::new(layer));
        let backend: Arc<dyn Backend> = self.inner.inproc.clone();
        let entry = self
            .inner
            .registry
            .entry(spec.name.clone(), spec, backend, origin);
        self.inner.registry.insert(entry);
    }

    /// Registers a backend's tools under their own names (e.g. `exec`), replacing earlier tools
    /// of the same origin.
    pub fn add_tools(&self, origin: ToolOrigin, backend: Arc<dyn Backend>, tools: Vec<ToolSpec>) {
        let entries = tools
            .into_iter()
            .map(|spec| {
                self.inner
                    .registry
                    .entry(spec.name.clone(), spec, backend.clone(), origin.clone())
            })
            .collect();
        self.inner.registry.replace(&origin, entries);
    }

    /// Removes a tool; whether it existed.
    pub fn remove_tool(&self, name: &str) -> bool {
        self.inner.registry.remove(name)
    }

    /// Replaces where policies come from and re-resolves every registered tool.
    pub fn set_policies(&self, policies: Arc<dyn PolicySource>) {
        self.inner.registry.set_policies(policies);
    }

    /// The handle MCP server backends report to. `prefix = false` exposes tools unprefixed.
    pub fn host(&self, prefix: bool) -> Arc<dyn BackendHost> {
        Arc::new(Host {
            engine: Arc::downgrade(&self.inner),
            prefix,
        })
    }

    /// Runs one call as a one-call turn in `session`, here on the caller's task. Dropping the
    /// future cancels the call (as a client disconnect).
    pub async fn call(&self, session_id: impl Into<SessionId>, call: ToolCall) -> Arc<CallResult> {
        let req = TurnRequest::new(session_id, vec![call]);
        match self.run_turn(req).await {
            Ok(mut out) => out
                .results
                .pop()
                .unwrap_or_else(|| Arc::new(refused_result(TurnError::Empty))),
            // A single call with an id cannot be refused; an empty id can.
            Err(e) => Arc::new(refused_result(e)),
        }
    }

    /// A fresh turn id (`t_<ULID>`), for a caller that wants to know a turn's id before it runs
    /// (to abort it from elsewhere while [`Engine::run_turn`] drives it).
    pub fn new_turn_id() -> TurnId {
        TurnId::new(new_id("t_"))
    }

    /// Runs a turn here on the caller's task and returns one result per call, in order.
    /// Dropping the future aborts the turn (as a client disconnect).
    pub async fn run_turn(&self, req: TurnRequest) -> Result<TurnOutput, TurnError> {
        let (turn, jobs) = prepare(
            &self.inner.turns,
            &self.inner.registry,
            &self.inner.servers,
            req,
        )?;
        let (turn_id, session_id) = (turn.id().clone(), turn.base.session.key.id.clone());
        let (results, rendered) = drive_turn(self.inner.turns.clone(), turn, jobs).await;
        Ok(TurnOutput {
            turn_id,
            session_id,
            results,
            rendered,
        })
    }

    /// Starts a turn on its own task. The handle streams completions and gives the ordered results;
    /// dropping it aborts the turn unless [`TurnHandle::detach`]ed.
    pub fn start_turn(&self, req: TurnRequest) -> Result<TurnHandle, TurnError> {
        let rt = &self.inner.turns;
        let (turn, jobs) = prepare(rt, &self.inner.registry, &self.inner.servers, req)?;
        let handle = TurnHandle::new(
            turn.id().clone(),
            turn.base.session.key.id.clone(),
            turn.base.stream_completions(),
            {
                let (tx, rx) = tokio::sync::oneshot::channel();
                let driven = rt.clone();
                rt.env.tracker.spawn(async move {
                    let _ = tx.send(drive_turn(driven, turn, jobs).await);
                });
                rx
            },
            Arc::downgrade(rt),
        );
        Ok(handle)
    }

    /// Aborts a running turn and (through the tree) its calls and child turns. Idempotent while the
    /// turn runs; `NotFound` once it finished or if it never existed.
    pub fn abort_turn(&self, turn_id: &TurnId, reason: CancelReason) -> Result<(), NotFound> {
        self.inner.turns.abort_turn(turn_id, reason)
    }

    /// Aborts one call of a running turn; the turn goes on.
    pub fn abort_call(
        &self,
        turn_id: &TurnId,
        call_id: &CallId,
        reason: CancelReason,
    ) -> Result<(), NotFound> {
        self.inner.turns.abort_call(turn_id, call_id, reason)
    }

    /// Cancels every running call of a session (e.g. its MCP client went away).
    pub fn end_session(&self, session: &SessionKey, reason: CancelReason) {
        self.inner.turns.end_session(session, reason);
    }

    /// Running turns, oldest first.
    pub fn active_turns(&self) -> Vec<ActiveTurn> {
        self.inner.turns.active()
    }

    /// How a session's calls are doing; `None` for an unknown session.
    pub fn session_status(&self, session: &SessionKey) -> Option<SessionStatus> {
        let mut status = self
            .inner
            .turns
            .session_status(session, self.open_breakers())?;
        status.servers_not_up = self.servers_not_up();
        Some(status)
    }

    /// Backend servers that are not up, by name, with why.
    pub fn servers_not_up(&self) -> std::collections::BTreeMap<String, ServerNotUp> {
        self.servers()
            .into_iter()
            .filter(|(_, s)| s.state != ServerStateKind::Up)
            .map(|(name, s)| {
                let s = ServerNotUp {
                    state: s.state,
                    detail: s.detail,
                };
                (name, s)
            })
            .collect()
    }

    /// Breakers that are not closed.
    pub fn open_breakers(&self) -> Vec<BreakerInfo> {
        let now = Instant::now();
        self.inner
            .registry
            .list()
            .iter()
            .filter_map(|e| {
                let (state, left) = e.runtime.breaker.state(now);
                (state != BreakerStateKind::Closed).then(|| BreakerInfo {
                    tool: e.name.to_string(),
                    state,
                    retry_after_ms: left.map(|d| d.as_millis() as u64),
                })
            })
            .collect()
    }

    /// Every tool with its effective policy and breaker state, by name.
    pub fn tools(&self) -> Vec<ToolInfo> {
        let now = Instant::now();
        self.inner
            .registry
            .list()
            .iter()
            .map(|e| ToolInfo {
                name: e.name.to_string(),
                description: e.spec.description.clone(),
                input_schema: e.spec.input_schema.clone(),
                output_schema: e.spec.output_schema.clone(),
                annotations: e.spec.annotations.clone(),
                backend: e.origin.backend_name().to_owned(),
                policy: e.policy.clone(),
                breaker: e.runtime.breaker.state(now).0,
                changed: self.inner.turns.env.pins.change(&e.name).map(|c| {
                    toolwarden_protocol::ToolChange {
                        server: c.server,
                        old_digest: c.old_digest,
                        new_digest: c.new.digest,
                        diff: c.diff,
                        blocked: c.blocked,
                    }
                }),
            })
            .collect()
    }

    /// Reads the pins back from the audit trail: every `tool_accepted` event, the last of each
    /// tool winning. Call it before servers list their tools; without a trail it does nothing.
    /// A trail that cannot be read leaves the pins to be made anew as tools are listed (said in
    /// the error).
    pub async fn load_pins(&self) -> Result<usize, crate::store::StoreReadError> {
        let Some(store) = self.store() else {
            return Ok(0);
        };
        let pins = &self.inner.turns.env.pins;
        let mut after = None;
        let mut count = 0;
        loop {
            let page = match store
                .events(toolwarden_protocol::AuditQuery {
                    kind: Some("tool_accepted".to_owned()),
                    after,
                    limit: toolwarden_protocol::AUDIT_MAX_LIMIT,
                    ..Default::default()
                })
                .await
            {
                Ok(page) => page,
                Err(e) => {
                    pins.set_unloaded();
                    return Err(e);
                }
            };
            for event in &page.events {
                let Ok(body) = serde_json::from_str::<serde_json::Value>(event.body.get()) else {
                    continue;
                };
                let text = |k: &str| body.get(k).and_then(serde_json::Value::as_str);
                if let (Some(tool), Some(server), Some(definition)) =
                    (text("tool"), text("server"), body.get("definition"))
                {
                    pins.restore(
                        tool,
                        server,
                        crate::pins::Definition::from_value(definition.clone()),
                    );
                    count += 1;
                }
            }
            match page.next {
                Some(next) if !page.events.is_empty() => after = Some(next),
                _ => return Ok(count),
            }
        }
    }

    /// The change a server made to tool `name`'s definition that waits to be accepted.
    pub fn tool_change(&self, name: &str) -> Option<crate::pins::PendingChange> {
        self.inner.turns.env.pins.change(name)
    }

    /// Accepts the waiting change of tool `name` as `by` (a principal): its new definition is
    /// pinned, `tool_accepted` says so, and calls held by `on_tool_change = "block"` run again.
    /// `None`: no change of that tool waits.
    /// With `expected`, only the change to that digest is accepted (the one a person reviewed):
    /// a server that changed the tool again since gives [`crate::pins::AcceptError::Other`].
    pub fn accept_tool(
        &self,
        name: &str,
        by: &str,
        expected: Option<&str>,
    ) -> Result<crate::pins::PendingChange, crate::pins::AcceptError> {
        let env = &self.inner.turns.env;
        let change = env.pins.accept(name, expected)?;
        env.bus.emit(
            &Arc::new(crate::events::EventScope {
                tool: Some(Arc::from(name)),
                ..crate::events::EventScope::default()
            }),
            EventKind::ToolAccepted {
                server: change.server.clone(),
                digest: change.new.digest.clone(),
                definition: change.new.value.clone(),
                by: Some(by.to_owned()),
            },
        );
        Ok(change)
    }

    /// Another replica accepted tool `name`'s change to the definition `digest`: if this
    /// replica holds the same change, it is pinned here too (that replica recorded it).
    pub fn tool_accepted_elsewhere(&self, name: &str, digest: &str) {
        // Only that very change: one the server made since is not taken with it.
        let _ = self.inner.turns.env.pins.accept(name, Some(digest));
    }

    /// For explain: the hooks asked about calls of `tool` (by name, in the order they are
    /// asked) and the quotas calls of it by `principal` take from (by index).
    pub fn guards_of(&self, tool: &str, principal: &str) -> (Vec<String>, Vec<usize>) {
        let guards = self.inner.registry.guards_cell().read().clone();
        crate::quotas::guards_of(
            guards.hooks.as_deref(),
            guards.quotas.as_deref(),
            tool,
            principal,
        )
    }

    /// The `[[rules]]` in force (`None`: there are none).
    pub fn rules(&self) -> Option<Arc<crate::rules::Rules>> {
        self.inner.registry.guards_cell().read().rules.clone()
    }

    /// The effective policy of tool `name` (before any per-call hint); `None` for an unknown tool.
    pub fn policy_of(&self, name: &str) -> Option<Policy> {
        self.inner.registry.get(name).map(|e| e.policy.clone())
    }

    /// Where tool `name` runs: the backend it comes from, that backend's own name for it, and
    /// its description (an exporter names an attempt's span by them).
    pub fn tool_backing(&self, name: &str) -> Option<ToolBacking> {
        self.inner.registry.get(name).map(|e| ToolBacking {
            server: match &e.origin {
                ToolOrigin::Server(s) => Some(s.clone()),
                ToolOrigin::Exec | ToolOrigin::InProcess(_) => None,
            },
            backend: e.origin.backend_name().to_owned(),
            tool: e.backend_tool.clone(),
            description: e.spec.description.clone(),
        })
    }

    /// Changes whenever the set of tools changes: a tool registered or removed, a server's
    /// list published (at every start and after `tools/list_changed`), policies re-resolved.
    /// The value is a generation counter; a change does not promise a different list, so a
    /// front door that tells its clients compares what it would list.
    pub fn tools_changed(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.registry.subscribe()
    }

    /// Every backend server's last reported state, by name.
    pub fn servers(&self) -> std::collections::BTreeMap<String, ServerStatus> {
        self.inner.servers.snapshot()
    }

    /// A live view of every event.
    pub fn subscribe(&self) -> Subscription {
        self.inner.turns.env.bus.subscribe()
    }

    /// The event bus (to add durable sinks).
    pub fn events(&self) -> &Arc<EventBus> {
        &self.inner.turns.env.bus
    }

    /// The Prometheus text of every metric, as of now: gauges that follow the clock (a breaker
    /// whose `open_for` has passed reads half-open) are brought up to date first.
    pub fn metrics_text(&self) -> String {
        let now = Instant::now();
        for e in self.inner.registry.list() {
            e.runtime.metrics.breaker(e.runtime.breaker.state(now).0);
        }
        store::refresh_metrics(self.inner.turns.env.store.as_ref());
        self.inner.turns.metrics.encode()
    }

    /// The metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.turns.metrics
    }

    /// The interaction broker.
    pub fn interactions(&self) -> &Interactions {
        &self.inner.turns.env.interactions
    }

    /// The audit trail, when the engine has one.
    pub fn store(&self) -> Option<&Arc<dyn AuditStore>> {
        self.inner.turns.env.store.as_ref().map(|h| &h.store)
    }

    /// Waits (at most `within`) until every event emitted so far is committed and readable, so
    /// that a read of the trail sees them. Without a store, returns at once.
    pub async fn store_caught_up(&self, within: Duration) -> Result<(), StoreUnavailable> {
        let Some(store) = self.store() else {
            return Ok(());
        };
        let seq = self.inner.turns.env.bus.last_seq();
        match tokio::time::timeout(within, store.readable(Some(seq))).await {
            Ok(done) => done,
            Err(_) => Err(StoreUnavailable(format!(
                "events up to seq {seq} were not committed within {within:?}"
            ))),
        }
    }

    /// Shuts down: every running call ends `cancelled{shutdown}` at once; then waits up to `wait`
    /// for their backends to stop (cooperatively or by force). Returns whether everything stopped.
    pub async fn shutdown(&self, wait: Duration) -> bool {
        let rt = &self.inner.turns;
        rt.root.cancel(CancelReason::Shutdown);
        rt.env.tracker.close();
        tokio::time::timeout(wait, rt.env.tracker.wait())
            .await
            .is_ok()
    }
}

/// The result of a call that was refused with its turn (a one-call turn can only be refused
/// for an empty id).
fn refused_result(e: TurnError) -> CallResult {
    let status = Status::Invalid {
        reason: toolwarden_protocol::InvalidReason::Schema,
    };
    CallResult {
        content: vec![Content::text(format!(
            "[INVALID] The call was refused: {e}."
        ))],
        outcome: Outcome {
            status,
            attempts: 0,
            call_id: CallId::from(""),
            turn_id: TurnId::from(""),
            tool: "".into(),
            duration_ms: 0,
            provenance: None,
            detail: Some(e.to_string()),
            repeat_count: None,
        },
        structured_content: None,
        is_error: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inproc::ToolError;

    #[tokio::test(start_paused = true)]
    async fn tool_set_changes_are_announced() {
        let engine = Engine::new();
        let mut changed = engine.tools_changed();
        assert!(!changed.has_changed().unwrap_or(true));
        engine.register(InProcessTool::new(
            "noop",
            "Does nothing",
            serde_json::json!({"type": "object"}),
            |_input, _ctx| async move { Ok::<_, ToolError>("ok") },
        ));
        assert!(changed.has_changed().unwrap_or(false));
        changed.mark_unchanged();
        assert!(!engine.remove_tool("missing"));
        assert!(!changed.has_changed().unwrap_or(true));
        assert!(engine.remove_tool("noop"));
        assert!(changed.has_changed().unwrap_or(false));
    }
}
