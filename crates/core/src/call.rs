//! The pipeline of one call (SPEC §3.1), in this order: validate → loop detector → approval gate →
//! cache lookup with single flight (a stored result, or an identical running call's, is shared) →
//! breaker → concurrency gate → attempts (each under deadlines and cancellation) → classify →
//! record breaker → cache store → outcome. A call that must wait at the session's gate looks only
//! for a stored result before the breaker and joins single flight past the gate (a leader never
//! waits there). Every step that ends the call produces its outcome; nothing after it runs.
//!
//! Two guards make the pipeline safe to drop at any await (a client that disconnects drops it):
//! [`Finisher`] records the call's single outcome exactly once, and [`InFlight`] hands a running
//! attempt to a tracked stop task instead of dropping it, so the backend is still asked to stop,
//! then forced, and `tool_stopped` says how.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::time::{Instant, sleep, sleep_until};
use toolwarden_protocol::{
    Approval, CallId, CallResult, CallState, CancelReason, Content, Decider, DenyReason,
    ErrorReason, EventKind, InteractionAction, InteractionKind, InvalidReason, Outcome, Policy,
    ProgressInfo, Provenance, ProvenanceSource, Status, StopHow, TimeoutKind, ToolCall,
    format_duration,
};

use crate::backend::{
    Attempt, AttemptEnd, AttemptError, AttemptMeta, BoxFuture, Heartbeat, StopSignals, ToolOutput,
};
use crate::breaker::{Admission, Verdict};
use crate::cache::{self, CacheKey, CachedResult, Lookup};
use crate::canonical::{self, ValueRef};
use crate::config::apply_hints;
use crate::engine::EngineInner;
use crate::events::EventScope;
use crate::gate::Ticket;
use crate::interaction::{InteractionEnd, InteractionRequest};
use crate::loop_detect::LoopVerdict;
use crate::registry::{ToolEntry, ToolRuntime};
use crate::text::{human_size, loop_note, outcome_text};
use crate::turn::{CallSlot, TurnState};

/// How long a forced backend may take to report how it stopped before it is counted abandoned.
const FORCE_WAIT: Duration = Duration::from_secs(5);
/// At most this often a call's backend progress becomes a `tool_progress` event.
const PROGRESS_MIN_GAP: Duration = Duration::from_millis(250);
/// A running call emits `tool_progress` at least this often.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// One call of a turn, ready to run.
pub(crate) struct CallJob {
    pub(crate) slot: Arc<CallSlot>,
    pub(crate) call: ToolCall,
    pub(crate) entry: Option<Arc<ToolEntry>>,
    pub(crate) ticket: Option<Ticket>,
}

/// How the attempts of a call ended.
enum Final {
    Ok(ToolOutput),
    ToolError(ToolOutput),
    Rejected(String),
    Failed(ErrorReason, String),
    Timeout(TimeoutKind, Duration),
    Cancelled(CancelReason),
    // store: the audit trail could not commit `tool_start`; the backend was not invoked.
    Unrecorded(String),
}

impl Final {
    fn describe(&self) -> String {
        match self {
            Final::Ok(_) => "ok".into(),
            Final::ToolError(_) => "tool_error".into(),
            Final::Rejected(m) => format!("rejected: {m}"),
            Final::Failed(reason, m) => format!("{}: {m}", reason.as_str()),
            Final::Timeout(kind, limit) => format!(
                "{} timeout after {}",
                kind.as_str(),
                format_duration(*limit)
            ),
            Final::Cancelled(r) => format!("cancelled: {}", r.as_str()),
            Final::Unrecorded(m) => format!("unrecorded: {m}"),
        }
    }
}

/// Records a call's single outcome — also when the pipeline is dropped before it got there. It
/// borrows the call's engine, turn and slot from the pipeline, which outlives it.
struct Finisher<'a> {
    engine: &'a Arc<EngineInner>,
    turn: &'a Arc<TurnState>,
    slot: &'a Arc<CallSlot>,
    scope: Arc<EventScope>,
    /// When the call arrived (its turn's start).
    arrived: Instant,
    /// When its attempts ended, once they have: the moment its result is stamped with.
    ended: Option<Instant>,
    attempts: u32,
    invoked: bool,
    running: bool,
    repeat: Option<(u32, u32)>,
    runtime: Option<&'a Arc<ToolRuntime>>,
    done: bool,
}

