//! The seam between the engine and the things that run tools.
//!
//! A [`Backend`] runs one *attempt* of a call. The engine owns every timing rule; the backend owns
//! how its work is stopped. The contract of stopping, in two steps:
//!
//! 1. **Cooperative.** When the call is cancelled or times out, the engine fires
//!    [`StopSignals::cancelled`] and hands the caller its outcome at once. The backend asks its
//!    work to stop (MCP: `notifications/cancelled` for that request; exec: SIGTERM to the process
//!    group; in-process: the tool's context says so) and, when the work has stopped, ends the
//!    attempt with [`AttemptEnd::Stopped`]`(`[`StopHow::Cooperative`]`)`.
//! 2. **Forced.** If the attempt has not ended after `cancel_grace`, the engine fires
//!    [`StopSignals::forced`]. The backend must then end the attempt promptly, saying how:
//!    `Killed` (process group SIGKILLed, task aborted), `Restarted` (server restarted) or
//!    `Abandoned` (it cannot be forced: it keeps counting the work as abandoned itself).
//!
//! The engine emits `tool_stopped` with that `how`. An answer that arrives after the outcome was
//! decided is recorded as late and discarded; it counts as a cooperative stop within
//! `cancel_grace`, and as `abandoned` past it (the backend ignored the cancel and kept working).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::Notify;
use tokio::time::Instant;
use toolwarden_protocol::{
    CallId, CancelReason, Content, OnStuck, ProgressInfo, ServerStateKind, SessionId, StopHow,
    ToolSpec, TraceParent, TurnId,
};

/// A boxed, sendable future (what backends return).
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Something that runs tools: an MCP server, the exec tool, in-process functions.
pub trait Backend: Send + Sync + 'static {
    /// A short name for logs and metrics (the server's name, `exec`, `inprocess`).
    fn name(&self) -> &str;

    /// Starts one attempt. Must return at once; the returned future does the work and resolves
    /// when the attempt ends, following the stop contract of this module.
    fn start(&self, attempt: Attempt) -> BoxFuture<AttemptEnd>;
}

/// Everything a backend needs to run one attempt.
pub struct Attempt {
    /// The tool's name within the backend (without any `SERVER__` prefix).
    pub tool: Arc<str>,
    /// The validated input.
    pub input: Arc<Value>,
    /// Who is calling.
    pub meta: AttemptMeta,
    /// Cooperative and forced stop requests.
    pub stop: StopSignals,
    /// Report liveness and progress here; it feeds the idle deadline and `tool_progress`.
    pub heartbeat: Heartbeat,
    /// What an MCP stdio backend does when the work ignores a cancel past `cancel_grace`.
    pub on_stuck: OnStuck,
    /// When the whole call's total deadline falls, if it has one (a backend may pass it on,
    /// e.g. as a request timeout; the engine enforces it regardless).
    pub deadline: Option<Instant>,
}

/// Identifies the call an attempt belongs to.
#[derive(Clone, Debug)]
pub struct AttemptMeta {
    /// Who made the call's turn.
    pub principal: Arc<str>,
    /// The session (the principal's own).
    pub session_id: SessionId,
    /// The turn.
    pub turn_id: TurnId,
    /// The call.
    pub call_id: CallId,
    /// 1 for the first attempt, 2 for the first retry, ...
    pub attempt: u32,
    /// The trace context to pass on to the server (MCP: `_meta.traceparent`): the attempt's own
    /// span when spans are exported, else the client's context as it came, if any.
    pub traceparent: Option<TraceParent>,
}

/// How an attempt ended.
#[derive(Debug)]
pub enum AttemptEnd {
    /// The backend answered. If a stop had been requested, the answer is late and discarded.
    Done(Result<ToolOutput, AttemptError>),
    /// The backend stopped the work because a stop was requested, and says how.
    Stopped(StopHow),
}

/// A tool's own answer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ToolOutput {
    /// Content blocks, in MCP's shape.
    pub content: Vec<Content>,
    /// Structured content, if the tool returned one.
    pub structured_content: Option<Value>,
    /// The tool reported an error itself (`isError`, non-zero exit).
    pub is_error: bool,
}

impl ToolOutput {
    /// A successful text result.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            content: vec![Content::text(text)],
            structured_content: None,
            is_error: false,
        }
    }

    /// A tool-reported error with a text message.
    pub fn error(text: impl Into<String>) -> Self {
        Self {
            content: vec![Content::text(text)],
            structured_content: None,
            is_error: true,
        }
    }
}

