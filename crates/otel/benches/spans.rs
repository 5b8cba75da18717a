//! What traces cost a call: the engine's governed no-op call (and a 100-call turn) with
//! `[otel]` off and on, side by side in one run.
//!
//! `cargo bench -p toolwarden-otel --bench spans`
//!
//! "On" is what `toolwarden serve` wires: the span sink on the engine's bus, every turn given a
//! span id, every attempt its traceparent, and the export task batching and posting the spans to
//! an OTLP/HTTP receiver (a local axum server that answers 200). The export task and the
//! receiver run on a runtime of their own on another thread, as the export task runs beside the
//! calls in the server; the calls run as in the engine's own bench (one `block_on` per call on a
//! current-thread runtime, mimalloc as in the shipped binary), with every event kept in the
//! replay ring as `serve` does. Variants of one run differ only by the sink.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use divan::Bencher;
use serde_json::{Value, json};
use toolwarden_core::protocol::ToolCall;
use toolwarden_core::{Engine, InProcessTool, ToolError, TurnRequest};

#[path = "../../core/benches/support/calls.rs"]
mod calls;
use calls::{next_input, runtime, session};

fn main() {
    divan::main();
}

/// The runtime of the export task and the receiver, on threads of its own (made once), and the
/// receiver's URL.
fn collector() -> &'static (tokio::runtime::Runtime, String) {
    static COLLECTOR: OnceLock<(tokio::runtime::Runtime, String)> = OnceLock::new();
    COLLECTOR.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let url = rt.block_on(async {
            let app = axum::Router::new().route(
                "/v1/traces",
                axum::routing::post(|_body: axum::body::Bytes| async { "" }),
            );
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}", listener.local_addr().unwrap());
            tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
            url
        });
        (rt, url)
    })
}

async fn noop(input: Value) -> Result<Value, ToolError> {
    Ok(input)
}

fn engine(rt: &tokio::runtime::Runtime, otel: bool) -> Engine {
    let mut builder = Engine::builder().jitter_seed(1);
    if otel {
        let (collector_rt, url) = collector();
        let _guard = collector_rt.enter();
        let (sink, handle) = toolwarden_otel::start(
            toolwarden_otel::OtelOptions::new(url.clone()),
            Arc::new(|_: &str| None),
        );
        // The export task lives as long as the bench process.
        std::mem::forget(handle);
        builder = builder.trace_sink(sink);
    }
    let _guard = rt.enter();
    let engine = builder.build();
    engine.register(
        InProcessTool::new(
            "noop",
            "does nothing",
            json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
            |input, _ctx| noop(input),
        )
        .timeout(Duration::from_secs(30))
        .idle_timeout(Duration::from_secs(10))
        .attempt_timeout(Duration::from_secs(10))
        .idempotent(true)
        .retries(2)
        .cache_ttl(Duration::from_secs(60))
        .breaker(5, Duration::from_secs(60), Duration::from_secs(30)),
    );
    engine.events().keep_recent(4096);
    engine
}

fn governed(bencher: Bencher, otel: bool) {
    let rt = runtime();
    let engine = engine(&rt, otel);
    calls::governed_noop(bencher, &rt, &engine);
}

fn turn(bencher: Bencher, otel: bool) {
    let rt = runtime();
    let engine = engine(&rt, otel);
    bencher
        .with_inputs(|| {
            (0..100)
                .map(|i| ToolCall::new(format!("c{i}"), "noop", next_input()))
                .collect::<Vec<_>>()
        })
        .bench_local_values(|calls| {
            rt.block_on(engine.run_turn(TurnRequest::new(session(), calls)))
                .unwrap()
        });
}

#[divan::bench(sample_count = 2000, args = [false, true])]
fn governed_call_otel(bencher: Bencher, on: bool) {
    governed(bencher, on);
}

#[divan::bench(sample_count = 300, args = [false, true])]
fn turn_of_100_calls_otel(bencher: Bencher, on: bool) {
    turn(bencher, on);
}