impl Finisher<'_> {
    fn tool(&self) -> &str {
        self.slot.tool.as_ref()
    }

    fn call_id(&self) -> &CallId {
        &self.slot.call_id
    }

    /// Records the outcome: the call's result goes to its turn (and to the `tool_result` event,
    /// sharing one allocation).
    fn finish(
        &mut self,
        status: Status,
        detail: Option<String>,
        output: Option<ToolOutput>,
        provenance: Option<Provenance>,
    ) -> Arc<CallResult> {
        self.done = true;
        let is_error = status.is_error();
        let (mut content, structured_content) = match output {
            Some(out) if !out.content.is_empty() || out.structured_content.is_some() => {
                (out.content, out.structured_content)
            }
            _ => (
                vec![Content::text(outcome_text(
                    self.tool(),
                    &status,
                    detail.as_deref(),
                ))],
                None,
            ),
        };
        if let Some((count, block_after)) = self.repeat {
            content.push(Content::text(loop_note(self.tool(), count, block_after)));
        }
        let end = self.ended.unwrap_or_else(Instant::now);
        let elapsed = end.saturating_duration_since(self.arrived);
        let outcome = Outcome {
            status,
            attempts: self.attempts,
            call_id: self.call_id().clone(),
            turn_id: self.turn.id.clone(),
            tool: self.slot.tool.clone(),
            duration_ms: elapsed.as_millis() as u64,
            provenance,
            detail,
            repeat_count: self.repeat.map(|(c, _)| c),
        };
        let result = Arc::new(CallResult {
            outcome,
            content,
            structured_content,
            is_error,
        });
        if let Some(runtime) = &self.runtime {
            if self.running {
                runtime.metrics.in_flight(-1);
                self.running = false;
            }
            runtime
                .metrics
                .outcome(&result.outcome.status, elapsed.as_secs_f64());
        }
        {
            let mut view = self.slot.view.lock();
            view.state = CallState::Done;
            view.status = Some(result.outcome.status.name());
        }
        self.turn.session.record(&result.outcome);
        self.engine.bus.emit_at(
            &self.scope,
            end,
            EventKind::ToolResult {
                result: result.clone(),
                duration_ms: result.outcome.duration_ms,
            },
        );
        self.turn.complete(self.slot, result.clone(), end);
        result
    }

    fn fail(&mut self, status: Status, detail: Option<String>) {
        self.finish(status, detail, None, None);
    }

    fn deny(&mut self, decider: Decider, reason: DenyReason, detail: Option<String>) {
        self.engine
            .bus
            .emit(&self.scope, EventKind::ToolCallDenied { decider, reason });
        self.fail(Status::Denied { decider, reason }, detail)
    }

    /// Cancelled: `not_started` if the backend was never invoked, else the scope's reason.
    fn cancelled(&mut self) {
        let reason = if self.invoked {
            self.slot
                .scope
                .reason()
                .unwrap_or(CancelReason::ClientDisconnect)
        } else {
            CancelReason::NotStarted
        };
        self.fail(Status::Cancelled { reason }, None);
    }

    fn cache_hit(&mut self, hit: &CachedResult) {
        if let Some(runtime) = &self.runtime {
            runtime.metrics.cache_hit();
        }
        let Some(original) = hit.result.outcome.provenance.as_ref() else {
            // Only results with provenance are stored; be total anyway.
            return self.fail(
                Status::Error {
                    reason: ErrorReason::Transport,
                },
                Some("cache entry without provenance".into()),
            );
        };
        self.engine.bus.emit(
            &self.scope,
            EventKind::CacheHit {
                origin_call_id: hit.origin_call_id().clone(),
                fetched_at: original.fetched_at,
            },
        );
        let provenance = Provenance {
            source: ProvenanceSource::Cache,
            fetched_at: original.fetched_at,
            cache_hit: true,
            digest: original.digest,
            origin_call_id: Some(hit.origin_call_id().clone()),
        };
        let output = ToolOutput {
            content: hit.content().to_vec(),
            structured_content: hit.result.structured_content.clone(),
            is_error: false,
        };
        self.finish(Status::Ok, None, Some(output), Some(provenance));
    }
}

impl Drop for Finisher<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.cancelled();
        }
    }
}

/// A half-open probe hands its slot back if the call ends without a verdict.
struct ProbeGuard<'a> {
    runtime: &'a ToolRuntime,
    policy: &'a toolwarden_protocol::Breaker,
    admission: Admission,
    armed: bool,
}

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.runtime.breaker.record(
                self.policy,
                self.admission,
                Verdict::Neutral,
                Instant::now(),
            );
        }
    }
}

