//! Progress pacing: a call's backend progress becomes `tool_progress` events at most four times
//! a second, and a running call reports at least every 5 s even when its backend says nothing
//! (so a watcher sees it is alive and how long it has run).

use std::time::Duration;

use tokio::time::Instant;

/// At most this often a call's backend progress becomes a `tool_progress` event.
pub(super) const PROGRESS_MIN_GAP: Duration = Duration::from_millis(250);
/// A running call emits `tool_progress` at least this often.
pub(super) const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// When the next `tool_progress` of one attempt is due.
pub(super) struct Pacer {
    /// When the last `tool_progress` went out (the attempt's start before the first).
    last_emit: Instant,
    /// Whether anything went out yet: the first report goes out at once.
    emitted: bool,
    /// A report arrived too soon after the last one and waits for its turn.
    flush: bool,
}

impl Pacer {
    /// The pacer of an attempt that started at `start`.
    pub(super) fn new(start: Instant) -> Self {
        Self {
            last_emit: start,
            emitted: false,
            flush: false,
        }
    }

    /// When a report is due: a held-back one after the minimum gap, else the periodic one.
    pub(super) fn next_due(&self) -> Instant {
        self.last_emit
            + if self.flush {
                PROGRESS_MIN_GAP
            } else {
                PROGRESS_EVERY
            }
    }

    /// Whether a report arriving `now` may go out at once.
    pub(super) fn may_emit(&self, now: Instant) -> bool {
        !self.emitted || now >= self.last_emit + PROGRESS_MIN_GAP
    }

    /// A report arrived too early: it goes out when [`Pacer::next_due`] says.
    pub(super) fn hold(&mut self) {
        self.flush = true;
    }

    /// A report went out `now`.
    pub(super) fn emitted_at(&mut self, now: Instant) {
        *self = Pacer {
            last_emit: now,
            emitted: true,
            flush: false,
        };
    }
}
