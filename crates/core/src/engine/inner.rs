//! What one engine is made of; every [`Engine`](super::Engine) clone and its backend host share it.

use std::sync::Arc;

use crate::inproc::InProcessBackend;
use crate::registry::Registry;
use crate::servers::Servers;
use crate::turn::TurnRuntime;

/// The parts of an engine: its tools, its turns (and what their calls borrow), its servers'
/// states, and the in-process backend.
pub(super) struct EngineInner {
    pub(super) registry: Arc<Registry>,
    pub(super) turns: Arc<TurnRuntime>,
    pub(super) servers: Arc<Servers>,
    pub(super) inproc: Arc<InProcessBackend>,
    /// Other replicas' events, for the front doors' event streams.
    pub(super) remote_events: tokio::sync::broadcast::Sender<crate::shared::RemoteEvent>,
    /// How the front door that holds tasks answers their `tasks/update` (other replicas' too).
    pub(super) task_answerer: parking_lot::RwLock<Option<Arc<crate::shared::TaskAnswerer>>>,
}
