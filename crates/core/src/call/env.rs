//! What a call borrows from its engine: the event bus, the cache, retry jitter, the tracker of
//! stop tasks, the interaction broker, the audit trail and the state shared with other replicas —
//! nothing more. The pipeline can run on a `CallEnv`
//! made by hand, without an engine around it.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use tokio_util::task::TaskTracker;
use toolwarden_protocol::{BreakerStateKind, EventKind};

use crate::cache::Cache;
use crate::events::{EventBus, EventScope};
use crate::interaction::Interactions;
use crate::registry::ToolEntry;
use crate::retry::Jitter;
use crate::shared::{BreakerChange, SharedState};
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
    /// State shared with other replicas, if any (docs/SCALE-OUT.md).
    pub(crate) shared: Option<Arc<dyn SharedState>>,
    /// Whether any registered tool is exclusive: only then do a named session's calls take their
    /// place in its gate across replicas (kept by the registry).
    pub(crate) exclusive_tools: Arc<AtomicBool>,
    /// Whether spans are exported: each turn then gets its own span id (see [`crate::trace`]).
    pub(crate) export_spans: bool,
    /// The `[[rules]]`, `[hooks]` and `[[quotas]]` in force (kept by the registry).
    pub(crate) guards: crate::registry::GuardsCell,
    /// How hooks are reached.
    pub(crate) hook_transport: Option<Arc<dyn crate::hooks::HookTransport>>,
    /// The engine's metrics (hooks and quotas count into them).
    pub(crate) metrics: Arc<crate::metrics::Metrics>,
    /// Every tool's pinned definition, and the changes waiting to be accepted.
    pub(crate) pins: Arc<crate::pins::Pins>,
}

impl CallEnv {
    /// What a tool's breaker said when it admitted or counted a call: when its state changed,
    /// its gauge and a `breaker_state` event say so, and other replicas learn it (opened and
    /// closed; each moves to half-open on its own clock).
    pub(crate) fn breaker_changed(
        &self,
        entry: &ToolEntry,
        scope: &Arc<EventScope>,
        change: Option<BreakerStateKind>,
        open_for: std::time::Duration,
    ) {
        let Some(state) = change else { return };
        entry.runtime.metrics.breaker(state);
        self.bus.emit(scope, EventKind::BreakerState { state });
        if let Some(shared) = &self.shared {
            let tool = &*entry.name;
            match state {
                BreakerStateKind::Open => {
                    shared.breaker_changed(tool, BreakerChange::Open { for_: open_for });
                }
                BreakerStateKind::Closed => shared.breaker_changed(tool, BreakerChange::Closed),
                BreakerStateKind::HalfOpen => {}
            }
        }
    }
}
