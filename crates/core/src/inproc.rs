//! In-process tools: Rust functions governed like any other tool.
//!
//! An async tool runs on the caller's task; it should watch [`ToolContext::cancelled`] and return
//! early — that is a cooperative stop. If it has not returned `cancel_grace` after a cancel, its
//! future is dropped (`killed`). A blocking tool runs on a bounded pool of threads; a thread cannot
//! be killed, so one that outlives its forced stop is counted as **abandoned** (in
//! `toolwarden_abandoned_calls{server="inprocess"}`) until it returns, and never waited for.

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::RwLock;
use serde_json::Value;
use tokio::sync::Semaphore;
use toolwarden_protocol::{
    Approval, BreakerConfig, Concurrency, Content, DurationValue, LoopConfig, PolicyConfig,
    ProgressInfo, StopHow, ToolAnnotations, ToolSpec,
};

use crate::backend::{
    Attempt, AttemptEnd, AttemptError, AttemptMeta, Backend, BoxFuture, Heartbeat, StopSignals,
    ToolOutput,
};
use crate::metrics::Metrics;

/// The name in-process tools report as their backend.
pub const INPROCESS: &str = "inprocess";

/// A tool's own failure: becomes an `error{tool_error}` result with this message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ToolError {
    message: String,
}

impl ToolError {
    /// A failure with a message for the model.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }
}

impl From<String> for ToolError {
    fn from(message: String) -> Self {
        Self { message }
    }
}

impl From<&str> for ToolError {
    fn from(message: &str) -> Self {
        Self {
            message: message.to_owned(),
        }
    }
}

impl From<std::io::Error> for ToolError {
    fn from(e: std::io::Error) -> Self {
        Self {
            message: e.to_string(),
        }
    }
}

impl From<serde_json::Error> for ToolError {
    fn from(e: serde_json::Error) -> Self {
        Self {
            message: e.to_string(),
        }
    }
}

/// What a tool function may return.
pub trait IntoToolOutput {
    /// Converts into a tool's answer.
    fn into_tool_output(self) -> ToolOutput;
}

impl IntoToolOutput for ToolOutput {
    fn into_tool_output(self) -> ToolOutput {
        self
    }
}

impl IntoToolOutput for String {
    fn into_tool_output(self) -> ToolOutput {
        ToolOutput::text(self)
    }
}

impl IntoToolOutput for &'static str {
    fn into_tool_output(self) -> ToolOutput {
        ToolOutput::text(self)
    }
}

impl IntoToolOutput for () {
    fn into_tool_output(self) -> ToolOutput {
        ToolOutput {
            content: Vec::new(),
            structured_content: None,
            is_error: false,
        }
    }
}

/// JSON: an object becomes structured content (and its text form); anything else, text.
impl IntoToolOutput for Value {
    fn into_tool_output(self) -> ToolOutput {
        match self {
            Value::String(s) => ToolOutput::text(s),
            Value::Object(_) => ToolOutput {
                content: vec![Content::text(json_text(&self))],
                structured_content: Some(self),
                is_error: false,
            },
            other => ToolOutput::text(json_text(&other)),
        }
    }
}

/// A value's compact JSON text, written into one buffer sized up front (`Display` grows a string
/// from nothing, reallocating as it goes).
fn json_text(value: &Value) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| value.to_string())
}

/// What a running in-process tool can see and do.
#[derive(Clone, Debug)]
pub struct ToolContext {
    heartbeat: Heartbeat,
    stop: StopSignals,
    meta: AttemptMeta,
}

impl ToolContext {
    /// Says the tool is alive (pushes the idle deadline forward).
    pub fn heartbeat(&self) {
        self.heartbeat.beat();
    }

    /// Reports progress (also a heartbeat).
    pub fn progress(&self, progress: f64, total: Option<f64>, message: Option<&str>) {
        self.heartbeat.progress(ProgressInfo {
            progress: Some(progress),
            total,
            message: message.map(str::to_owned),
        });
    }

    /// Whether the call was cancelled (or timed out): stop and return.
    pub fn is_cancelled(&self) -> bool {
        self.stop.is_cancelled()
    }

