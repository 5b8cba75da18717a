//! Retries (docs/GOVERNANCE.md, "Retries"): capped exponential backoff with full jitter, only for
//! idempotent tools and only after retryable failures — an attempt timeout, a transport error, a
//! crash or restart of the server (and the tool's own error with `retry_on_tool_error`). Never
//! after a cancellation, a denial, invalid input, an open breaker or the total deadline; never when
//! the backoff would end past the total deadline.

use std::time::Duration;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use toolwarden_protocol::Backoff;

/// The cap of the sleep before retry number `n` (0 for the first retry):
/// `min(max, initial · multiplier^n)`.
pub(crate) fn backoff_cap(backoff: &Backoff, n: u32) -> Duration {
    let factor = backoff.multiplier.max(1.0).powi(n.min(1000) as i32);
    let cap = backoff.initial.as_secs_f64() * factor;
    if !cap.is_finite() || cap >= backoff.max.as_secs_f64() {
        backoff.max
    } else {
        Duration::from_secs_f64(cap)
    }
}

/// The source of jitter. Seedable, so tests can be exact.
pub(crate) struct Jitter {
    rng: Mutex<StdRng>,
}

impl Jitter {
    pub(crate) fn new(seed: Option<u64>) -> Self {
        let rng = match seed {
            Some(s) => StdRng::seed_from_u64(s),
            None => StdRng::try_from_os_rng().unwrap_or_else(|_| {
                // No OS entropy: jitter still spreads retries out, seeded by the clock.
                StdRng::seed_from_u64(toolwarden_protocol::Timestamp::now().unix_millis() as u64)
            }),
        };
        Self {
            rng: Mutex::new(rng),
        }
    }

    /// Full jitter: a uniform sleep in `[0, cap]`, at millisecond resolution.
    pub(crate) fn delay(&self, backoff: &Backoff, n: u32) -> Duration {
        let cap = backoff_cap(backoff, n).as_millis().min(u64::MAX as u128) as u64;
        if cap == 0 {
            return Duration::ZERO;
        }
        Duration::from_millis(self.rng.lock().random_range(0..=cap))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec_default() -> Backoff {
        Backoff::default()
    }

    #[test]
    fn caps_grow_exponentially_up_to_max() {
        let b = spec_default();
        let caps: Vec<u128> = (0..8).map(|n| backoff_cap(&b, n).as_millis()).collect();
        assert_eq!(caps, vec![200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
    }

    #[test]
    fn jitter_stays_within_the_cap_and_varies() {
        let b = spec_default();
        let j = Jitter::new(Some(7));
        let delays: Vec<Duration> = (0..200).map(|_| j.delay(&b, 3)).collect();
        assert!(delays.iter().all(|d| *d <= Duration::from_millis(1600)));
        let distinct: std::collections::BTreeSet<_> = delays.iter().collect();
        assert!(distinct.len() > 50, "full jitter spreads retries out");
    }

    #[test]
    fn huge_exponents_saturate_at_max() {
        let b = Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(60),
            multiplier: 10.0,
        };
        assert_eq!(backoff_cap(&b, 400), Duration::from_secs(60));
    }
}
