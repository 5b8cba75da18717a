//! Deadlines hold under load: with 10,000 calls in flight, how late does each deadline fire?
//!
//! `cargo bench -p toolwarden-core --bench deadlines`
//!
//! 10,000 calls to a tool that never answers (it waits for its cancel) start together on a
//! multi-thread runtime; their `timeout`s are spread over 1–3 s. For every call we take the time
//! its outcome reached the caller minus the time its deadline fell (the tool's start plus the
//! timeout). The target: every deadline fires within 20 ms of its time (docs/PERFORMANCE.md).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::disallowed_types,
    clippy::disallowed_methods,
    missing_docs
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::json;
use toolwarden_core::protocol::{Status, ToolCall};
use toolwarden_core::{Engine, InProcessTool, ToolError, TurnRequest};

const CALLS: usize = 10_000;

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run());
}

async fn run() {
    let starts: Arc<Mutex<Vec<Option<Instant>>>> = Arc::new(Mutex::new(vec![None; CALLS]));
    let engine = Engine::new();
    let seen = starts.clone();
    engine.register(
        InProcessTool::new(
            "wait",
            "waits until cancelled",
            json!({"type": "object", "properties": {"i": {"type": "integer"}}}),
            move |input, ctx| {
                let i = input["i"].as_u64().unwrap() as usize;
                seen.lock()[i] = Some(Instant::now());
                async move {
                    ctx.cancelled().await;
                    Err::<String, _>(ToolError::new("cancelled"))
                }
            },
        )
        .loop_detection(0, 0)
        .cancel_grace(Duration::from_millis(100)),
    );
    let mut waiters = Vec::with_capacity(CALLS);
    for i in 0..CALLS {
        let timeout_ms = 1_000 + (i as u64 * 2_000 / CALLS as u64);
        let call = ToolCall::new("c", "wait", json!({"i": i})).with_timeout_ms(timeout_ms);
        let mut handle = engine
            .start_turn(TurnRequest::new(format!("s{}", i % 64), vec![call]))
            .unwrap();
        waiters.push(tokio::spawn(async move {
            let (_, result) = handle.next_completed().await.unwrap();
            let arrived = Instant::now();
            handle.detach();
            (i, timeout_ms, arrived, result.outcome.status.clone())
        }));
    }
    let mut lateness = Vec::with_capacity(CALLS);
    for w in waiters {
        let (i, timeout_ms, arrived, status) = w.await.unwrap();
        assert!(
            matches!(status, Status::Timeout { .. }),
            "call {i}: {status:?}"
        );
        let start = starts.lock()[i].expect("the tool ran");
        let deadline = start + Duration::from_millis(timeout_ms);
        lateness.push(arrived.saturating_duration_since(deadline));
    }
    lateness.sort();
    let pct = |p: f64| lateness[((lateness.len() as f64 - 1.0) * p) as usize];
    println!(
        "deadline lateness over {CALLS} calls in flight (outcome at the caller minus deadline):"
    );
    println!("  p50 {:>8.3} ms", pct(0.50).as_secs_f64() * 1e3);
    println!("  p99 {:>8.3} ms", pct(0.99).as_secs_f64() * 1e3);
    println!("  max {:>8.3} ms", pct(1.0).as_secs_f64() * 1e3);
    let over = lateness
        .iter()
        .filter(|d| **d > Duration::from_millis(20))
        .count();
    println!("  later than 20 ms: {over}");
    engine.shutdown(Duration::from_secs(5)).await;
}