    /// Resolves when the call is cancelled (or times out).
    pub async fn cancelled(&self) {
        self.stop.cancelled().await
    }

    /// Which call this is.
    pub fn meta(&self) -> &AttemptMeta {
        &self.meta
    }
}

/// Starts an async tool's attempt: its future wrapped in an [`AsyncAttempt`], in one allocation.
type AsyncFn = Arc<dyn Fn(Value, ToolContext) -> BoxFuture<AttemptEnd> + Send + Sync>;
type BlockingFn = Arc<dyn Fn(Value, ToolContext) -> Result<ToolOutput, ToolError> + Send + Sync>;

#[derive(Clone)]
pub(crate) enum ToolFn {
    Async(AsyncFn),
    Blocking(BlockingFn),
}

/// An in-process tool to register: a name, a JSON schema, a policy and a function.
pub struct InProcessTool {
    spec: ToolSpec,
    layer: PolicyConfig,
    handler: ToolFn,
}

impl std::fmt::Debug for InProcessTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcessTool")
            .field("spec", &self.spec)
            .field("policy", &self.layer)
            .finish_non_exhaustive()
    }
}

fn dv(d: Duration) -> Option<DurationValue> {
    Some(DurationValue::from_duration(d))
}

/// Builder methods that each set one key of the tool's policy layer:
/// `name(args) => key = value;` is `pub fn name(mut self, args) -> Self`.
macro_rules! policy_setters {
    ($($(#[$doc:meta])* $name:ident($($arg:ident: $ty:ty),+) => $key:ident = $value:expr;)*) => {
        $(
            $(#[$doc])*
            pub fn $name(mut self, $($arg: $ty),+) -> Self {
                self.layer.$key = $value;
                self
            }
        )*
    };
}

impl InProcessTool {
    /// A tool with the default policy layer, run by `handler`.
    fn with_handler(spec: ToolSpec, handler: ToolFn) -> Self {
        Self {
            spec,
            layer: PolicyConfig::default(),
            handler,
        }
    }

    /// An async tool.
    pub fn new<F, Fut, T>(
        name: impl Into<String>,
        description: impl Into<String>,
        input_schema: Value,
        f: F,
    ) -> Self
    where
        F: Fn(Value, ToolContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, ToolError>> + Send + 'static,
        T: IntoToolOutput,
    {
        let f = Arc::new(f);
        let handler: AsyncFn = Arc::new(move |input, ctx: ToolContext| {
            let stop = ctx.stop.clone();
            Box::pin(AsyncAttempt {
                work: f(input, ctx),
                stop,
                forced: None,
            })
        });
        let spec = ToolSpec::new(name, description, input_schema);
        Self::with_handler(spec, ToolFn::Async(handler))
    }

    /// A blocking tool: runs on a bounded pool of threads.
    pub fn blocking<F, T>(
        name: impl Into<String>,
        description: impl Into<String>,
        input_schema: Value,
        f: F,
    ) -> Self
    where
        F: Fn(Value, ToolContext) -> Result<T, ToolError> + Send + Sync + 'static,
        T: IntoToolOutput,
    {
        let handler: BlockingFn =
            Arc::new(move |input, ctx| f(input, ctx).map(IntoToolOutput::into_tool_output));
        let spec = ToolSpec::new(name, description, input_schema);
        Self::with_handler(spec, ToolFn::Blocking(handler))
    }

    /// Behaviour hints (feed `idempotent` and `approval` unless set).
    pub fn annotations(mut self, annotations: ToolAnnotations) -> Self {
        self.spec.annotations = annotations;
        self
    }

    policy_setters! {
        /// Total wall-clock cap.
        timeout(d: Duration) => timeout = dv(d);
        /// Idle (heartbeat) cap.
        idle_timeout(d: Duration) => idle_timeout = dv(d);
        /// Per-attempt cap.
        attempt_timeout(d: Duration) => attempt_timeout = dv(d);
        /// Cooperative-stop window.
        cancel_grace(d: Duration) => cancel_grace = dv(d);
        /// Extra attempts after retryable failures (idempotent tools only).
        retries(n: u32) => retries = Some(i64::from(n));
        /// Retry the tool's own errors too (idempotent tools only; off by default, because a tool's
        /// error is usually an answer, not a fault).
        retry_on_tool_error(yes: bool) => retry_on_tool_error = Some(yes);
        /// May be retried and cached.
        idempotent(yes: bool) => idempotent = Some(yes);
        /// Keep `ok` results this long (idempotent tools only).
        cache_ttl(d: Duration) => cache_ttl = dv(d);
        /// Parallel or exclusive within the session.
        concurrency(c: Concurrency) => concurrency = Some(c);
        /// Approval mode.
        approval(a: Approval) => approval = Some(a);
        /// Circuit breaker: `failures` within `window` open it for `open_for`; `0` = off.
        breaker(failures: u32, window: Duration, open_for: Duration) => breaker = Some(BreakerConfig {
            failures: Some(i64::from(failures)),
            window: dv(window),
            open_for: dv(open_for),
        });
        /// Loop detector thresholds; `0` = off.
        loop_detection(warn_after: u32, block_after: u32) => loop_ = Some(LoopConfig {
            warn_after: Some(i64::from(warn_after)),
            block_after: Some(i64::from(block_after)),
        });
    }

    /// Any policy keys at once (the config file's `[tools."NAME"]` still wins).
    pub fn policy(mut self, layer: PolicyConfig) -> Self {
        self.layer = layer;
        self
    }

    pub(crate) fn into_parts(self) -> (ToolSpec, PolicyConfig, ToolFn) {
        (self.spec, self.layer, self.handler)
    }
}

/// The backend of every in-process tool.
pub(crate) struct InProcessBackend {
    handlers: RwLock<HashMap<String, ToolFn>>,
    pool: Arc<Semaphore>,
    abandoned: Arc<AtomicU64>,
    metrics: Arc<Metrics>,
}

impl InProcessBackend {
    pub(crate) fn new(threads: usize, metrics: Arc<Metrics>) -> Self {
        Self {
            handlers: RwLock::new(HashMap::new()),
            pool: Arc::new(Semaphore::new(threads)),
            abandoned: Arc::new(AtomicU64::new(0)),
            metrics,
        }
    }

    pub(crate) fn insert(&self, name: &str, handler: ToolFn) {
        self.handlers.write().insert(name.to_owned(), handler);
    }
}

/// A blocking run's fate, decided once: finished on its own or abandoned at a forced stop.
const RUNNING: u8 = 0;
const FINISHED: u8 = 1;
const ABANDONED: u8 = 2;

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_owned())
}

impl Backend for InProcessBackend {
    fn name(&self) -> &str {
        INPROCESS
    }

    fn start(&self, attempt: Attempt) -> BoxFuture<AttemptEnd> {
        let f = match self.handlers.read().get(&*attempt.tool).cloned() {
            Some(ToolFn::Async(f)) => return start_async(&f, attempt),
            Some(ToolFn::Blocking(f)) => f,
            None => {
                let end = AttemptEnd::Done(Err(AttemptError::Rejected(format!(
                    "no in-process tool named {:?}",
                    attempt.tool
                ))));
                return Box::pin(std::future::ready(end));
            }
        };
        let pool = self.pool.clone();
        let abandoned = self.abandoned.clone();
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let (stop, ctx, input) = tool_side(attempt);
            let permit = tokio::select! {
                biased;
                () = stop.cancelled() => return AttemptEnd::Stopped(StopHow::Cooperative),
                permit = pool.acquire_owned() => match permit {
                    Ok(p) => p,
                    Err(_) => return AttemptEnd::Done(Err(AttemptError::Transport("the blocking pool is closed".into()))),
                },
            };
            let fate = Arc::new(AtomicU8::new(RUNNING));
            let (tx, rx) = tokio::sync::oneshot::channel();
            let thread_fate = fate.clone();
            let thread_abandoned = abandoned.clone();
            let thread_metrics = metrics.clone();
            tokio::task::spawn_blocking(move || {
                let result = std::panic::catch_unwind(AssertUnwindSafe(|| f(input, ctx)));
                drop(permit);
                if thread_fate
                    .compare_exchange(RUNNING, FINISHED, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
                {
                    let left = thread_abandoned
                        .fetch_sub(1, Ordering::AcqRel)
                        .saturating_sub(1);
                    thread_metrics.set_abandoned(INPROCESS, left);
                }
                let _ = tx.send(result.map_err(|p| panic_message(&*p)));
            });
            tokio::select! {
                biased;
                result = rx => match result {
                    Ok(result) => finished(&stop, result),
                    Err(_) => AttemptEnd::Done(Err(AttemptError::Crashed("the tool's thread went away".into()))),
                },
                () = stop.forced() => {
                    if fate.compare_exchange(RUNNING, ABANDONED, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                        let now = abandoned.fetch_add(1, Ordering::AcqRel) + 1;
                        metrics.set_abandoned(INPROCESS, now);
                        AttemptEnd::Stopped(StopHow::Abandoned)
                    } else {
                        AttemptEnd::Stopped(StopHow::Cooperative)
                    }
                }
            }
        })
    }
}

/// What a tool function gets of an attempt — its context and its own copy of the input — and the
/// stop signals the engine keeps watching beside it.
fn tool_side(attempt: Attempt) -> (StopSignals, ToolContext, Value) {
    let ctx = ToolContext {
        heartbeat: attempt.heartbeat,
        stop: attempt.stop.clone(),
        meta: attempt.meta,
    };
    (attempt.stop, ctx, (*attempt.input).clone())
}

/// Starts an async tool (see [`AsyncAttempt`]).
fn start_async(f: &AsyncFn, attempt: Attempt) -> BoxFuture<AttemptEnd> {
    let (stop, ctx, input) = tool_side(attempt);
    // The function runs here, before its future does: a panic in either is the tool's crash.
    match std::panic::catch_unwind(AssertUnwindSafe(|| f(input, ctx))) {
        Ok(attempt) => attempt,
        Err(panic) => {
            let end = finished(&stop, Err(panic_message(&*panic)));
            Box::pin(std::future::ready(end))
        }
    }
}

pin_project_lite::pin_project! {
    /// A running async tool: its own future, polled first, and a forced stop, waited on only
    /// once the tool has not answered at once. Written out by hand rather than as an `async`
    /// block, so that the tool's future sits inside it and the attempt is one small allocation.
    struct AsyncAttempt<F> {
        #[pin]
        work: F,
        stop: StopSignals,
        // Made on the first poll the tool does not answer.
        forced: Option<BoxFuture<()>>,
    }
}

impl<F, T> Future for AsyncAttempt<F>
where
    F: Future<Output = Result<T, ToolError>>,
    T: IntoToolOutput,
{
    type Output = AttemptEnd;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<AttemptEnd> {
        use std::task::Poll;
        let this = self.project();
        let mut work = this.work;
        let polled = std::panic::catch_unwind(AssertUnwindSafe(|| {
            work.as_mut()
                .poll(cx)
                .map(|result| result.map(IntoToolOutput::into_tool_output))
        }));
        match polled {
            Ok(Poll::Ready(result)) => return Poll::Ready(finished(this.stop, Ok(result))),
            Err(panic) => {
                return Poll::Ready(finished(this.stop, Err(panic_message(&*panic))));
            }
            Ok(Poll::Pending) => {}
        }
        let stop = this.stop;
        let forced = this.forced.get_or_insert_with(|| {
            let stop = stop.clone();
            Box::pin(async move { stop.forced().await })
        });
        match forced.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(AttemptEnd::Stopped(StopHow::Killed)),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// A tool function returned: after a cancel that is its cooperative stop; otherwise its answer.
fn finished(
    stop: &StopSignals,
    result: Result<Result<ToolOutput, ToolError>, String>,
) -> AttemptEnd {
    if stop.is_cancelled() {
        return AttemptEnd::Stopped(StopHow::Cooperative);
    }
    match result {
        Ok(Ok(out)) => AttemptEnd::Done(Ok(out)),
        Ok(Err(e)) => AttemptEnd::Done(Ok(ToolOutput::error(e.to_string()))),
        Err(panic) => AttemptEnd::Done(Err(AttemptError::Crashed(format!(
            "the tool panicked: {panic}"
        )))),
    }
}
