//! The table of the `task` tool's tasks: what `State` keeps of them, below both the state and
//! the tool's logic (`tasks`), so that neither depends on the other both ways.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use parking_lot::Mutex;
use rmcp::ErrorData as McpError;
use rmcp::model::{DetailedTask, InputResponses, Task, TaskPayload};
use serde_json::Value;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// A fixed stamp: the test server keeps no clock of record.
pub(crate) const STAMP: &str = "2026-01-01T00:00:00Z";

/// The tasks the server runs.
#[derive(Default)]
pub(crate) struct Tasks {
    pub(crate) next: AtomicU64,
    pub(crate) all: Mutex<HashMap<String, Arc<Entry>>>,
}

pub(crate) struct Entry {
    pub(crate) request_id: Value,
    pub(crate) poll_ms: u64,
    pub(crate) state: Mutex<Current>,
    pub(crate) cancel: CancellationToken,
    pub(crate) answered: Notify,
}

pub(crate) struct Current {
    pub(crate) payload: TaskPayload,
    pub(crate) message: Option<String>,
    pub(crate) responses: Option<InputResponses>,
}

impl Entry {
    pub(crate) fn set(&self, payload: TaskPayload, message: Option<String>) {
        let mut current = self.state.lock();
        current.payload = payload;
        current.message = message;
    }

    pub(crate) fn detailed(&self, id: &str) -> DetailedTask {
        let current = self.state.lock();
        let mut task = Task::new(id, current.payload.status(), STAMP, STAMP)
            .with_poll_interval_ms(self.poll_ms);
        task.status_message = current.message.clone();
        DetailedTask::new(task, current.payload.clone())
    }
}

pub(crate) fn unknown(id: &str) -> McpError {
    McpError::invalid_params(format!("no task {id:?}"), None)
}

impl Tasks {
    pub(crate) fn get(&self, id: &str) -> Result<Arc<Entry>, McpError> {
        self.all.lock().get(id).cloned().ok_or_else(|| unknown(id))
    }
}
