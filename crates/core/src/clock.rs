//! Wall-clock stamps derived from the monotonic clock.
//!
//! A call already reads the monotonic clock where its events happen (arrival, start, end); the
//! wall-clock time of those moments is that reading plus an offset taken from the wall clock at
//! most once a second, instead of a second clock read per event. Stamps of one second's events
//! are thereby consistent with each other and with the durations they report; the offset follows
//! the wall clock (NTP steps included) within a second.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use toolwarden_protocol::Timestamp;

/// How long an offset is used before the wall clock is read again.
const REFRESH: Duration = Duration::from_secs(1);

/// Turns monotonic instants into wall-clock timestamps.
#[derive(Debug)]
pub(crate) struct WallClock {
    base: Instant,
    /// Wall-clock microseconds at `base`, as last measured.
    offset_us: AtomicI64,
    /// Microseconds after `base` of the instant the offset was last measured at.
    measured_us: AtomicU64,
}

impl WallClock {
    pub(crate) fn new() -> Self {
        let base = Instant::now();
        Self {
            base,
            offset_us: AtomicI64::new(Timestamp::now_unix_micros()),
            measured_us: AtomicU64::new(0),
        }
    }

    /// The wall-clock time of `at`, a recent instant.
    pub(crate) fn stamp(&self, at: Instant) -> Timestamp {
        let since = at.saturating_duration_since(self.base).as_micros() as u64;
        let measured = self.measured_us.load(Ordering::Relaxed);
        // Only a later instant measures the offset again: an earlier one (an event stamped with
        // the moment it happened, a little before) is not "now" and takes the offset as it is.
        let offset = if since > measured.saturating_add(REFRESH.as_micros() as u64) {
            // Racing refreshes store near-identical values; any of them will do.
            let offset = Timestamp::now_unix_micros() - since as i64;
            self.offset_us.store(offset, Ordering::Relaxed);
            self.measured_us.store(since, Ordering::Relaxed);
            offset
        } else {
            self.offset_us.load(Ordering::Relaxed)
        };
        Timestamp::from_unix_micros(offset + since as i64)
    }

    /// The wall-clock time now.
    pub(crate) fn now(&self) -> Timestamp {
        self.stamp(Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn stamps_follow_the_wall_clock() {
        let clock = WallClock::new();
        let before = Timestamp::now().unix_millis();
        let stamp = clock.now().unix_millis();
        let after = Timestamp::now().unix_millis();
        assert!(
            (before - 1..=after + 1).contains(&stamp),
            "{before} <= {stamp} <= {after}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn stamps_of_one_second_keep_their_distances() {
        let clock = WallClock::new();
        let t0 = Instant::now();
        let a = clock.stamp(t0);
        let b = clock.stamp(t0 + Duration::from_millis(250));
        assert_eq!(b.unix_millis() - a.unix_millis(), 250);
        // Long after, the offset is measured again and the stamp is still near the wall clock.
        tokio::time::advance(Duration::from_secs(30)).await;
        let late = clock.now().unix_millis();
        let wall = Timestamp::now().unix_millis();
        assert!((late - wall).abs() <= 2, "{late} vs {wall}");
        // An instant from before the last measurement keeps its distance to it.
        let earlier = clock
            .stamp(Instant::now() - Duration::from_secs(5))
            .unix_millis();
        assert_eq!(late - earlier, 5000);
    }
}
