//! Stopping an attempt the call no longer waits for. The caller's outcome and the stopping of
//! the work are separate: a cancel or timeout decides the outcome at once, and the attempt's
//! future goes to a tracked task that asks the backend to stop, forces it after `cancel_grace`,
//! and emits `tool_stopped` with how it ended. A running attempt is never dropped.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, sleep};
use toolwarden_protocol::{CancelReason, EventKind, StopHow};

use crate::backend::{AttemptEnd, BoxFuture, StopSignals};
use crate::cancel::CancelScope;
use crate::events::{EventBus, EventScope};

use super::env::CallEnv;

/// How long a forced backend may take to report how it stopped before it is counted abandoned.
const FORCE_WAIT: Duration = Duration::from_secs(5);

/// A running attempt's future. If the call stops waiting for it (cancel, timeout, or the whole
/// pipeline is dropped), the future is handed to a tracked stop task instead of being dropped.
/// It borrows what only a stop needs; the stop task gets its own copies.
pub(super) struct RunningAttempt<'a> {
    fut: Option<BoxFuture<AttemptEnd>>,
    signals: StopSignals,
    grace: Duration,
    env: &'a CallEnv,
    scope: &'a Arc<EventScope>,
    call_scope: &'a CancelScope,
}

impl<'a> RunningAttempt<'a> {
    pub(super) fn new(
        fut: BoxFuture<AttemptEnd>,
        signals: StopSignals,
        grace: Duration,
        env: &'a CallEnv,
        scope: &'a Arc<EventScope>,
        call_scope: &'a CancelScope,
    ) -> Self {
        Self {
            fut: Some(fut),
            signals,
            grace,
            env,
            scope,
            call_scope,
        }
    }

    /// Waits for the attempt to end.
    pub(super) async fn wait(&mut self) -> AttemptEnd {
        match self.fut.as_mut() {
            Some(f) => f.await,
            None => std::future::pending().await,
        }
    }

    /// Polls the attempt once: a backend that answers at once (an in-process function) ends
    /// here, without the deadline machinery being set up.
    ///
    /// The poll uses a waker that does nothing. A backend that is not ready may have handed that
    /// waker to whatever it waits on, so a `None` here must be followed by a real wait
    /// ([`RunningAttempt::wait`], which polls again with the task's waker) or by a stop: never
    /// leave the attempt after this alone, or its wake-up is lost.
    pub(super) fn poll_now(&mut self) -> Option<AttemptEnd> {
        let fut = self.fut.as_mut()?;
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        match fut.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(end) => Some(end),
            std::task::Poll::Pending => None,
        }
    }

    /// The attempt ended on its own: nothing to stop.
    pub(super) fn ended(&mut self) {
        self.fut = None;
    }

    /// Asks the backend to stop and hands the attempt to a stop task.
    pub(super) fn stop_behind(&mut self, reason: CancelReason) {
        let Some(fut) = self.fut.take() else { return };
        self.signals.request_stop(reason);
        let task = track_stop(
            fut,
            self.signals.clone(),
            self.grace,
            self.env.bus.clone(),
            self.scope.clone(),
            Instant::now(),
        );
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                self.env.tracker.spawn_on(task, &handle);
            }
            // No runtime left to stop it on: force it at once.
            Err(_) => self.signals.force(),
        }
    }
}

impl Drop for RunningAttempt<'_> {
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
    bus: Arc<EventBus>,
    scope: Arc<EventScope>,
    requested: Instant,
) {
    // An answer instead of a stop is late and discarded. Within the grace it counts as the
    // backend stopping; past it, the backend ignored the cancel and kept working until it was
    // done: that call was abandoned (see `backend`'s stop contract).
    let late = |end: AttemptEnd, answered_as: StopHow| match end {
        AttemptEnd::Stopped(how) => how,
        AttemptEnd::Done(result) => {
            let is_error = !matches!(&result, Ok(out) if !out.is_error);
            bus.emit(
                &scope,
                EventKind::ToolLateResult {
                    is_error,
                    after_ms: requested.elapsed().as_millis() as u64,
                },
            );
            answered_as
        }
    };
    let (how, forced) = tokio::select! {
        end = &mut fut => (late(end, StopHow::Cooperative), false),
        () = sleep(grace) => {
            signals.force();
            let how = match tokio::time::timeout(FORCE_WAIT, fut).await {
                Ok(end) => late(end, StopHow::Abandoned),
                Err(_) => StopHow::Abandoned,
            };
            (how, true)
        }
    };
    // Cooperative, yet only once forced: nothing showed the work stop; it was found quiet at
    // the grace's end, which is the time to report.
    let found_quiet = forced && how == StopHow::Cooperative;
    let after = if found_quiet {
        grace
    } else {
        requested.elapsed()
    };
    bus.emit(
        &scope,
        EventKind::ToolStopped {
            how,
            after_ms: after.as_millis() as u64,
            found_quiet,
        },
    );
}