/// Runs one call through the whole pipeline. Always returns (and records) exactly one result.
///
/// The job is taken apart here, before the pipeline's future is made: taken apart inside it, the
/// future would keep the job and its parts side by side.
pub(crate) fn run_call(
    engine: Arc<EngineInner>,
    turn: Arc<TurnState>,
    job: CallJob,
) -> impl Future<Output = ()> {
    let CallJob {
        slot,
        call,
        entry,
        ticket,
    } = job;
    pipeline(engine, turn, slot, call, entry, ticket)
}

async fn pipeline(
    engine: Arc<EngineInner>,
    turn: Arc<TurnState>,
    slot: Arc<CallSlot>,
    call: ToolCall,
    entry: Option<Arc<ToolEntry>>,
    ticket: Option<Ticket>,
) {
    let scope = Arc::new(EventScope {
        session_id: Some(turn.session.id.clone()),
        turn_id: Some(turn.id.clone()),
        call_id: Some(slot.call_id.clone()),
        tool: Some(slot.tool.clone()),
    });
    let mut fin = Finisher {
        engine: &engine,
        turn: &turn,
        slot: &slot,
        scope,
        arrived: turn.started,
        ended: None,
        attempts: 0,
        invoked: false,
        running: false,
        repeat: None,
        runtime: entry.as_ref().map(|e| &e.runtime),
        done: false,
    };

    // Validate: a known tool, an input within size that matches its schema.
    let Some(entry) = entry.as_ref() else {
        let detail = engine.registry.suggest(&call.name);
        return fin.fail(
            Status::Invalid {
                reason: InvalidReason::UnknownTool,
            },
            detail,
        );
    };
    // The tool's policy, borrowed; one with the call's own deadline hints applied is made (and
    // boxed, to keep it out of every call's future) only for a call that gives hints.
    let hinted = (call.timeout_ms.is_some() || call.idle_timeout_ms.is_some()).then(|| {
        Box::new(apply_hints(
            &entry.policy,
            call.timeout_ms,
            call.idle_timeout_ms,
        ))
    });
    let policy: &Policy = hinted.as_deref().unwrap_or(&entry.policy);
    let input = match call.input {
        Value::Null => Value::Object(Default::default()),
        other => other,
    };
    let (input_len, call_digest) = canonical::measure_call(&entry.name, &input);
    if input_len as u64 > policy.max_input {
        let detail = format!(
            "It is {}; the limit is {}.",
            human_size(input_len as u64),
            human_size(policy.max_input)
        );
        return fin.fail(
            Status::Invalid {
                reason: InvalidReason::TooLarge,
            },
            Some(detail),
        );
    }
    if let Some(validator) = &entry.validator
        && !validator.is_valid(&input)
    {
        let errors: Vec<String> = validator
            .iter_errors(&input)
            .take(5)
            .map(|e| {
                let path = e.instance_path().as_str();
                format!("{}: {e}", if path.is_empty() { "(input)" } else { path })
            })
            .collect();
        return fin.fail(
            Status::Invalid {
                reason: InvalidReason::Schema,
            },
            Some(errors.join("; ")),
        );
    }

    // A call whose turn was aborted (or whose engine shut down) before it got going goes no
    // further: it does not count as a repeat and nobody is asked to approve it.
    if slot.scope.is_cancelled() {
        return fin.cancelled();
    }

    // Loop detector.
    match turn.session.loops.observe(&policy.loop_, &call_digest) {
        LoopVerdict::Block { count } => {
            return fin.deny(
                Decider::LoopDetector,
                DenyReason::Loop,
                Some(format!("{count} identical calls")),
            );
        }
        LoopVerdict::Warn { count } => fin.repeat = Some((count, policy.loop_.block_after)),
        LoopVerdict::Fine => {}
    }
    let input = Arc::new(input);
    // The time now: the arrival until a step below waits, read again after each wait.
    let mut now = fin.arrived;

    // Approval gate.
    match policy.approval {
        Approval::Auto => {}
        Approval::Deny => return fin.deny(Decider::Policy, DenyReason::Rule, None),
        Approval::Ask | Approval::Confirm => {
            if !Box::pin(approve(&engine, &mut fin, entry, policy, &input)).await {
                return;
            }
            now = Instant::now();
        }
    }

    // Cache lookup (a hit is served even when the breaker is open), and single flight: share the
    // execution of an identical call that is running, or lead one. A leader must never wait for
    // its place in the session, because the calls holding earlier places may be its followers,
    // waiting for it: a call that has to wait at the gate only looks for a hit here and takes its
    // part in single flight past the gate. Any other call does both now, in one step.
    let cache_key =
        (policy.idempotent && !policy.cache_ttl.is_zero()).then_some(CacheKey(call_digest));
    let gate_free = ticket.as_ref().is_none_or(Ticket::ready);
    let mut flight = None;
    if let Some(key) = &cache_key {
        if gate_free {
            match lead_or_follow(&engine, &mut fin, key, &mut now).await {
                Some(guard) => flight = Some(guard),
                None => return,
            }
        } else if let Some(hit) = engine.cache.hit(key, now) {
            return fin.cache_hit(&hit);
        }
    }

    // Breaker. (A leader turned away here drops its guard: its followers look again.)
    let runtime = &entry.runtime;
    // Microseconds after arrival: the arrival instant is good enough for the breaker's clock.
    let (admission, change) = runtime.breaker.admit(&policy.breaker, now);
    if let Some(state) = change {
        engine.breaker_changed(runtime, &fin.scope, state);
    }
    if let Admission::Rejected { retry_after } = admission {
        let retry_after_ms = retry_after.as_millis().max(1) as u64;
        return fin.fail(Status::CircuitOpen { retry_after_ms }, None);
    }
    let mut probe = ProbeGuard {
        runtime,
        policy: &policy.breaker,
        admission,
        armed: admission == Admission::Probe,
    };

    // Concurrency gate.
    if let Some(ticket) = &ticket
        && !gate_free
    {
        slot.set_state(CallState::Waiting);
        // The waits below are boxed: only calls that wait pay for their state, not every call's
        // future.
        let acquired = Box::pin(async {
            tokio::select! {
                biased;
                () = slot.scope.cancelled() => false,
                () = ticket.acquire() => true,
            }
        })
        .await;
        if !acquired {
            return fin.cancelled();
        }
        now = Instant::now();
        if let Some(key) = &cache_key {
            match lead_or_follow(&engine, &mut fin, key, &mut now).await {
                Some(guard) => flight = Some(guard),
                None => return,
            }
        }
    }

    // A call cancelled while it passed the steps above (an approval answered as its turn was
    // aborted) never starts its backend either: the backend may act on the request at once.
    if slot.scope.is_cancelled() {
        return fin.cancelled();
    }

    // Attempts.
    let last = run_attempts(&engine, &turn, &slot, entry, policy, input, now, &mut fin).await;
    drop(ticket);

    // Classify and record the breaker.
    let ended_at = Instant::now();
    fin.ended = Some(ended_at);
    let verdict = match &last {
        Final::Ok(_) | Final::Rejected(_) => Verdict::Success,
        Final::ToolError(_) if policy.breaker_counts_tool_errors => Verdict::Failure,
        Final::ToolError(_) => Verdict::Success,
        Final::Failed(ErrorReason::ServerRestart, _) => Verdict::Neutral,
        Final::Failed(..) | Final::Timeout(..) => Verdict::Failure,
        Final::Cancelled(_) | Final::Unrecorded(_) => Verdict::Neutral,
    };
    probe.armed = false;
    if let Some(state) = runtime
        .breaker
        .record(&policy.breaker, admission, verdict, ended_at)
    {
        engine.breaker_changed(runtime, &fin.scope, state);
    }

    // Cache store and outcome.
    match last {
        Final::Ok(output) => {
            let provenance = Provenance {
                source: ProvenanceSource::Tool,
                fetched_at: engine.bus.stamp(ended_at),
                cache_hit: false,
                digest: toolwarden_protocol::ContentDigest(result_digest(&output)),
                origin_call_id: None,
            };
            let tool_blocks = output.content.len();
            let result = fin.finish(Status::Ok, None, Some(output), Some(provenance));
            if let Some(guard) = flight {
                guard.complete(
                    CachedResult {
                        result,
                        tool_blocks,
                    },
                    policy.cache_ttl,
                    ended_at,
                );
            }
        }
        Final::ToolError(output) => {
            fin.finish(
                Status::Error {
                    reason: ErrorReason::ToolError,
                },
                None,
                Some(output),
                None,
            );
        }
        Final::Rejected(message) => fin.fail(
            Status::Error {
                reason: ErrorReason::ToolError,
            },
            Some(message),
        ),
        Final::Failed(reason, message) => fin.fail(Status::Error { reason }, Some(message)),
        Final::Timeout(kind, limit) => fin.fail(
            Status::Timeout {
                kind,
                after_ms: limit.as_millis() as u64,
            },
            None,
        ),
        Final::Cancelled(reason) => fin.fail(Status::Cancelled { reason }, None),
        Final::Unrecorded(message) => fin.fail(
            Status::Error {
                reason: ErrorReason::Transport,
            },
            Some(message),
        ),
    }
}

