//! The engine: registry, sessions, turns, and the public API front doors and Rust programs use.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use tokio::time::Instant;
use tokio_util::task::TaskTracker;
use toolwarden_protocol::{
    ActiveTurn, BreakerInfo, BreakerStateKind, CallId, CallResult, CallState, CancelReason,
    Concurrency, Content, EventKind, Outcome, RunningCall, ServerStateKind, SessionId,
    SessionStatus, Status, ToolCall, ToolInfo, ToolSpec, TurnId,
};

use crate::FastMap;
use crate::backend::{AttemptMeta, Backend, BackendHost};
use crate::cache::Cache;
use crate::call::CallJob;
use crate::cancel::{Scope, ScopeKind};
use crate::config::Config;
use crate::events::{EventBus, EventScope, Subscription};
use crate::inproc::{InProcessBackend, InProcessTool};
use crate::interaction::Interactions;
use crate::metrics::Metrics;
use crate::policy::{PolicySource, ToolOrigin};
use crate::registry::{Registry, ToolEntry, ToolRuntime};
use crate::retry::Jitter;
use crate::session::Session;
use crate::text::outcome_text;
use crate::turn::{
    CallSlot, SlotView, TurnError, TurnHandle, TurnOutput, TurnRequest, TurnState, drive_turn,
    stream_completions,
};

/// Sessions idle this long (no running turn) are forgotten.
const SESSION_IDLE_EVICT: Duration = Duration::from_secs(3600);
/// Sessions are swept when there are more than this many.
const SESSION_SWEEP_AT: usize = 1024;

/// The separator of exposed MCP tool names: `SERVER__TOOL`.
pub const PREFIX_SEPARATOR: &str = "__";

/// Settings of an engine.
pub struct EngineBuilder {
    policies: Arc<dyn PolicySource>,
    event_capacity: usize,
    jitter_seed: Option<u64>,
    interaction_ceiling: Duration,
    headless: bool,
    cache_entries: usize,
    blocking_threads: usize,
    // store: the audit trail, if any.
    store: Option<Arc<dyn crate::store::AuditStore>>,
}

impl Default for EngineBuilder {
    fn default() -> Self {
        Self {
            policies: Arc::new(Config::builtin()),
            event_capacity: crate::events::DEFAULT_CAPACITY,
            jitter_seed: None,
            interaction_ceiling: Duration::from_secs(15 * 60),
            headless: false,
            cache_entries: 10_000,
            blocking_threads: 64,
            store: None,
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

    /// The audit trail every event is appended to (SPEC §9; see [`crate::store`]).
    pub fn store(mut self, store: Arc<dyn crate::store::AuditStore>) -> Self {
        self.store = Some(store);
        self
    }

    /// The engine.
    pub fn build(self) -> Engine {
        let bus = Arc::new(EventBus::new(self.event_capacity));
        let metrics = Arc::new(Metrics::new());
        let interactions =
            Interactions::new(bus.clone(), metrics.clone(), self.interaction_ceiling);
        interactions.set_headless(self.headless);
        // store: seq continues after the trail's, every event is appended to it.
        let store = self.store.map(|s| crate::store::attach(&bus, &metrics, s));
        let inner = Arc::new(EngineInner {
            registry: Registry::default(),
            policies: RwLock::new(self.policies),
            bus,
            metrics: metrics.clone(),
            interactions,
            cache: Cache::new(self.cache_entries),
            jitter: Jitter::new(self.jitter_seed),
            root: Scope::root(),
            sessions: Mutex::new(FastMap::default()),
            turns: Mutex::new(FastMap::default()),
            tracker: TaskTracker::new(),
            inproc: Arc::new(InProcessBackend::new(self.blocking_threads, metrics)),
            servers: Mutex::new(std::collections::BTreeMap::new()),
            store,
        });
        Engine { inner }
    }
}

pub(crate) struct EngineInner {
    pub(crate) registry: Registry,
    pub(crate) policies: RwLock<Arc<dyn PolicySource>>,
    pub(crate) bus: Arc<EventBus>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) interactions: Interactions,
    pub(crate) cache: Cache,
    pub(crate) jitter: Jitter,
    pub(crate) root: Scope,
    pub(crate) sessions: Mutex<FastMap<SessionId, Arc<Session>>>,
    pub(crate) turns: Mutex<FastMap<TurnId, Arc<TurnState>>>,
    pub(crate) tracker: TaskTracker,
    pub(crate) inproc: Arc<InProcessBackend>,
    pub(crate) servers: Mutex<std::collections::BTreeMap<String, ServerStatus>>,
    pub(crate) store: Option<crate::store::StoreHook>,
}

/// A backend server's last reported state.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ServerStatus {
    /// Its state.
    pub state: ServerStateKind,
    /// Why, when it is down.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// The toolwarden engine. Cheap to clone; every clone is the same engine.
#[derive(Clone)]
pub struct Engine {
    pub(crate) inner: Arc<EngineInner>,
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

/// A turn, call or interaction that is not running (finished, or never existed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0} is not running (finished or unknown)")]
pub struct NotFound(pub String);

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
        let entry = self.inner.entry(spec.name.clone(), spec, backend, origin);
        self.inner.registry.insert(entry);
    }

