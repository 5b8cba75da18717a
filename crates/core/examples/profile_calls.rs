//! Runs many governed no-op calls in a loop, for profilers (`perf record`, `valgrind --tool=callgrind`).
#![allow(
    clippy::unwrap_used,
    missing_docs,
    unsafe_code,
    clippy::disallowed_types,
    clippy::disallowed_methods
)]
use std::time::Duration;

use serde_json::{Value, json};
use toolwarden_core::protocol::ToolCall;
use toolwarden_core::{Engine, InProcessTool, ToolError};

struct Counting;
static ALLOCS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        unsafe { mimalloc::MiMalloc.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
        unsafe { mimalloc::MiMalloc.dealloc(p, l) }
    }
}
#[global_allocator]
static GLOBAL: Counting = Counting;

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(200_000);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _g = rt.enter();
    let engine = Engine::builder().jitter_seed(1).build();
    engine.register(
        InProcessTool::new(
            "noop",
            "does nothing",
            json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
            |input: Value, _ctx| async move { Ok::<_, ToolError>(input) },
        )
        .timeout(Duration::from_secs(30))
        .idle_timeout(Duration::from_secs(10))
        .attempt_timeout(Duration::from_secs(10))
        .idempotent(true)
        .retries(2)
        .cache_ttl(if std::env::var_os("NO_CACHE").is_some() {
            Duration::ZERO
        } else {
            Duration::from_secs(60)
        }),
    );
    if std::env::var_os("RING").is_some() {
        // Every event built and kept in the replay ring, as `toolwarden serve` does.
        engine.events().keep_recent(4096);
    }
    if std::env::var_os("NO_SUBSCRIBER").is_none() {
        let mut events = engine.subscribe();
        rt.spawn(async move { while events.recv().await.is_some() {} });
    }
    sizes(&engine);
    let before = ALLOCS.load(std::sync::atomic::Ordering::Relaxed);
    let t0 = std::time::Instant::now();
    rt.block_on(async {
        let mut slow = Vec::new();
        for i in 0..n {
            let t = std::time::Instant::now();
            engine
                .call("bench", ToolCall::new("c", "noop", json!({"n": i})))
                .await;
            let took = t.elapsed();
            if took > Duration::from_micros(200) {
                slow.push((i, took));
            }
        }
        eprintln!(
            "{} calls over 200 us: {:?}",
            slow.len(),
            &slow[..slow.len().min(20)]
        );
    });
    let per = (ALLOCS.load(std::sync::atomic::Ordering::Relaxed) - before) as f64 / n as f64;
    eprintln!(
        "{per:.1} allocations per call, {:.2} us per call",
        t0.elapsed().as_secs_f64() * 1e6 / n as f64
    );
}

#[allow(dead_code)]
fn sizes(engine: &Engine) {
    let f = engine.call("s", ToolCall::new("c", "noop", json!({})));
    eprintln!("Engine::call future: {} bytes", std::mem::size_of_val(&f));
}