/// Digest of a result's content: canonical JSON of `{"content": [...], "structuredContent": ...}`.
fn result_digest(output: &ToolOutput) -> [u8; 32] {
    let items = ValueRef::Contents(&output.content);
    match &output.structured_content {
        Some(s) => {
            canonical::digest_object(&[("content", items), ("structuredContent", ValueRef::One(s))])
        }
        None => canonical::digest_object(&[("content", items)]),
    }
}

/// Single flight: a fresh stored result is served; else the call leads the execution of `key`
/// (the guard returned) or waits for an identical running call and shares its result, looking
/// again if that one ends without a result to share. `None` when the call ended here (served
/// from the cache, or cancelled while waiting). `now` moves on with any wait.
async fn lead_or_follow(
    engine: &EngineInner,
    fin: &mut Finisher<'_>,
    key: &CacheKey,
    now: &mut Instant,
) -> Option<cache::FlightGuard> {
    loop {
        match engine.cache.lookup(key, *now) {
            Lookup::Hit(hit) => {
                fin.cache_hit(&hit);
                return None;
            }
            Lookup::Lead(guard) => return Some(guard),
            Lookup::Follow(f) => {
                let slot = fin.slot;
                slot.set_state(CallState::Waiting);
                let shared = Box::pin(async {
                    tokio::select! {
                        biased;
                        () = slot.scope.cancelled() => None,
                        shared = cache::follow(f) => Some(shared),
                    }
                })
                .await;
                match shared {
                    None => {
                        fin.cancelled();
                        return None;
                    }
                    Some(Some(hit)) => {
                        fin.cache_hit(&hit);
                        return None;
                    }
                    Some(None) => {}
                }
                *now = Instant::now();
            }
        }
    }
}

