//! The engine's overhead: a governed no-op call with every policy on, against calling the same
//! function directly, and a 100-call parallel turn.
//!
//! `cargo bench -p toolwarden-core --bench engine`
//!
//! Every policy is on for the governed call: total, idle and attempt deadlines, the breaker,
//! retries (idempotent), the cache (a miss: every input differs), the loop detector, schema
//! validation, events (with a live subscriber draining them) and metrics. Both variants run the
//! same way (one `block_on` per call on a current-thread runtime) so the difference is the
//! engine's.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use divan::Bencher;
use serde_json::{Value, json};
use toolwarden_core::protocol::{Timestamp, ToolCall};
use toolwarden_core::{Engine, InProcessTool, ToolError, TurnRequest};

fn main() {
    divan::main();
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn noop(input: Value) -> Result<Value, ToolError> {
    Ok(input)
}

fn schema() -> Value {
    json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
}

/// What the governed no-op call has on.
#[derive(Clone, Copy)]
struct Features {
    cache: bool,
    subscriber: bool,
}

const EVERYTHING: Features = Features {
    cache: true,
    subscriber: true,
};

fn engine(rt: &tokio::runtime::Runtime) -> Engine {
    engine_with(rt, EVERYTHING)
}

fn engine_with(rt: &tokio::runtime::Runtime, f: Features) -> Engine {
    let _guard = rt.enter();
    let engine = Engine::builder().jitter_seed(1).build();
    let tool = InProcessTool::new("noop", "does nothing", schema(), |input, _ctx| noop(input))
        .timeout(Duration::from_secs(30))
        .idle_timeout(Duration::from_secs(10))
        .attempt_timeout(Duration::from_secs(10))
        .idempotent(true)
        .retries(2)
        .breaker(5, Duration::from_secs(60), Duration::from_secs(30));
    engine.register(if f.cache {
        tool.cache_ttl(Duration::from_secs(60))
    } else {
        tool
    });
    if f.subscriber {
        // A live subscriber, so every event is built and delivered.
        let mut events = engine.subscribe();
        rt.spawn(async move { while events.recv().await.is_some() {} });
    }
    engine
}

static N: AtomicU64 = AtomicU64::new(0);

fn next_input() -> Value {
    json!({"n": N.fetch_add(1, Ordering::Relaxed)})
}

#[divan::bench(sample_count = 1000)]
fn direct_call(bencher: Bencher) {
    let rt = runtime();
    bencher
        .with_inputs(next_input)
        .bench_local_values(|input| rt.block_on(noop(input)));
}

#[divan::bench(sample_count = 1000)]
fn governed_call(bencher: Bencher) {
    let rt = runtime();
    let engine = engine(&rt);
    bencher
        .with_inputs(|| ToolCall::new("c", "noop", next_input()))
        .bench_local_values(|call| rt.block_on(engine.call("bench", call)));
}

/// The same call without the cache (no lookup, no store) and with nobody watching events.
#[divan::bench(sample_count = 1000)]
fn governed_call_no_cache_no_subscriber(bencher: Bencher) {
    let rt = runtime();
    let engine = engine_with(
        &rt,
        Features {
            cache: false,
            subscriber: false,
        },
    );
    bencher
        .with_inputs(|| ToolCall::new("c", "noop", next_input()))
        .bench_local_values(|call| rt.block_on(engine.call("bench", call)));
}

/// With the cache, without a subscriber.
#[divan::bench(sample_count = 1000)]
fn governed_call_no_subscriber(bencher: Bencher) {
    let rt = runtime();
    let engine = engine_with(
        &rt,
        Features {
            cache: true,
            subscriber: false,
        },
    );
    bencher
        .with_inputs(|| ToolCall::new("c", "noop", next_input()))
        .bench_local_values(|call| rt.block_on(engine.call("bench", call)));
}

#[divan::bench(sample_count = 200)]
fn turn_of_100_calls(bencher: Bencher) {
    let rt = runtime();
    let engine = engine(&rt);
    bencher
        .with_inputs(|| {
            let calls = (0..100)
                .map(|i| ToolCall::new(format!("c{i}"), "noop", next_input()))
                .collect();
            TurnRequest::new("bench", calls)
        })
        .bench_local_values(|req| rt.block_on(engine.run_turn(req)).unwrap());
}

#[divan::bench]
fn timestamp_now() -> Timestamp {
    Timestamp::now()
}
