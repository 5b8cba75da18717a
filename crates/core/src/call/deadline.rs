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
            // One timer for the earliest of the deadlines and the next progress report, not one
            // each: every timer is an entry the runtime's wheel inserts and takes out again.
            let (due, why) = next_due(&deadlines, idle_at, pacer.next_due());
            tokio::select! {
                biased;
                () = slot.scope.cancelled() => break Ended::Cancelled(slot.scope.reason().unwrap_or(CancelReason::User)),
                end = running.wait() => break Ended::Backend(end),
                () = sleep_until(due) => match why {
                    Due::Total => break Ended::Timeout(TimeoutKind::Total, policy.timeout),
                    Due::Attempt => break Ended::Timeout(TimeoutKind::Attempt, policy.attempt_timeout),
                    Due::Idle => {
                        if heartbeat.last_beat() + idle <= Instant::now() {
                            break Ended::Timeout(TimeoutKind::Idle, idle);
                        }
                    }
                    Due::Progress => {
                        emit_progress(heartbeat.take_progress());
                        pacer.emitted_at(Instant::now());
                    }
                },
                () = heartbeat.progressed() => {
                    let now = Instant::now();
                    if pacer.may_emit(now) {
                        emit_progress(heartbeat.take_progress());
                        pacer.emitted_at(now);
                    } else {
                        pacer.hold();
                    }
                }
            }
        }
    }
}

/// What comes due first while an attempt runs, in the order that wins a tie.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Due {
    Total,
    Attempt,
    Idle,
    Progress,
}

/// The earliest of the total, attempt and idle deadlines and the next progress report, and
/// which it is. On a tie the first in that order wins, so a deadline beats a report due at the
/// same instant.
fn next_due(deadlines: &Deadlines, idle_at: Option<Instant>, report: Instant) -> (Instant, Due) {
    [
        (deadlines.total, Due::Total),
        (deadlines.attempt, Due::Attempt),
        (idle_at, Due::Idle),
    ]
    .into_iter()
    .filter_map(|(at, why)| at.map(|at| (at, why)))
    .fold((report, Due::Progress), |best, next| best.min(next))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deadlines(at: Instant, total: Option<u64>, attempt: Option<u64>) -> Deadlines {
        Deadlines {
            started: at,
            total: total.map(|ms| at + Duration::from_millis(ms)),
            attempt: attempt.map(|ms| at + Duration::from_millis(ms)),
            attempt_start: at,
        }
    }

    /// The earliest comes due; on a tie the total deadline beats the attempt's, the attempt's
    /// beats the idle one, and any deadline beats a progress report.
    #[test]
    fn the_earliest_comes_due_and_a_deadline_wins_a_tie() {
        let at = Instant::now();
        let ms = |n: u64| at + Duration::from_millis(n);
        let cases = [
            (
                deadlines(at, None, None),
                None,
                5000,
                (ms(5000), Due::Progress),
            ),
            (
                deadlines(at, Some(30), None),
                None,
                5000,
                (ms(30), Due::Total),
            ),
            (
                deadlines(at, Some(30), Some(10)),
                None,
                5000,
                (ms(10), Due::Attempt),
            ),
            (
                deadlines(at, Some(30), Some(10)),
                Some(5),
                5000,
                (ms(5), Due::Idle),
            ),
            (
                deadlines(at, Some(30), Some(10)),
                Some(5),
                1,
                (ms(1), Due::Progress),
            ),
            (
                deadlines(at, Some(10), Some(10)),
                Some(10),
                10,
                (ms(10), Due::Total),
            ),
            (
                deadlines(at, None, Some(10)),
                Some(10),
                10,
                (ms(10), Due::Attempt),
            ),
            (deadlines(at, None, None), Some(10), 10, (ms(10), Due::Idle)),
        ];
        for (d, idle, report, want) in cases {
            assert_eq!(next_due(&d, idle.map(ms), ms(report)), want);
        }
    }
}