/// Asks for approval; `false` when the call ended here (denied or cancelled).
async fn approve(
    engine: &Arc<EngineInner>,
    fin: &mut Finisher<'_>,
    entry: &ToolEntry,
    policy: &Policy,
    input: &Arc<Value>,
) -> bool {
    let kind = if policy.approval == Approval::Confirm {
        InteractionKind::Confirm
    } else {
        InteractionKind::Approval
    };
    let timeout = policy.approval_timeout.unwrap_or(match kind {
        InteractionKind::Confirm => Duration::from_secs(60),
        _ => Duration::from_secs(120),
    });
    let message = match kind {
        InteractionKind::Confirm => format!(
            "Tool \"{}\" may be destructive. Run it with this input?",
            entry.name
        ),
        _ => format!("Allow tool \"{}\" to run with this input?", entry.name),
    };
    fin.slot.set_state(CallState::AwaitingApproval);
    let request = InteractionRequest {
        kind,
        message,
        scope: fin.scope.clone(),
        input: Some((**input).clone()),
        details: None,
        timeout,
        default_action: None,
    };
    let slot = fin.slot.clone();
    let end = engine
        .interactions
        .ask(request, slot.scope.cancelled())
        .await;
    slot.set_state(CallState::Queued);
    match end {
        Ok(InteractionEnd::Answered(a)) if a.action == InteractionAction::Approve => return true,
        Ok(InteractionEnd::Defaulted(InteractionAction::Approve)) => return true,
        Ok(InteractionEnd::Answered(a)) => fin.deny(Decider::Policy, DenyReason::User, a.reason),
        Ok(InteractionEnd::TimedOut { after }) => fin.deny(
            Decider::Policy,
            DenyReason::Timeout,
            Some(format!("no answer within {}", format_duration(after))),
        ),
        Ok(InteractionEnd::NoInteractor | InteractionEnd::Defaulted(InteractionAction::Deny)) => {
            fin.deny(Decider::Headless, DenyReason::NoInteractor, None)
        }
        Ok(InteractionEnd::Cancelled) => fin.cancelled(),
        Err(e) => fin.deny(Decider::Policy, DenyReason::Rule, Some(e.to_string())),
    }
    false
}

