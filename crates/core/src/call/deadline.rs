//! Deadlines of a running attempt: the call's total deadline (from its first attempt's start),
//! the attempt's own, and the idle deadline that every heartbeat pushes forward. Waiting on an
//! attempt races its end against these, the call's cancellation, and progress pacing.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt as _;
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
            // One timer, for the earliest of the deadlines and the next progress report, not
            // one each: every timer is an entry the runtime's wheel inserts and takes out again.
            let due = [deadlines.total, deadlines.attempt, idle_at]
                .into_iter()
                .flatten()
                .fold(pacer.next_due(), Instant::min);
            tokio::select! {
                biased;
                () = slot.scope.cancelled() => break Ended::Cancelled(slot.scope.reason().unwrap_or(CancelReason::User)),
                end = running.wait() => break Ended::Backend(end),
                () = sleep_until(due) => {
                    // Whatever is due by now, the most pressing first: one timer firing late
                    // may find several due, and they are judged in the order they always were.
                    let now = Instant::now();
                    match timed_out(&deadlines, idle_at, now) {
                        Some(Due::Total) => break Ended::Timeout(TimeoutKind::Total, policy.timeout),
                        Some(Due::Attempt) => break Ended::Timeout(TimeoutKind::Attempt, policy.attempt_timeout),
                        // The idle deadline moves with every heartbeat: only a silent one ends
                        // the call.
                        Some(Due::Idle) if heartbeat.last_beat() + idle <= now => {
                            break Ended::Timeout(TimeoutKind::Idle, idle);
                        }
                        _ => {}
                    }
                    if pacer.next_due() <= now {
                        // A report that arrived meanwhile goes out with this one: its notice is
                        // read here, or it would come round again as a report too soon after.
                        let _ = heartbeat.progressed().now_or_never();
                        emit_progress(heartbeat.take_progress());
                        pacer.emitted_at(now);
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
            }
        }
    }
}

/// A deadline of a running attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Due {
    Total,
    Attempt,
    Idle,
}

/// The deadline passed by `now`, if any; when several have, the total deadline comes before
/// the attempt's, and the attempt's before the idle one.
fn timed_out(deadlines: &Deadlines, idle_at: Option<Instant>, now: Instant) -> Option<Due> {
    [
        (deadlines.total, Due::Total),
        (deadlines.attempt, Due::Attempt),
        (idle_at, Due::Idle),
    ]
    .into_iter()
    .find_map(|(at, why)| at.is_some_and(|at| at <= now).then_some(why))
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

    /// Only a deadline passed counts; of several passed, the total deadline comes first, then
    /// the attempt's, then the idle one, whichever passed earlier.
    #[test]
    fn the_most_pressing_deadline_passed_is_the_one() {
        let at = Instant::now();
        let ms = |n: u64| at + Duration::from_millis(n);
        let cases = [
            (deadlines(at, None, None), None, 100, None),
            (deadlines(at, Some(30), Some(10)), Some(5), 4, None),
            (
                deadlines(at, Some(30), Some(10)),
                Some(5),
                5,
                Some(Due::Idle),
            ),
            (
                deadlines(at, Some(30), Some(10)),
                Some(5),
                10,
                Some(Due::Attempt),
            ),
            (
                deadlines(at, Some(30), Some(10)),
                Some(5),
                30,
                Some(Due::Total),
            ),
            // One timer firing late finds the attempt's and the total deadline both passed.
            (
                deadlines(at, Some(11), Some(10)),
                None,
                11,
                Some(Due::Total),
            ),
            (
                deadlines(at, None, Some(10)),
                Some(9),
                10,
                Some(Due::Attempt),
            ),
        ];
        for (d, idle, now, want) in cases {
            assert_eq!(timed_out(&d, idle.map(ms), ms(now)), want, "at {now} ms");
        }
    }
}
