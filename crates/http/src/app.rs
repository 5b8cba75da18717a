//! What every handler shares.

use std::time::Duration;

use toolwarden_core::Engine;

/// The state of every route: the engine and the settings handlers read.
#[derive(Clone)]
pub(crate) struct App {
    pub(crate) engine: Engine,
    pub(crate) keep_alive: Duration,
    /// `[auth.oauth]`, for its resource metadata.
    pub(crate) oauth: Option<std::sync::Arc<crate::oauth::OAuth>>,
}