/// Runs attempts until one ends the call: success, a non-retryable failure, retries exhausted,
/// cancellation, or a deadline. The attempts start at `started`.
#[allow(clippy::too_many_arguments)]
async fn run_attempts(
    engine: &Arc<EngineInner>,
    turn: &Arc<TurnState>,
    slot: &Arc<CallSlot>,
    entry: &Arc<ToolEntry>,
    policy: &Policy,
    input: Arc<Value>,
    started: Instant,
    fin: &mut Finisher<'_>,
) -> Final {
    let total_deadline = (!policy.timeout.is_zero()).then(|| started + policy.timeout);
    fin.invoked = true;
    fin.running = true;
    entry.runtime.metrics.in_flight(1);
    {
        let mut view = slot.view.lock();
        view.state = CallState::Running;
        view.started = Some(started);
        view.attempt = 1;
    }
    let start_seq = engine.bus.emit_at(
        &fin.scope,
        started,
        EventKind::ToolStart {
            input: input.clone(),
            timeout_ms: policy.timeout.as_millis() as u64,
            idle_timeout_ms: policy.idle_timeout.as_millis() as u64,
        },
    );
    // store (before_execution): no backend runs before its `tool_start` is committed.
    match crate::store::tool_start_durable(engine, &slot.scope, start_seq).await {
        Ok(()) => {}
        Err(crate::store::Unrecorded::Cancelled(reason)) => return Final::Cancelled(reason),
        Err(crate::store::Unrecorded::Failed(message)) => return Final::Unrecorded(message),
    }
    let mut n: u32 = 0;
    loop {
        n += 1;
        fin.attempts = n;
        if n > 1 {
            slot.view.lock().attempt = n;
        }
        let end = one_attempt(
            engine,
            turn,
            slot,
            entry,
            policy,
            &input,
            n,
            started,
            total_deadline,
            &fin.scope,
        )
        .await;
        let retryable = match &end {
            Final::Failed(..) | Final::Timeout(TimeoutKind::Attempt, _) => true,
            Final::ToolError(_) => policy.retry_on_tool_error,
            _ => false,
        };
        if !(retryable && policy.idempotent && n <= policy.retries) {
            return end;
        }
        let delay = engine.jitter.delay(&policy.backoff, n - 1);
        if total_deadline.is_some_and(|d| Instant::now() + delay >= d) {
            return end;
        }
        engine.bus.emit(
            &fin.scope,
            EventKind::ToolRetry {
                attempt: n + 1,
                delay_ms: delay.as_millis() as u64,
                cause: end.describe(),
            },
        );
        slot.set_state(CallState::Backoff);
        let cancelled = Box::pin(async {
            tokio::select! {
                biased;
                () = slot.scope.cancelled() => true,
                () = sleep(delay) => false,
            }
        })
        .await;
        if cancelled {
            return Final::Cancelled(slot.scope.reason().unwrap_or(CancelReason::User));
        }
        slot.set_state(CallState::Running);
    }
}

/// Why the wait on an attempt ended.
enum Ended {
    Backend(AttemptEnd),
    Cancelled(CancelReason),
    Timeout(TimeoutKind, Duration),
}

/// A running attempt's future. If the call stops waiting for it (cancel, timeout, or the whole
/// pipeline is dropped), the future is handed to a tracked task that asks the backend to stop,
/// forces it after `cancel_grace`, and emits `tool_stopped`.
/// It borrows what only a stop needs; the stop task gets its own copies.
struct InFlight<'a> {
    fut: Option<BoxFuture<AttemptEnd>>,
    signals: StopSignals,
    grace: Duration,
    engine: &'a Arc<EngineInner>,
    scope: &'a Arc<EventScope>,
    call_scope: &'a crate::cancel::Scope,
}

impl InFlight<'_> {
    async fn wait(&mut self) -> AttemptEnd {
        match self.fut.as_mut() {
            Some(f) => f.await,
            None => std::future::pending().await,
        }
    }

    /// Polls the attempt once: a backend that answers at once (an in-process function) ends
    /// here, without the deadline machinery being set up.
    fn poll_now(&mut self) -> Option<AttemptEnd> {
        let fut = self.fut.as_mut()?;
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        match fut.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(end) => Some(end),
            std::task::Poll::Pending => None,
        }
    }

    /// The attempt ended on its own: nothing to stop.
    fn ended(&mut self) {
        self.fut = None;
    }

    fn stop_behind(&mut self, reason: CancelReason) {
        let Some(fut) = self.fut.take() else { return };
        self.signals.request_stop(reason);
        let task = track_stop(
            fut,
            self.signals.clone(),
            self.grace,
            self.engine.clone(),
            self.scope.clone(),
            Instant::now(),
        );
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                self.engine.tracker.spawn_on(task, &handle);
            }
            // No runtime left to stop it on: force it at once.
            Err(_) => self.signals.force(),
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let reason = self
            .call_scope
            .reason()
            .unwrap_or(CancelReason::ClientDisconnect);
        self.stop_behind(reason);
    }
}

