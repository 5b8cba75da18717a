//! The exporter's settings and counters.

use prometheus_client::metrics::counter::Counter;

/// How many finished spans wait for export at most; past it, new spans are dropped and counted.
pub const QUEUE_CAPACITY: usize = 8192;

/// The exporter's settings.
#[derive(Clone, Debug)]
pub struct OtelOptions {
    /// The collector's OTLP/HTTP base URL; spans are posted to `ENDPOINT/v1/traces`.
    pub endpoint: String,
    /// How many spans wait for export at most (default [`QUEUE_CAPACITY`]).
    pub queue_capacity: usize,
    /// How long spans wait to be sent in one batch (default 1 s).
    pub batch_delay: std::time::Duration,
    /// The most spans of one export request (default 512).
    pub batch_size: usize,
}

impl OtelOptions {
    /// The defaults, sending to `endpoint`.
    pub fn new(endpoint: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            queue_capacity: QUEUE_CAPACITY,
            batch_delay: std::time::Duration::from_secs(1),
            batch_size: 512,
        }
    }
}

/// Counters of the exporter, registered with the engine's metrics by [`SpanSink::register_metrics`].
#[derive(Clone, Debug, Default)]
pub(crate) struct Counters {
    pub(crate) exported: Counter,
    pub(crate) dropped: Counter,
    pub(crate) failed: Counter,
}
