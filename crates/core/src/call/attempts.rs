//! Attempts and retries: a call's backend runs one attempt at a time under the call's deadlines;
//! an idempotent tool's retryable failure (an attempt timeout, a transport error, a crash) is
//! retried after a full-jitter backoff, never past the total deadline and never after a cancel.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::time::{Instant, sleep};
use toolwarden_protocol::{
    CallState, CancelReason, ErrorReason, EventKind, Policy, TimeoutKind, format_duration,
};

use crate::backend::{Attempt, AttemptEnd, AttemptError, AttemptMeta, ToolOutput};
use crate::registry::ToolEntry;
use crate::store::{self, Unrecorded};

use super::deadline::{Deadlines, Ended, Waiting};
use super::finish::Finisher;
use super::stop::RunningAttempt;

/// How the attempts of a call ended.
pub(super) enum Final {
    Ok(ToolOutput),
    ToolError(ToolOutput),
    Rejected(String),
    Failed(ErrorReason, String),
    Timeout(TimeoutKind, Duration),
    Cancelled(CancelReason),
    /// The audit trail could not commit the call's `tool_start`: its backend was not invoked.
    Unrecorded(String),
    /// The backend cannot serve at all (`AttemptError::Unavailable`).
    Unavailable(String),
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
            Final::Unavailable(m) => format!("unavailable: {m}"),
        }
    }

    /// Whether another attempt may follow this one (if the tool is idempotent and retries
    /// are left).
    fn retryable(&self, policy: &Policy) -> bool {
        match self {
            Final::Failed(..) | Final::Timeout(TimeoutKind::Attempt, _) => true,
            Final::ToolError(_) => policy.retry_on_tool_error,
            _ => false,
        }
    }
}

/// Runs attempts until one ends the call: success, a non-retryable failure, retries exhausted,
/// cancellation, or a deadline. The attempts start at `started`.
pub(super) async fn run_attempts(
    fin: &mut Finisher<'_>,
    entry: &ToolEntry,
    policy: &Policy,
    input: Arc<Value>,
    started: Instant,
) -> Final {
    let (env, slot) = (fin.env, fin.slot);
    let total = (!policy.timeout.is_zero()).then(|| started + policy.timeout);
    fin.invoked = true;
    fin.running = true;
    entry.runtime.metrics.in_flight(1);
    {
        let mut view = slot.view.lock();
        view.state = CallState::Running;
        view.started = Some(started);
        view.attempt = 1;
    }
    let start_seq = env.bus.emit_at(
        &fin.scope,
        started,
        EventKind::ToolStart {
            input: input.clone(),
            timeout_ms: policy.timeout.as_millis() as u64,
            idle_timeout_ms: policy.idle_timeout.as_millis() as u64,
        },
    );
    // With `before_execution`, no backend runs before its `tool_start` is committed.
    match store::tool_start_durable(env.store.as_ref(), &slot.scope, start_seq).await {
        Ok(()) => {}
        Err(Unrecorded::Cancelled(reason)) => return Final::Cancelled(reason),
        Err(Unrecorded::Failed(message)) => return Final::Unrecorded(message),
    }
    let mut n: u32 = 0;
    loop {
        n += 1;
        fin.attempts = n;
        if n > 1 {
            slot.view.lock().attempt = n;
        }
        let attempt_start = if n == 1 { started } else { Instant::now() };
        let deadlines = Deadlines {
            started,
            total,
            attempt: (!policy.attempt_timeout.is_zero())
                .then(|| attempt_start + policy.attempt_timeout),
            attempt_start,
        };
        let end = one_attempt(fin, entry, policy, &input, n, deadlines).await;
        if !(end.retryable(policy) && policy.idempotent && n <= policy.retries) {
            return end;
        }
        let delay = env.jitter.delay(&policy.backoff, n - 1);
        if total.is_some_and(|d| Instant::now() + delay >= d) {
            return end;
        }
        env.bus.emit(
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

/// Runs attempt `n` to its end, or until the call stops waiting for it (then the attempt is
/// stopped behind the call).
async fn one_attempt(
    fin: &Finisher<'_>,
    entry: &ToolEntry,
    policy: &Policy,
    input: &Arc<Value>,
    n: u32,
    deadlines: Deadlines,
) -> Final {
    let (env, turn, slot, scope) = (fin.env, fin.turn, fin.slot, &fin.scope);
    let (signals, heartbeat) =
        crate::backend::attempt_signals(turn.relay_for(&slot.call_id), deadlines.attempt_start);
    let fut = entry.backend.start(Attempt {
        tool: entry.backend_tool.clone(),
        input: input.clone(),
        meta: AttemptMeta {
            principal: turn.session.key.principal.clone(),
            session_id: turn.session.key.id.clone(),
            turn_id: turn.id.clone(),
            call_id: slot.call_id.clone(),
            attempt: n,
            traceparent: turn.trace.map(|t| t.for_attempt(&slot.call_id, n)),
        },
        stop: signals.clone(),
        heartbeat: heartbeat.clone(),
        on_stuck: policy.on_stuck,
        deadline: deadlines.total,
    });
    let mut running =
        RunningAttempt::new(fut, signals, policy.cancel_grace, env, scope, &slot.scope);
    let first = if slot.scope.is_cancelled() {
        None
    } else {
        running.poll_now()
    };
    let ended = match first {
        Some(end) => Ended::Backend(end),
        // Not ready at the first poll: the wait below polls it again with a real waker (see
        // `RunningAttempt::poll_now`). The wait under deadlines is boxed: a backend that
        // answers at once (the common case in-process) never pays for its state in every
        // call's future.
        None => {
            let waiting = Waiting {
                env,
                slot,
                scope,
                policy,
                deadlines,
            };
            Box::pin(waiting.wait(&mut running, &heartbeat)).await
        }
    };
    heartbeat.close();
    match ended {
        Ended::Backend(end) => {
            running.ended();
            classify(end)
        }
        Ended::Cancelled(reason) => {
            running.stop_behind(reason);
            Final::Cancelled(reason)
        }
        Ended::Timeout(kind, limit) => {
            env.bus.emit(
                scope,
                EventKind::ToolTimeout {
                    kind,
                    after_ms: limit.as_millis() as u64,
                },
            );
            running.stop_behind(CancelReason::Timeout);
            Final::Timeout(kind, limit)
        }
    }
}

/// What an attempt's own end means for the call.
fn classify(end: AttemptEnd) -> Final {
    match end {
        AttemptEnd::Done(Ok(out)) if !out.is_error => Final::Ok(out),
        AttemptEnd::Done(Ok(out)) => Final::ToolError(out),
        AttemptEnd::Done(Err(AttemptError::Transport(m))) => {
            Final::Failed(ErrorReason::Transport, m)
        }
        AttemptEnd::Done(Err(AttemptError::Crashed(m))) => Final::Failed(ErrorReason::Crashed, m),
        AttemptEnd::Done(Err(AttemptError::ServerRestart(m))) => {
            Final::Failed(ErrorReason::ServerRestart, m)
        }
        AttemptEnd::Done(Err(AttemptError::Rejected(m))) => Final::Rejected(m),
        AttemptEnd::Done(Err(AttemptError::Unavailable(m))) => Final::Unavailable(m),
        AttemptEnd::Stopped(how) => Final::Failed(
            ErrorReason::Crashed,
            format!(
                "the backend stopped the call without being asked ({})",
                how.as_str()
            ),
        ),
    }
}