    /// Registers a backend's tools under their own names (e.g. `exec`), replacing earlier tools
    /// of the same origin.
    pub fn add_tools(&self, origin: ToolOrigin, backend: Arc<dyn Backend>, tools: Vec<ToolSpec>) {
        let entries = tools
            .into_iter()
            .map(|spec| {
                self.inner
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
        *self.inner.policies.write() = policies;
        for e in self.inner.registry.list() {
            let entry = self.inner.entry(
                e.name.to_string(),
                e.spec.clone(),
                e.backend.clone(),
                e.origin.clone(),
            );
            self.inner.registry.insert(entry);
        }
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
                .unwrap_or_else(|| Arc::new(self.inner.orphan_result())),
            // A single call with an id cannot be refused; an empty id can.
            Err(e) => Arc::new(self.inner.refused_result(e)),
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
        let (turn, jobs) = self.inner.prepare(req)?;
        let (turn_id, session_id) = (turn.id.clone(), turn.session.id.clone());
        let (results, rendered) = drive_turn(self.inner.clone(), turn, jobs).await;
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
        let (turn, jobs) = self.inner.prepare(req)?;
        let completions = stream_completions(&turn);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let handle = TurnHandle::new(
            turn.id.clone(),
            turn.session.id.clone(),
            completions,
            rx,
            Arc::downgrade(&self.inner),
        );
        let engine = self.inner.clone();
        self.inner.tracker.spawn(async move {
            let _ = tx.send(drive_turn(engine, turn, jobs).await);
        });
        Ok(handle)
    }

    /// Aborts a running turn and (through the tree) its calls and child turns. Idempotent while the
    /// turn runs; `NotFound` once it finished or if it never existed.
    pub fn abort_turn(&self, turn_id: &TurnId, reason: CancelReason) -> Result<(), NotFound> {
        self.inner.abort_turn(turn_id, reason)
    }

    /// Aborts one call of a running turn; the turn goes on.
    pub fn abort_call(
        &self,
        turn_id: &TurnId,
        call_id: &CallId,
        reason: CancelReason,
    ) -> Result<(), NotFound> {
        let turn = self
            .inner
            .turns
            .lock()
            .get(turn_id)
            .cloned()
            .ok_or_else(|| NotFound(format!("turn {turn_id}")))?;
        let slot = turn
            .slots
            .iter()
            .find(|s| &s.call_id == call_id)
            .ok_or_else(|| NotFound(format!("call {call_id} of turn {turn_id}")))?;
        if slot.view.lock().state == CallState::Done {
            return Err(NotFound(format!("call {call_id} of turn {turn_id}")));
        }
        slot.scope.cancel(reason);
        Ok(())
    }

    /// Cancels every running call of a session (e.g. its MCP client went away).
    pub fn end_session(&self, session_id: &SessionId, reason: CancelReason) {
        if let Some(session) = self.inner.sessions.lock().remove(session_id) {
            session.scope.cancel(reason);
        }
    }

    /// Running turns, oldest first.
    pub fn active_turns(&self) -> Vec<ActiveTurn> {
        let turns: Vec<Arc<TurnState>> = self.inner.turns.lock().values().cloned().collect();
        let mut v: Vec<ActiveTurn> = turns.iter().map(|t| t.view()).collect();
        v.sort_by(|a, b| {
            a.started_at
                .cmp(&b.started_at)
                .then_with(|| a.turn_id.cmp(&b.turn_id))
        });
        v
    }

    /// How a session's calls are doing; `None` for an unknown session.
    pub fn session_status(&self, session_id: &SessionId) -> Option<SessionStatus> {
        let session = self.inner.sessions.lock().get(session_id).cloned()?;
        let running = self
            .active_turns()
            .into_iter()
            .filter(|t| &t.session_id == session_id)
            .flat_map(|t| {
                let turn_id = t.turn_id.clone();
                t.calls
                    .into_iter()
                    .filter(|c| c.state != CallState::Done)
                    .map(move |call| RunningCall {
                        turn_id: turn_id.clone(),
                        call,
                    })
            })
            .collect();
        let h = session.history.lock();
        Some(SessionStatus {
            session_id: session_id.clone(),
            running,
            counts: h
                .counts
                .iter()
                .map(|(k, v)| ((*k).to_owned(), *v))
                .collect(),
            timed_out_tools: h.timed_out.clone(),
            recent_failures: h.recent_failures.iter().cloned().collect(),
            open_breakers: self.open_breakers(),
        })
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
            })
            .collect()
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
        self.inner.servers.lock().clone()
    }

