//! The per-tool circuit breaker (docs/GOVERNANCE.md, "The circuit breaker").
//!
//! Closed, it counts infrastructure failures (timeouts, transport errors, crashes) in a sliding
//! `window`; `failures` of them open it. Open, every call ends at once as `circuit_open` with
//! `retry_after_ms`. After `open_for` it is half-open and admits **exactly one** probe: the probe's
//! success closes it, its failure opens it again, and a probe that ends neither way (cancelled,
//! denied) hands its slot back. Results of calls admitted before the breaker opened do not move
//! an open or half-open breaker. Cancellations, denials, invalid input and the tool's own errors
//! are never failures (unless `breaker_counts_tool_errors`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;
use toolwarden_protocol::{Breaker as BreakerPolicy, BreakerStateKind};

/// How a call's end counts for its breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BreakerVerdict {
    Success,
    Failure,
    /// Neither: cancelled, denied, a tool error that does not count.
    Neutral,
}

/// The breaker's answer to a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Closed: run.
    Pass,
    /// Half-open: run as the one probe.
    Probe,
    /// Open (or half-open with its probe out): do not run.
    Rejected { retry_after: Duration },
}

#[derive(Debug)]
enum BreakerState {
    Closed { failures: VecDeque<Instant> },
    Open { until: Instant },
    HalfOpen { probe_out: bool },
}

/// One tool's breaker.
#[derive(Debug)]
pub(crate) struct CircuitBreaker {
    state: Mutex<BreakerState>,
    /// Whether `state` is anything but closed, kept beside it so that a closed breaker admits a
    /// call without its lock. A call admitted as the breaker opens is admitted as it would have
    /// been a moment earlier.
    tripped: AtomicBool,
}

/// How long a call turned away while the probe runs should wait before trying again.
const PROBE_RETRY_AFTER: Duration = Duration::from_secs(1);

impl Default for CircuitBreaker {
    fn default() -> Self {
        Self {
            state: Mutex::new(BreakerState::Closed {
                failures: VecDeque::new(),
            }),
            tripped: AtomicBool::new(false),
        }
    }
}

impl CircuitBreaker {
    /// Asks to run a call now. May move open → half-open (returned as the second value).
    pub(crate) fn admit(
        &self,
        policy: &BreakerPolicy,
        now: Instant,
    ) -> (Admission, Option<BreakerStateKind>) {
        if policy.failures == 0 || !self.tripped.load(Ordering::Acquire) {
            return (Admission::Pass, None);
        }
        let mut state = self.state.lock();
        let admitted = match &mut *state {
            BreakerState::Closed { .. } => (Admission::Pass, None),
            BreakerState::Open { until } => {
                if now >= *until {
                    *state = BreakerState::HalfOpen { probe_out: true };
                    (Admission::Probe, Some(BreakerStateKind::HalfOpen))
                } else {
                    (
                        Admission::Rejected {
                            retry_after: *until - now,
                        },
                        None,
                    )
                }
            }
            BreakerState::HalfOpen { probe_out } => {
                if *probe_out {
                    (
                        Admission::Rejected {
                            retry_after: PROBE_RETRY_AFTER.min(policy.open_for),
                        },
                        None,
                    )
                } else {
                    *probe_out = true;
                    (Admission::Probe, None)
                }
            }
        };
        self.note(&state);
        admitted
    }

    /// Keeps `tripped` in step with `state` (called under the lock after every change).
    fn note(&self, state: &BreakerState) {
        self.tripped.store(
            !matches!(state, BreakerState::Closed { .. }),
            Ordering::Release,
        );
    }

    /// Records how an admitted call ended. Returns the new state when it changed.
    pub(crate) fn record(
        &self,
        policy: &BreakerPolicy,
        admission: Admission,
        verdict: BreakerVerdict,
        now: Instant,
    ) -> Option<BreakerStateKind> {
        // A call admitted closed that did not fail changes nothing, whatever the state now.
        if policy.failures == 0
            || (admission == Admission::Pass && verdict != BreakerVerdict::Failure)
        {
            return None;
        }
        let mut state = self.state.lock();
        let change = match (&mut *state, admission) {
            (BreakerState::HalfOpen { .. }, Admission::Probe) => match verdict {
                BreakerVerdict::Success => {
                    *state = BreakerState::Closed {
                        failures: VecDeque::new(),
                    };
                    Some(BreakerStateKind::Closed)
                }
                BreakerVerdict::Failure => {
                    *state = BreakerState::Open {
                        until: now + policy.open_for,
                    };
                    Some(BreakerStateKind::Open)
                }
                BreakerVerdict::Neutral => {
                    *state = BreakerState::HalfOpen { probe_out: false };
                    None
                }
            },
            (BreakerState::Closed { failures }, Admission::Pass)
                if verdict == BreakerVerdict::Failure =>
            {
                while failures
                    .front()
                    .is_some_and(|t| now.duration_since(*t) >= policy.window)
                {
                    failures.pop_front();
                }
                failures.push_back(now);
                if failures.len() >= policy.failures as usize {
                    *state = BreakerState::Open {
                        until: now + policy.open_for,
                    };
                    Some(BreakerStateKind::Open)
                } else {
                    None
                }
            }
            _ => None,
        };
        self.note(&state);
        change
    }

