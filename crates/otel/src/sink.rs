//! The event sink that assembles spans on the event path and queues them, and the start of the
//! export task.

use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::mpsc;
use toolwarden_core::{EventSink, Metrics};
use toolwarden_protocol::{Event, EventKind};

use crate::assemble::{Assembler, SpanRecord};
use crate::encode::Resolver;
use crate::export::{self, ExportHandle};
use crate::options::{Counters, OtelOptions};

/// The event sink that builds spans; give it to `EngineBuilder::trace_sink`.
pub struct SpanSink {
    assembler: Mutex<Assembler>,
    queue: mpsc::Sender<SpanRecord>,
    counters: Counters,
}

impl std::fmt::Debug for SpanSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpanSink").finish_non_exhaustive()
    }
}

impl SpanSink {
    /// Registers the exporter's counters with `metrics` (`toolwarden_otel_spans_*`).
    pub fn register_metrics(&self, metrics: &Metrics) {
        metrics.register(
            "otel_spans_exported",
            "Spans accepted by the OTLP collector",
            self.counters.exported.clone(),
        );
        metrics.register(
            "otel_spans_dropped",
            "Spans dropped because the export queue was full",
            self.counters.dropped.clone(),
        );
        metrics.register(
            "otel_spans_failed",
            "Spans whose export request failed",
            self.counters.failed.clone(),
        );
    }
}

impl EventSink for SpanSink {
    fn record(&self, event: &Arc<Event>) {
        // Most events (progress, interactions, servers) make no span: skip them before locking.
        if !matches!(
            event.kind,
            EventKind::TurnStart { trace: Some(_), .. }
                | EventKind::TurnEnd { .. }
                | EventKind::ToolStart { .. }
                | EventKind::ToolRetry { .. }
                | EventKind::ToolResult { .. }
        ) {
            return;
        }
        let mut done = Vec::new();
        self.assembler.lock().take(event, &mut done);
        for span in done {
            if self.queue.try_send(span).is_err() {
                self.counters.dropped.inc();
            }
        }
    }
}

/// Starts the exporter on the current tokio runtime: the sink to hand the engine, and the
/// handle that flushes and stops the export task at shutdown. `resolve` tells where a tool runs
/// (the engine's `tool_backing`), to name attempt spans; it is called off the event path.
pub fn start(options: OtelOptions, resolve: Resolver) -> (Arc<SpanSink>, ExportHandle) {
    let (tx, rx) = mpsc::channel(options.queue_capacity.max(1));
    let counters = Counters::default();
    let sink = Arc::new(SpanSink {
        assembler: Mutex::new(Assembler::default()),
        queue: tx,
        counters: counters.clone(),
    });
    let handle = export::spawn(options, resolve, rx, counters);
    (sink, handle)
}