    /// A live view of every event.
    pub fn subscribe(&self) -> Subscription {
        self.inner.bus.subscribe()
    }

    /// The event bus (to add durable sinks).
    pub fn events(&self) -> &Arc<EventBus> {
        &self.inner.bus
    }

    /// The Prometheus text of every metric, as of now: gauges that follow the clock (a breaker
    /// whose `open_for` has passed reads half-open) are brought up to date first.
    pub fn metrics_text(&self) -> String {
        let now = Instant::now();
        for e in self.inner.registry.list() {
            e.runtime.metrics.breaker(e.runtime.breaker.state(now).0);
        }
        crate::store::refresh_metrics(&self.inner);
        self.inner.metrics.encode()
    }

    /// The metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// The interaction broker.
    pub fn interactions(&self) -> &Interactions {
        &self.inner.interactions
    }

    /// Shuts down: every running call ends `cancelled{shutdown}` at once; then waits up to `wait`
    /// for their backends to stop (cooperatively or by force). Returns whether everything stopped.
    pub async fn shutdown(&self, wait: Duration) -> bool {
        self.inner.root.cancel(CancelReason::Shutdown);
        self.inner.tracker.close();
        tokio::time::timeout(wait, self.inner.tracker.wait())
            .await
            .is_ok()
    }
}

