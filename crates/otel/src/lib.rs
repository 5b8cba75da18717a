//! Traces of toolwarden over OTLP/HTTP: a span per turn, per call and per attempt.
//!
//! The key design choice: **spans are built from the engine's events, not by the engine.** The
//! exporter is an [`EventSink`] on the engine's bus. The call path does nothing for traces when
//! `[otel]` is off; when it is on, the engine only gives each turn a random span id (the call
//! and attempt spans' ids are derived from it, see `toolwarden_core::call_span`) and the sink
//! moves a few `Arc`s through a map per event. Finished spans go into a bounded queue; a
//! background task batches them, encodes them as OTLP protobuf and posts them to
//! `ENDPOINT/v1/traces`. A full queue drops spans and counts them
//! (`toolwarden_otel_spans_dropped_total`): exporting never slows or blocks a call.
//!
//! Protobuf types come from `opentelemetry-proto` (its generated messages only: no SDK
//! pipeline, no gRPC); requests go through the `reqwest` client the binary already carries for
//! MCP servers over HTTP, so tracing adds little to the binary.
#![deny(missing_docs)]

mod assemble;
mod encode;
mod export;
mod options;
mod sink;

pub use encode::Resolver;
pub use export::ExportHandle;
pub use options::{OtelOptions, QUEUE_CAPACITY};
pub use sink::{SpanSink, start};