/// Stops a cancelled or timed-out attempt: cooperatively, then by force after `grace`.
async fn track_stop(
    mut fut: BoxFuture<AttemptEnd>,
    signals: StopSignals,
    grace: Duration,
    engine: Arc<EngineInner>,
    scope: Arc<EventScope>,
    requested: Instant,
) {
    // An answer instead of a stop is late and discarded. Within the grace it counts as the
    // backend stopping; past it, the backend ignored the cancel and kept working until it was
    // done (SPEC §3.3: that call was abandoned).
    let late = |end: AttemptEnd, answered_as: StopHow| match end {
        AttemptEnd::Stopped(how) => how,
        AttemptEnd::Done(result) => {
            let is_error = !matches!(&result, Ok(out) if !out.is_error);
            engine.bus.emit(
                &scope,
                EventKind::ToolLateResult {
                    is_error,
                    after_ms: requested.elapsed().as_millis() as u64,
                },
            );
            answered_as
        }
    };
    let how = tokio::select! {
        end = &mut fut => late(end, StopHow::Cooperative),
        () = sleep(grace) => {
            signals.force();
            match tokio::time::timeout(FORCE_WAIT, fut).await {
                Ok(end) => late(end, StopHow::Abandoned),
                Err(_) => StopHow::Abandoned,
            }
        }
    };
    engine.bus.emit(
        &scope,
        EventKind::ToolStopped {
            how,
            after_ms: requested.elapsed().as_millis() as u64,
        },
    );
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Turns backend progress into `tool_progress` events: at most one per `PROGRESS_MIN_GAP`, and at
/// least one per `PROGRESS_EVERY`.
struct Pacer {
    /// When the last `tool_progress` went out (the attempt's start before the first).
    last_emit: Instant,
    /// Whether anything went out yet: the first report goes out at once.
    emitted: bool,
    /// A report arrived too soon after the last one and waits for its turn.
    flush: bool,
}

impl Pacer {
    fn next_due(&self) -> Instant {
        self.last_emit
            + if self.flush {
                PROGRESS_MIN_GAP
            } else {
                PROGRESS_EVERY
            }
    }

    /// Whether a report arriving `now` may go out at once.
    fn may_emit(&self, now: Instant) -> bool {
        !self.emitted || now >= self.last_emit + PROGRESS_MIN_GAP
    }

    fn emitted_at(&mut self, now: Instant) {
        *self = Pacer {
            last_emit: now,
            emitted: true,
            flush: false,
        };
    }
}

/// What waiting on a running attempt needs.
struct Waiting<'a> {
    engine: &'a Arc<EngineInner>,
    slot: &'a Arc<CallSlot>,
    scope: &'a Arc<EventScope>,
    policy: &'a Policy,
    started: Instant,
    total_deadline: Option<Instant>,
    attempt_deadline: Option<Instant>,
    attempt_start: Instant,
}