/// An attempt failed without an answer from the tool. Each variant is classified by type: the
/// first three are infrastructure failures (retryable for idempotent tools, counted by breakers).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttemptError {
    /// The connection to the backend failed (broken pipe, HTTP error, malformed frame).
    #[error("transport error: {0}")]
    Transport(String),
    /// The backend process crashed or closed its pipe while the attempt ran.
    #[error("server crashed: {0}")]
    Crashed(String),
    /// The backend was restarted (to stop another, stuck call) while the attempt ran.
    #[error("server restarted: {0}")]
    ServerRestart(String),
    /// The backend refused the request itself (a JSON-RPC error such as invalid params); treated
    /// like the tool's own error: not retried, not counted by the breaker.
    #[error("{0}")]
    Rejected(String),
    /// The backend cannot serve at all, and retrying will not change that soon: an MCP server
    /// that cannot start (its command cannot run, it exits before its handshake). The call ends
    /// `error{transport}` at once: not retried, not counted by the breaker (its text says why).
    #[error("unavailable: {0}")]
    Unavailable(String),
}

/// The two stop requests of one attempt. Cheap to clone.
#[derive(Clone, Debug)]
pub struct StopSignals {
    inner: Arc<AttemptShared>,
}

/// What an attempt's stop signals and heartbeat share: one allocation for both.
struct AttemptShared {
    stop: StopInner,
    beat: HeartbeatShared,
}

impl std::fmt::Debug for AttemptShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttemptShared")
            .field("stop", &self.stop)
            .finish_non_exhaustive()
    }
}

impl AttemptShared {
    fn new(relay: Option<ProgressRelay>, epoch: Instant) -> Arc<Self> {
        Arc::new(Self {
            stop: StopInner {
                cancelled: AtomicBool::new(false),
                cancel_notify: Notify::new(),
                forced: AtomicBool::new(false),
                force_notify: Notify::new(),
                reason: Mutex::new(None),
            },
            beat: HeartbeatShared {
                epoch,
                last_beat: AtomicU64::new(0),
                latest: Mutex::new(None),
                notify: Notify::new(),
                closed: AtomicBool::new(false),
                relay,
            },
        })
    }
}

/// The stop signals and the heartbeat of one attempt that starts at `epoch` (one allocation).
pub fn attempt_signals(relay: Option<ProgressRelay>, epoch: Instant) -> (StopSignals, Heartbeat) {
    let shared = AttemptShared::new(relay, epoch);
    (
        StopSignals {
            inner: shared.clone(),
        },
        Heartbeat { shared },
    )
}

#[derive(Debug)]
struct StopInner {
    cancelled: AtomicBool,
    cancel_notify: Notify,
    forced: AtomicBool,
    force_notify: Notify,
    reason: Mutex<Option<CancelReason>>,
}

/// Waits until `flag` is set, with no lost wake-up between the check and the wait.
async fn wait_flag(flag: &AtomicBool, notify: &Notify) {
    loop {
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if flag.load(Ordering::Acquire) {
            return;
        }
        notified.await;
    }
}

impl Default for StopSignals {
    fn default() -> Self {
        Self::new()
    }
}

impl StopSignals {
    /// Signals for one attempt: nothing requested yet.
    pub fn new() -> Self {
        Self {
            inner: AttemptShared::new(None, Instant::now()),
        }
    }

    /// Resolves when the work should stop (cooperatively).
    pub async fn cancelled(&self) {
        wait_flag(&self.inner.stop.cancelled, &self.inner.stop.cancel_notify).await
    }

    /// Whether a cooperative stop was requested.
    pub fn is_cancelled(&self) -> bool {
        self.inner.stop.cancelled.load(Ordering::Acquire)
    }

    /// Resolves when the work must stop now.
    pub async fn forced(&self) {
        wait_flag(&self.inner.stop.forced, &self.inner.stop.force_notify).await
    }

    /// Whether the stop is being forced.
    pub fn is_forced(&self) -> bool {
        self.inner.stop.forced.load(Ordering::Acquire)
    }

    /// Why the stop was requested, once known (`timeout`, `user`, ...).
    pub fn reason(&self) -> Option<CancelReason> {
        *self.inner.stop.reason.lock()
    }

    /// Requests a cooperative stop (engine side). The first reason given is kept.
    pub fn request_stop(&self, reason: CancelReason) {
        self.inner.stop.reason.lock().get_or_insert(reason);
        self.inner.stop.cancelled.store(true, Ordering::Release);
        self.inner.stop.cancel_notify.notify_waiters();
    }

    /// Forces the stop (engine side).
    pub fn force(&self) {
        self.inner.stop.forced.store(true, Ordering::Release);
        self.inner.stop.force_notify.notify_waiters();
    }
}