    /// Takes in a change another replica made (docs/SCALE-OUT.md): opened there, it opens here
    /// until the same time (never shorter than it already is); closed there by a probe, it closes
    /// here. Returns the new state when it changed.
    pub(crate) fn apply_shared(
        &self,
        change: crate::shared::BreakerChange,
        now: Instant,
    ) -> Option<BreakerStateKind> {
        use crate::shared::BreakerChange;
        let mut state = self.state.lock();
        let changed = match (change, &*state) {
            (BreakerChange::Open { for_ }, BreakerState::Open { until }) => {
                if now + for_ > *until {
                    *state = BreakerState::Open { until: now + for_ };
                }
                None
            }
            (BreakerChange::Open { for_ }, _) => {
                *state = BreakerState::Open { until: now + for_ };
                Some(BreakerStateKind::Open)
            }
            (BreakerChange::Closed, BreakerState::Closed { .. }) => None,
            (BreakerChange::Closed, _) => {
                *state = BreakerState::Closed {
                    failures: VecDeque::new(),
                };
                Some(BreakerStateKind::Closed)
            }
        };
        self.note(&state);
        changed
    }

    /// The current state (open past its time reads as half-open) and, when open, the time left.
    pub(crate) fn state(&self, now: Instant) -> (BreakerStateKind, Option<Duration>) {
        match &*self.state.lock() {
            BreakerState::Closed { .. } => (BreakerStateKind::Closed, None),
            BreakerState::Open { until } if now < *until => {
                (BreakerStateKind::Open, Some(*until - now))
            }
            BreakerState::Open { .. } | BreakerState::HalfOpen { .. } => {
                (BreakerStateKind::HalfOpen, None)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn policy() -> BreakerPolicy {
        BreakerPolicy {
            failures: 3,
            window: Duration::from_secs(60),
            open_for: Duration::from_secs(30),
        }
    }

    /// A closed breaker with [`policy`], and the instant its test starts at.
    fn closed() -> (CircuitBreaker, BreakerPolicy, Instant) {
        (CircuitBreaker::default(), policy(), Instant::now())
    }

    /// A breaker that three failures at its test's start opened.
    fn opened() -> (CircuitBreaker, BreakerPolicy, Instant) {
        let (b, p, t0) = closed();
        for _ in 0..3 {
            b.record(&p, Admission::Pass, BreakerVerdict::Failure, t0);
        }
        (b, p, t0)
    }

    /// `secs` seconds after `t0`.
    fn at(t0: Instant, secs: u64) -> Instant {
        t0 + Duration::from_secs(secs)
    }

    #[test]
    fn opens_after_failures_within_the_window() {
        let (b, p, t0) = closed();
        assert_eq!(
            b.record(&p, Admission::Pass, BreakerVerdict::Failure, t0),
            None
        );
        assert_eq!(
            b.record(&p, Admission::Pass, BreakerVerdict::Failure, at(t0, 1)),
            None
        );
        assert_eq!(
            b.record(&p, Admission::Pass, BreakerVerdict::Failure, at(t0, 2)),
            Some(BreakerStateKind::Open)
        );
        let (a, _) = b.admit(&p, at(t0, 12));
        assert_eq!(
            a,
            Admission::Rejected {
                retry_after: Duration::from_secs(20)
            }
        );
    }

    #[test]
    fn failures_outside_the_window_do_not_count() {
        let (b, p, t0) = closed();
        b.record(&p, Admission::Pass, BreakerVerdict::Failure, t0);
        b.record(&p, Admission::Pass, BreakerVerdict::Failure, at(t0, 30));
        assert_eq!(
            b.record(&p, Admission::Pass, BreakerVerdict::Failure, at(t0, 61)),
            None
        );
        assert_eq!(b.state(at(t0, 61)).0, BreakerStateKind::Closed);
    }

    #[test]
    fn neutral_and_success_never_open_it() {
        let (b, p, t0) = closed();
        for _ in 0..10 {
            for verdict in [BreakerVerdict::Neutral, BreakerVerdict::Success] {
                assert_eq!(b.record(&p, Admission::Pass, verdict, t0), None);
            }
        }
        assert_eq!(b.state(t0).0, BreakerStateKind::Closed);
    }

    #[test]
    fn half_open_admits_exactly_one_probe() {
        let (b, p, t0) = opened();
        let later = at(t0, 30);
        assert_eq!(
            b.admit(&p, later),
            (Admission::Probe, Some(BreakerStateKind::HalfOpen))
        );
        for _ in 0..5 {
            assert!(matches!(b.admit(&p, later).0, Admission::Rejected { .. }));
        }
        // A probe that is cancelled hands its slot back.
        assert_eq!(
            b.record(&p, Admission::Probe, BreakerVerdict::Neutral, later),
            None
        );
        assert_eq!(b.admit(&p, later).0, Admission::Probe);
        // Its failure opens the breaker again for a full `open_for`.
        assert_eq!(
            b.record(&p, Admission::Probe, BreakerVerdict::Failure, later),
            Some(BreakerStateKind::Open)
        );
        assert!(matches!(
            b.admit(&p, at(later, 29)).0,
            Admission::Rejected { .. }
        ));
        assert_eq!(b.admit(&p, at(later, 30)).0, Admission::Probe);
        // Its success closes it.
        assert_eq!(
            b.record(&p, Admission::Probe, BreakerVerdict::Success, at(later, 31)),
            Some(BreakerStateKind::Closed)
        );
        assert_eq!(b.admit(&p, at(later, 31)).0, Admission::Pass);
    }

    #[test]
    fn stragglers_admitted_before_it_opened_do_not_move_it() {
        let (b, p, t0) = opened();
        assert_eq!(
            b.record(&p, Admission::Pass, BreakerVerdict::Success, t0),
            None
        );
        assert_eq!(b.state(t0).0, BreakerStateKind::Open);
    }

    #[test]
    fn zero_failures_turns_it_off() {
        let (b, p, t0) = closed();
        let p = BreakerPolicy { failures: 0, ..p };
        for _ in 0..100 {
            b.record(&p, Admission::Pass, BreakerVerdict::Failure, t0);
        }
        assert_eq!(b.admit(&p, t0).0, Admission::Pass);
    }

    #[test]
    fn another_replicas_changes_apply_here() {
        use crate::shared::BreakerChange;
        let (b, p, t0) = closed();
        let open = BreakerChange::Open {
            for_: Duration::from_secs(10),
        };
        assert_eq!(b.apply_shared(open, t0), Some(BreakerStateKind::Open));
        // Told again (a replica's resync): still open, no new change.
        assert_eq!(b.apply_shared(open, t0), None);
        assert_eq!(
            b.admit(&p, at(t0, 4)).0,
            Admission::Rejected {
                retry_after: Duration::from_secs(6)
            }
        );
        assert_eq!(b.admit(&p, at(t0, 10)).0, Admission::Probe);
        assert_eq!(
            b.apply_shared(BreakerChange::Closed, at(t0, 11)),
            Some(BreakerStateKind::Closed)
        );
        assert_eq!(b.admit(&p, at(t0, 11)).0, Admission::Pass);
        // The local probe that was out when the other replica closed it moves nothing.
        assert_eq!(
            b.record(&p, Admission::Probe, BreakerVerdict::Failure, at(t0, 12)),
            None
        );
        assert_eq!(b.state(at(t0, 12)).0, BreakerStateKind::Closed);
    }

    #[derive(Clone, Debug)]
    enum Step {
        Call { verdict: u8 },
        Wait { secs: u8 },
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0u8..3).prop_map(|verdict| Step::Call { verdict }),
            (0u8..40).prop_map(|secs| Step::Wait { secs })
        ]
    }

    proptest! {
        /// Whatever happens: at most one probe is ever out at a time; an open breaker rejects
        /// every call until `open_for` has passed; only failures open it.
        #[test]
        fn invariants_hold(steps in prop::collection::vec(step(), 1..200), concurrent in 1usize..4) {
            let b = CircuitBreaker::default();
            let p = policy();
            let mut now = Instant::now();
            let mut opened_at: Option<Instant> = None;
            for s in steps {
                match s {
                    Step::Wait { secs } => now += Duration::from_secs(u64::from(secs)),
                    Step::Call { verdict } => {
                        let admitted: Vec<Admission> = (0..concurrent).map(|_| b.admit(&p, now).0).collect();
                        let probes = admitted.iter().filter(|a| **a == Admission::Probe).count();
                        prop_assert!(probes <= 1, "{probes} probes out at once");
                        if let Some(t) = opened_at
                            && now < t + p.open_for
                        {
                            let all_rejected = admitted.iter().all(|a| matches!(a, Admission::Rejected { .. }));
                            prop_assert!(all_rejected, "an open breaker admitted a call");
                        }
                        let verdict = match verdict { 0 => BreakerVerdict::Success, 1 => BreakerVerdict::Failure, _ => BreakerVerdict::Neutral };
                        for a in admitted {
                            if matches!(a, Admission::Rejected { .. }) {
                                continue;
                            }
                            match b.record(&p, a, verdict, now) {
                                Some(BreakerStateKind::Open) => {
                                    prop_assert_eq!(verdict, BreakerVerdict::Failure);
                                    opened_at = Some(now);
                                }
                                Some(BreakerStateKind::Closed) => {
                                    prop_assert_eq!(verdict, BreakerVerdict::Success);
                                    opened_at = None;
                                }
                                _ => {}
                            }
                        }
                    }
                }
            }
        }
    }
}