impl Waiting<'_> {
    /// Waits for the attempt under the call's deadlines and cancellation, turning its progress
    /// into `tool_progress` events.
    async fn wait(self, inflight: &mut InFlight<'_>, heartbeat: &Heartbeat) -> Ended {
        let Waiting {
            engine,
            slot,
            scope,
            policy,
            started,
            total_deadline,
            attempt_deadline,
            attempt_start,
        } = self;
        let idle = policy.idle_timeout;
        let mut pacer = Pacer {
            last_emit: attempt_start,
            emitted: false,
            flush: false,
        };
        let emit_progress = |info: Option<ProgressInfo>| {
            let progress = {
                let mut view = slot.view.lock();
                if info.is_some() {
                    view.progress.clone_from(&info);
                }
                view.progress.clone().unwrap_or_default()
            };
            engine.bus.emit(
                scope,
                EventKind::ToolProgress {
                    elapsed_ms: started.elapsed().as_millis() as u64,
                    progress,
                },
            );
        };
        loop {
            let idle_at = (!idle.is_zero()).then(|| heartbeat.last_beat() + idle);
            tokio::select! {
                biased;
                () = slot.scope.cancelled() => break Ended::Cancelled(slot.scope.reason().unwrap_or(CancelReason::User)),
                end = inflight.wait() => break Ended::Backend(end),
                () = sleep_until_opt(total_deadline) => break Ended::Timeout(TimeoutKind::Total, policy.timeout),
                () = sleep_until_opt(attempt_deadline) => break Ended::Timeout(TimeoutKind::Attempt, policy.attempt_timeout),
                () = sleep_until_opt(idle_at) => {
                    if heartbeat.last_beat() + idle <= Instant::now() {
                        break Ended::Timeout(TimeoutKind::Idle, idle);
                    }
                }
                () = heartbeat.progressed() => {
                    let now = Instant::now();
                    if pacer.may_emit(now) {
                        emit_progress(heartbeat.take_progress());
                        pacer.emitted_at(now);
                    } else {
                        pacer.flush = true;
                    }
                }
                () = sleep_until(pacer.next_due()) => {
                    emit_progress(heartbeat.take_progress());
                    pacer.emitted_at(Instant::now());
                }
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn one_attempt(
    engine: &Arc<EngineInner>,
    turn: &Arc<TurnState>,
    slot: &Arc<CallSlot>,
    entry: &Arc<ToolEntry>,
    policy: &Policy,
    input: &Arc<Value>,
    n: u32,
    started: Instant,
    total_deadline: Option<Instant>,
    scope: &Arc<EventScope>,
) -> Final {
    let attempt_start = if n == 1 { started } else { Instant::now() };
    let (signals, heartbeat) =
        crate::backend::attempt_signals(turn.relay_for(&slot.call_id), attempt_start);
    let attempt_deadline =
        (!policy.attempt_timeout.is_zero()).then(|| attempt_start + policy.attempt_timeout);
    let fut = entry.backend.start(Attempt {
        tool: entry.backend_tool.clone(),
        input: input.clone(),
        meta: AttemptMeta {
            session_id: turn.session.id.clone(),
            turn_id: turn.id.clone(),
            call_id: slot.call_id.clone(),
            attempt: n,
        },
        stop: signals.clone(),
        heartbeat: heartbeat.clone(),
        on_stuck: policy.on_stuck,
        deadline: total_deadline,
    });
    let mut inflight = InFlight {
        fut: Some(fut),
        signals,
        grace: policy.cancel_grace,
        engine,
        scope,
        call_scope: &slot.scope,
    };
    let first = if slot.scope.is_cancelled() {
        None
    } else {
        inflight.poll_now()
    };
    let ended = match first {
        Some(end) => Ended::Backend(end),
        // The wait under deadlines is boxed: a backend that answers at once (the common case
        // in-process) never pays for its state in every call's future.
        None => {
            let waiting = Waiting {
                engine,
                slot,
                scope,
                policy,
                started,
                total_deadline,
                attempt_deadline,
                attempt_start,
            };
            Box::pin(waiting.wait(&mut inflight, &heartbeat)).await
        }
    };
    heartbeat.close();
    match ended {
        Ended::Backend(end) => {
            inflight.ended();
            match end {
                AttemptEnd::Done(Ok(out)) if !out.is_error => Final::Ok(out),
                AttemptEnd::Done(Ok(out)) => Final::ToolError(out),
                AttemptEnd::Done(Err(AttemptError::Transport(m))) => {
                    Final::Failed(ErrorReason::Transport, m)
                }
                AttemptEnd::Done(Err(AttemptError::Crashed(m))) => {
                    Final::Failed(ErrorReason::Crashed, m)
                }
                AttemptEnd::Done(Err(AttemptError::ServerRestart(m))) => {
                    Final::Failed(ErrorReason::ServerRestart, m)
                }
                AttemptEnd::Done(Err(AttemptError::Rejected(m))) => Final::Rejected(m),
                AttemptEnd::Stopped(how) => Final::Failed(
                    ErrorReason::Crashed,
                    format!(
                        "the backend stopped the call without being asked ({})",
                        how.as_str()
                    ),
                ),
            }
        }
        Ended::Cancelled(reason) => {
            inflight.stop_behind(reason);
            Final::Cancelled(reason)
        }
        Ended::Timeout(kind, limit) => {
            engine.bus.emit(
                scope,
                EventKind::ToolTimeout {
                    kind,
                    after_ms: limit.as_millis() as u64,
                },
            );
            inflight.stop_behind(CancelReason::Timeout);
            Final::Timeout(kind, limit)
        }
    }
}