struct HeartbeatShared {
    epoch: Instant,
    /// Nanoseconds since `epoch` of the last beat.
    last_beat: AtomicU64,
    latest: Mutex<Option<ProgressInfo>>,
    notify: Notify,
    closed: AtomicBool,
    relay: Option<ProgressRelay>,
}

/// Receives every progress report of a call as it happens (the MCP gateway relays them to its
/// client under the client's own progress token).
pub type ProgressRelay = Arc<dyn Fn(&ProgressInfo) + Send + Sync>;

/// A call's liveness line. Each [`beat`](Heartbeat::beat) or [`progress`](Heartbeat::progress)
/// pushes the idle deadline forward; progress also becomes `tool_progress` events. Once the call
/// has its outcome the heartbeat is closed and late reports are dropped.
#[derive(Clone)]
pub struct Heartbeat {
    shared: Arc<AttemptShared>,
}

impl std::fmt::Debug for Heartbeat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Heartbeat")
            .field("last_beat", &self.last_beat())
            .finish()
    }
}

impl Heartbeat {
    /// A heartbeat whose clock starts now.
    pub fn new(relay: Option<ProgressRelay>) -> Self {
        Self {
            shared: AttemptShared::new(relay, Instant::now()),
        }
    }

    /// The work is alive (e.g. a command wrote output).
    pub fn beat(&self) {
        if self.shared.beat.closed.load(Ordering::Relaxed) {
            return;
        }
        let nanos = self
            .shared
            .beat
            .epoch
            .elapsed()
            .as_nanos()
            .min(u64::MAX as u128) as u64;
        self.shared
            .beat
            .last_beat
            .fetch_max(nanos, Ordering::Relaxed);
    }

    /// The work reported progress: a beat, relayed, and turned into a `tool_progress` event.
    pub fn progress(&self, info: ProgressInfo) {
        if self.shared.beat.closed.load(Ordering::Relaxed) {
            return;
        }
        self.beat();
        if let Some(relay) = &self.shared.beat.relay {
            relay(&info);
        }
        *self.shared.beat.latest.lock() = Some(info);
        self.shared.beat.notify.notify_one();
    }

    /// When the last beat happened (the start, if none yet).
    pub fn last_beat(&self) -> Instant {
        self.shared.beat.epoch
            + Duration::from_nanos(self.shared.beat.last_beat.load(Ordering::Relaxed))
    }

    /// Takes the latest progress report not yet taken.
    pub fn take_progress(&self) -> Option<ProgressInfo> {
        self.shared.beat.latest.lock().take()
    }

    /// Resolves when a progress report arrives.
    pub async fn progressed(&self) {
        self.shared.beat.notify.notified().await
    }

    /// Drops every later report: the call has its outcome.
    pub fn close(&self) {
        self.shared.beat.closed.store(true, Ordering::Relaxed);
    }

    /// Whether the call has its outcome.
    pub fn is_closed(&self) -> bool {
        self.shared.beat.closed.load(Ordering::Relaxed)
    }
}

/// What backends that manage servers tell the engine: their tools and their state.
pub trait BackendHost: Send + Sync + 'static {
    /// A server that is about to start for the first time. Until it is up, a call for one of its
    /// tools (`SERVER__TOOL`, or any name when tools are not prefixed) waits for it — at most
    /// `startup_timeout` (`None`: no cap but the call's own deadline) — instead of failing
    /// because the tool is not listed yet.
    fn server_declared(&self, server: &str, startup_timeout: Option<Duration>) {
        let _ = (server, startup_timeout);
    }

    /// The server `server` now offers `tools` (at start and on `tools/list_changed`); calls to
    /// `SERVER__TOOL` go to `backend`. Replaces the server's earlier list.
    fn set_tools(&self, server: &str, backend: Arc<dyn Backend>, tools: Vec<ToolSpec>);

    /// The server changed state (emits `server_state`, updates `toolwarden_server_up`).
    fn server_state(&self, server: &str, state: ServerStateKind, detail: Option<String>);

    /// The protocol revision the server was reached in at its last start (`2025-11-25`,
    /// `2026-07-28`, ...), reported before its `up`.
    fn server_protocol(&self, server: &str, protocol: &str) {
        let _ = (server, protocol);
    }

    /// How many calls of `server` are abandoned right now (`toolwarden_abandoned_calls`).
    fn set_abandoned(&self, server: &str, count: u64);

    /// A stopped attempt's answer arrived `after` its stop was requested, and was discarded.
    fn late_result(&self, meta: &AttemptMeta, tool: &str, is_error: bool, after: Duration);
}
