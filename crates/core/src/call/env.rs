//! What a call borrows from its engine: the event bus, the cache, retry jitter, the tracker of
//! stop tasks, the interaction broker and the audit trail — nothing more. The pipeline can run on a `CallEnv`
//! made by hand, without an engine around it.

use std::sync::Arc;

use tokio_util::task::TaskTracker;
use toolwarden_protocol::{BreakerStateKind, EventKind};

use crate::cache::Cache;
use crate::events::{EventBus, EventScope};
use crate::interaction::Interactions;
use crate::registry::ToolRuntime;
use crate::retry::Jitter;
use crate::store::StoreHook;

/// The environment every call of an engine shares.
pub(crate) struct CallEnv {
    pub(crate) bus: Arc<EventBus>,
    pub(crate) cache: Cache,
    pub(crate) jitter: Jitter,
    /// Stop tasks run on it, so that shutdown can wait for them.
    pub(crate) tracker: TaskTracker,
    pub(crate) interactions: Interactions,
    /// The audit trail, if any: a call's backend may have to wait for its `tool_start` to be
    /// committed.
    pub(crate) store: Option<StoreHook>,
}

impl CallEnv {
    /// A tool's breaker changed state: its gauge and a `breaker_state` event say so.
    pub(crate) fn breaker_changed(
        &self,
        runtime: &ToolRuntime,
        scope: &Arc<EventScope>,
        state: BreakerStateKind,
    ) {
        runtime.metrics.breaker(state);
        self.bus.emit(scope, EventKind::BreakerState { state });
    }
}
