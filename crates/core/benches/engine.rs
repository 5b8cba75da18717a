//! The engine's overhead: a governed no-op call with every policy on, against calling the same
//! function directly, and a 100-call parallel turn.
//!
//! `cargo bench -p toolwarden-core --bench engine`
//!
//! Every policy is on for the governed call: total, idle and attempt deadlines, the breaker,
//! retries (idempotent), the cache (a miss: every input differs), the loop detector, schema
//! validation, events (built and kept in the replay ring, as `toolwarden serve` does) and
//! metrics. Variants turn features off, or add a live subscriber on another thread. Every
//! variant runs the same way (one `block_on` per call on a current-thread runtime, mimalloc as in
//! the shipped binary) so differences are the engine's.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
#![allow(
    clippy::disallowed_methods,
    reason = "the subscriber thread blocks on its own runtime"
)]

use std::time::Duration;

use divan::Bencher;
use serde_json::{Value, json};
use toolwarden_core::protocol::{Timestamp, ToolCall};
use toolwarden_core::{Engine, InProcessTool, ToolError, TurnRequest};

#[path = "support/calls.rs"]
mod calls;
use calls::{next_input, runtime, session};

fn main() {
    divan::main();
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
    /// Every event is built and kept in the replay ring, as `toolwarden serve` does.
    ring: bool,
    /// A live subscriber on another thread is woken for every event.
    subscriber: bool,
}

const EVERYTHING: Features = Features {
    cache: true,
    ring: true,
    subscriber: false,
};

fn engine(rt: &tokio::runtime::Runtime, f: Features) -> Engine {
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
    if f.ring {
        engine.events().keep_recent(4096);
    }
    if f.subscriber {
        // A live subscriber on its own thread (as an SSE stream is): every event wakes it.
        let mut events = engine.subscribe();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            rt.block_on(async move { while events.recv().await.is_some() {} });
        });
    }
    engine
}

fn governed(bencher: Bencher, f: Features) {
    let rt = runtime();
    let engine = engine(&rt, f);
    calls::governed_noop(bencher, &rt, &engine);
}

#[divan::bench(sample_count = 2000)]
fn direct_call(bencher: Bencher) {
    let rt = runtime();
    bencher
        .with_inputs(next_input)
        .bench_local_values(|input| rt.block_on(noop(input)));
}

/// Every policy on.
#[divan::bench(sample_count = 2000)]
fn governed_call(bencher: Bencher) {
    governed(bencher, EVERYTHING);
}

/// Every policy on, events neither kept nor watched.
#[divan::bench(sample_count = 2000)]
fn governed_call_no_events(bencher: Bencher) {
    governed(
        bencher,
        Features {
            ring: false,
            ..EVERYTHING
        },
    );
}

/// No cache, no events: the pipeline alone.
#[divan::bench(sample_count = 2000)]
fn governed_call_no_cache_no_events(bencher: Bencher) {
    governed(
        bencher,
        Features {
            cache: false,
            ring: false,
            subscriber: false,
        },
    );
}

/// Every policy on, and a live subscriber on another thread woken for every event.
#[divan::bench(sample_count = 2000)]
fn governed_call_live_subscriber(bencher: Bencher) {
    governed(
        bencher,
        Features {
            subscriber: true,
            ..EVERYTHING
        },
    );
}

fn turn(bencher: Bencher, f: Features) {
    let rt = runtime();
    let engine = engine(&rt, f);
    bencher
        .with_inputs(|| {
            let calls = (0..100)
                .map(|i| ToolCall::new(format!("c{i}"), "noop", next_input()))
                .collect();
            TurnRequest::new(session(), calls)
        })
        .bench_local_values(|req| rt.block_on(engine.run_turn(req)).unwrap());
}

/// One turn of 100 calls, every policy on.
#[divan::bench(sample_count = 300)]
fn turn_of_100_calls(bencher: Bencher) {
    turn(bencher, EVERYTHING);
}

/// The same turn with nothing kept beyond it: no cache, no events.
#[divan::bench(sample_count = 300)]
fn turn_of_100_calls_no_cache_no_events(bencher: Bencher) {
    turn(
        bencher,
        Features {
            cache: false,
            ring: false,
            subscriber: false,
        },
    );
}

#[divan::bench]
fn timestamp_now() -> Timestamp {
    Timestamp::now()
}