impl EngineInner {
    /// Builds a registry entry: resolves the policy, compiles the schema.
    fn entry(
        &self,
        name: String,
        spec: ToolSpec,
        backend: Arc<dyn Backend>,
        origin: ToolOrigin,
    ) -> ToolEntry {
        let policy = self
            .policies
            .read()
            .policy(&name, &spec.name, &origin, &spec.annotations);
        let validator = match jsonschema::validator_for(&spec.input_schema) {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::warn!(tool = %name, error = %e, "input schema does not compile; inputs will not be validated");
                None
            }
        };
        let name: Arc<str> = name.into();
        let runtime: Arc<ToolRuntime> = self.registry.runtime(&name, &self.metrics);
        let backend_tool: Arc<str> = spec.name.as_str().into();
        ToolEntry {
            name,
            spec,
            backend,
            backend_tool,
            origin,
            policy,
            validator,
            runtime,
        }
    }

    fn session(&self, id: SessionId) -> Arc<Session> {
        let mut sessions = self.sessions.lock();
        if let Some(s) = sessions.get(&id) {
            return s.clone();
        }
        if sessions.len() >= SESSION_SWEEP_AT {
            let cutoff = Instant::now().checked_sub(SESSION_IDLE_EVICT);
            if let Some(cutoff) = cutoff {
                sessions.retain(|_, s| !s.is_idle_since(cutoff));
            }
        }
        let s = Arc::new(Session::new(
            id.clone(),
            self.root.child(ScopeKind::Session),
        ));
        sessions.insert(id, s.clone());
        s
    }

    /// Validates a turn request and registers the turn; the calls are ready to run.
    pub(crate) fn prepare(
        &self,
        req: TurnRequest,
    ) -> Result<(Arc<TurnState>, Vec<CallJob>), TurnError> {
        if req.calls.is_empty() {
            return Err(TurnError::Empty);
        }
        for (i, call) in req.calls.iter().enumerate() {
            if call.id.as_str().is_empty() {
                return Err(TurnError::EmptyCallId(i));
            }
            if req.calls[..i].iter().any(|c| c.id == call.id) {
                return Err(TurnError::DuplicateCallId(call.id.clone()));
            }
        }
        let parent = req
            .parent_turn_id
            .as_ref()
            .and_then(|p| self.turns.lock().get(p).cloned());
        let named = req
            .session_id
            .or_else(|| parent.as_ref().map(|p| p.session.id.clone()));
        // A turn that names no session gets one of its own, forgotten when the turn ends: nobody
        // can refer to it again, so nothing should pile up.
        let ephemeral = named.is_none();
        let session_id = named.unwrap_or_else(|| SessionId::new(new_id("s_")));
        let session = self.session(session_id);
        if ephemeral {
            session
                .ephemeral
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let scope = match &parent {
            Some(p) => p.scope.child(ScopeKind::Turn),
            None => session.scope.child(ScopeKind::Turn),
        };
        // The turn's start: its monotonic instant (its calls' arrival) and the wall-clock time
        // of it, which also dates the turn's id.
        let started = Instant::now();
        let started_at = self.bus.stamp(started);
        let turn_id = req
            .turn_id
            .unwrap_or_else(|| TurnId::new(new_id_at("t_", started_at)));
        // Kept only for a renderer, which reads each call beside its result.
        let kept_calls = if req.render.is_some() {
            req.calls.clone()
        } else {
            Vec::new()
        };
        let single = req.calls.len() == 1;
        let mut slots = Vec::with_capacity(req.calls.len());
        let mut jobs = Vec::with_capacity(req.calls.len());
        for (index, call) in req.calls.into_iter().enumerate() {
            let entry = self.registry.get(&call.name);
            // Places in the session's line are taken in call order, before anything runs.
            let ticket = entry.as_ref().map(|e| {
                session
                    .gate
                    .reserve(e.policy.concurrency == Concurrency::Exclusive)
            });
            let slot = Arc::new(CallSlot {
                index,
                call_id: call.id.clone(),
                tool: entry
                    .as_ref()
                    .map_or_else(|| call.name.as_str().into(), |e| e.name.clone()),
                // A one-call turn's call shares the turn's scope: aborting either is the same.
                scope: if single {
                    scope.clone()
                } else {
                    scope.child(ScopeKind::Call)
                },
                view: Mutex::new(SlotView {
                    state: CallState::Queued,
                    started: None,
                    attempt: 0,
                    progress: None,
                    status: None,
                }),
                result: Mutex::new(None),
            });
            slots.push(slot.clone());
            jobs.push(CallJob {
                slot,
                call,
                entry,
                ticket,
            });
        }
        let turn = Arc::new(TurnState {
            id: turn_id.clone(),
            session: session.clone(),
            parent: req.parent_turn_id,
            scope,
            started_at,
            started,
            scope_ids: Arc::new(crate::events::EventScope {
                session_id: Some(session.id.clone()),
                turn_id: Some(turn_id.clone()),
                call_id: None,
                tool: None,
            }),
            slots,
            calls: kept_calls,
            finalized: std::sync::atomic::AtomicBool::new(false),
            render: req.render,
            progress: req.progress,
            stream: Mutex::new(None),
            streaming: std::sync::atomic::AtomicBool::new(false),
        });
        {
            let mut turns = self.turns.lock();
            if turns.contains_key(&turn_id) {
                return Err(TurnError::DuplicateTurnId(turn_id));
            }
            turns.insert(turn_id, turn.clone());
        }
        turn.emit_start(self);
        session.turn_started();
        Ok((turn, jobs))
    }

    pub(crate) fn unregister_turn(&self, turn: &TurnState, now: Instant) {
        if self.turns.lock().remove(&turn.id).is_some() {
            turn.session.turn_ended(now);
            let session = &turn.session;
            if session.ephemeral.load(std::sync::atomic::Ordering::Relaxed)
                && session
                    .active_turns
                    .load(std::sync::atomic::Ordering::Relaxed)
                    == 0
            {
                self.sessions.lock().remove(&session.id);
            }
        }
    }

    pub(crate) fn abort_turn(
        &self,
        turn_id: &TurnId,
        reason: CancelReason,
    ) -> Result<(), NotFound> {
        let turn = self
            .turns
            .lock()
            .get(turn_id)
            .cloned()
            .ok_or_else(|| NotFound(format!("turn {turn_id}")))?;
        if turn.scope.cancel(reason) {
            self.bus
                .emit(turn.event_scope(), EventKind::TurnAbort { reason });
        }
        Ok(())
    }

    pub(crate) fn breaker_changed(
        &self,
        runtime: &ToolRuntime,
        scope: &Arc<EventScope>,
        state: BreakerStateKind,
    ) {
        runtime.metrics.breaker(state);
        self.bus.emit(scope, EventKind::BreakerState { state });
    }

    /// The result of a call whose pipeline recorded nothing (cannot happen; kept total).
    pub(crate) fn synthetic_result(&self, turn: &TurnState, index: usize) -> CallResult {
        let (call_id, tool) = turn.slots.get(index).map_or_else(
            || (CallId::from(""), Arc::<str>::from("")),
            |s| (s.call_id.clone(), s.tool.clone()),
        );
        let status = Status::Cancelled {
            reason: CancelReason::NotStarted,
        };
        CallResult {
            content: vec![Content::text(outcome_text(&tool, &status, None))],
            outcome: Outcome {
                status,
                attempts: 0,
                call_id,
                turn_id: turn.id.clone(),
                tool,
                duration_ms: 0,
                provenance: None,
                detail: None,
                repeat_count: None,
            },
            structured_content: None,
            is_error: true,
        }
    }

    fn orphan_result(&self) -> CallResult {
        self.refused_result(TurnError::Empty)
    }

    fn refused_result(&self, e: TurnError) -> CallResult {
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
}

/// `PREFIX` followed by a fresh ULID, built in place (ids are made on every turn).
fn new_id(prefix: &str) -> Arc<str> {
    new_id_at(prefix, toolwarden_protocol::Timestamp::now())
}

/// `PREFIX` followed by a fresh ULID of time `at`.
fn new_id_at(prefix: &str, at: toolwarden_protocol::Timestamp) -> Arc<str> {
    let mut buf = [0u8; 32];
    let n = prefix.len().min(6);
    buf[..n].copy_from_slice(&prefix.as_bytes()[..n]);
    let mut ulid = [0u8; ulid::ULID_LEN];
    let ms = u64::try_from(at.unix_millis()).unwrap_or(0);
    let text = ulid::Ulid::from_parts(ms, id_random()).array_to_str(&mut ulid);
    buf[n..n + ulid::ULID_LEN].copy_from_slice(text.as_bytes());
    // Both parts are ASCII.
    Arc::from(std::str::from_utf8(&buf[..n + ulid::ULID_LEN]).unwrap_or("t_"))
}

/// The random part of a ULID: a random 79-bit number drawn once per process, plus one per id
/// (which keeps it within ULID's 80 bits). Ids of one process never collide and stay in order
/// within a millisecond (as ULID's monotonic generators make them), without drawing 16 random
/// bytes per turn.
fn id_random() -> u128 {
    static BASE: std::sync::OnceLock<u128> = std::sync::OnceLock::new();
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let base = *BASE.get_or_init(|| rand::random::<u128>() & ((1u128 << 79) - 1));
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    base + u128::from(n)
}

/// What MCP server backends report to.
struct Host {
    engine: std::sync::Weak<EngineInner>,
    prefix: bool,
}

impl BackendHost for Host {
    fn set_tools(&self, server: &str, backend: Arc<dyn Backend>, tools: Vec<ToolSpec>) {
        let Some(engine) = self.engine.upgrade() else {
            return;
        };
        let origin = ToolOrigin::Server(server.to_owned());
        let entries = tools
            .into_iter()
            .map(|spec| {
                let name = if self.prefix {
                    format!("{server}{PREFIX_SEPARATOR}{}", spec.name)
                } else {
                    spec.name.clone()
                };
                engine.entry(name, spec, backend.clone(), origin.clone())
            })
            .collect();
        engine.registry.replace(&origin, entries);
    }

    fn server_state(&self, server: &str, state: ServerStateKind, detail: Option<String>) {
        let Some(engine) = self.engine.upgrade() else {
            return;
        };
        engine
            .metrics
            .set_server_up(server, state == ServerStateKind::Up);
        engine.servers.lock().insert(
            server.to_owned(),
            ServerStatus {
                state,
                detail: detail.clone(),
            },
        );
        engine.bus.emit(
            &Arc::new(EventScope::default()),
            EventKind::ServerState {
                server: server.to_owned(),
                state,
                detail,
            },
        );
    }

    fn set_abandoned(&self, server: &str, count: u64) {
        if let Some(engine) = self.engine.upgrade() {
            engine.metrics.set_abandoned(server, count);
        }
    }

    fn late_result(&self, meta: &AttemptMeta, tool: &str, is_error: bool, after: Duration) {
        let Some(engine) = self.engine.upgrade() else {
            return;
        };
        let scope = Arc::new(EventScope {
            session_id: Some(meta.session_id.clone()),
            turn_id: Some(meta.turn_id.clone()),
            call_id: Some(meta.call_id.clone()),
            tool: Some(tool.into()),
        });
        engine.bus.emit(
            &scope,
            EventKind::ToolLateResult {
                is_error,
                after_ms: after.as_millis() as u64,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inproc::ToolError;

    #[test]
    fn ids_of_one_millisecond_are_distinct_ulids_in_order() {
        let at = toolwarden_protocol::Timestamp::from_unix_millis(1_795_000_000_000);
        let ids: Vec<Arc<str>> = (0..1000).map(|_| new_id_at("t_", at)).collect();
        for pair in ids.windows(2) {
            assert!(pair[0] < pair[1], "{} then {}", pair[0], pair[1]);
        }
        let ulid = ulid::Ulid::from_string(&ids[0][2..]).expect("a ULID after the prefix");
        assert_eq!(ulid.timestamp_ms(), 1_795_000_000_000);
    }

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
