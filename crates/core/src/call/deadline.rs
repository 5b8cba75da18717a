//! Deadlines of a running attempt: the call's total deadline (from its first attempt's start),
//! the attempt's own, and the idle deadline that every heartbeat pushes forward. Waiting on an
//! attempt races its end against these, the call's cancellation, and progress pacing.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, sleep_until};
use toolwarden_protocol::{CancelReason, EventKind, Policy, ProgressInfo, TimeoutKind};

use crate::backend::{AttemptEnd, Heartbeat};
use crate::events::EventScope;

use super::env::CallEnv;
use super::pacer::Pacer;
use super::slot::CallSlot;
use super::stop::RunningAttempt;

/// Why the wait on an attempt ended.
pub(super) enum Ended {
    Backend(AttemptEnd),
    Cancelled(CancelReason),
    Timeout(TimeoutKind, Duration),
}

/// The deadlines of one attempt, as instants.
#[derive(Clone, Copy)]
pub(super) struct Deadlines {
    /// When the call's first attempt started.
    pub(super) started: Instant,
    /// `started + timeout`, unless the call has no total cap.
    pub(super) total: Option<Instant>,
    /// This attempt's start + `attempt_timeout`, if it has one.
    pub(super) attempt: Option<Instant>,
    /// This attempt's start.
    pub(super) attempt_start: Instant,
}

/// What waiting on a running attempt needs.
pub(super) struct Waiting<'a> {
    pub(super) env: &'a CallEnv,
    pub(super) slot: &'a CallSlot,
    pub(super) scope: &'a Arc<EventScope>,
    pub(super) policy: &'a Policy,
    pub(super) deadlines: Deadlines,
}

impl Waiting<'_> {
    /// Waits for the attempt under the call's deadlines and cancellation, turning its progress
    /// into `tool_progress` events.
    pub(super) async fn wait(
        self,
        running: &mut RunningAttempt<'_>,
        heartbeat: &Heartbeat,
    ) -> Ended {
        let Waiting {
            env,
            slot,
            scope,
            policy,
            deadlines,
        } = self;
        let idle = policy.idle_timeout;
        let mut pacer = Pacer::new(deadlines.attempt_start);
        let emit_progress = |info: Option<ProgressInfo>| {
            let progress = {
                let mut view = slot.view.lock();
                if info.is_some() {
                    view.progress.clone_from(&info);
                }
                view.progress.clone().unwrap_or_default()
            };
            env.bus.emit(
                scope,
                EventKind::ToolProgress {
                    elapsed_ms: deadlines.started.elapsed().as_millis() as u64,
                    progress,
                },
            );
        };
        loop {
            let idle_at = (!idle.is_zero()).then(|| heartbeat.last_beat() + idle);
            tokio::select! {
                biased;
                () = slot.scope.cancelled() => break Ended::Cancelled(slot.scope.reason().unwrap_or(CancelReason::User)),
                end = running.wait() => break Ended::Backend(end),
                () = sleep_until_opt(deadlines.total) => break Ended::Timeout(TimeoutKind::Total, policy.timeout),
                () = sleep_until_opt(deadlines.attempt) => break Ended::Timeout(TimeoutKind::Attempt, policy.attempt_timeout),
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
                        pacer.hold();
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

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => sleep_until(at).await,
        None => std::future::pending().await,
    }
}
