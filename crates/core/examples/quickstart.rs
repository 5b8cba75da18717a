//! A governed turn in a few lines: four in-process tools, one model turn, every rule at work.
//!
//! `cargo run -p toolwarden-core --example quickstart`
//!
//! The turn asks for four calls at once: a quick sum, a report that reports progress, a flaky
//! fetch that fails twice before it works (retried with jitter, then cached), and a tool that
//! hangs and ignores cancellation (stopped by its deadline; its thread is abandoned, not waited
//! for). Results stream in as they complete; the turn still answers one result per call, in order.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde_json::json;
use toolwarden_core::protocol::{EventKind, ToolCall};
use toolwarden_core::{Engine, InProcessTool, Received, ToolError, TurnRequest};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let engine = Engine::new();
    let object = |props: serde_json::Value, required: &[&str]| json!({"type": "object", "properties": props, "required": required});

    engine.register(InProcessTool::new(
        "add",
        "Adds two integers",
        object(
            json!({"a": {"type": "integer"}, "b": {"type": "integer"}}),
            &["a", "b"],
        ),
        |input, _ctx| async move {
            Ok::<_, ToolError>(
                (input["a"].as_i64().unwrap_or(0) + input["b"].as_i64().unwrap_or(0)).to_string(),
            )
        },
    ));

    engine.register(
        InProcessTool::new(
            "report",
            "Writes a report, slowly",
            object(json!({}), &[]),
            |_input, ctx| async move {
                for step in 1..=4 {
                    tokio::select! {
                        () = ctx.cancelled() => return Err(ToolError::new("stopped")),
                        () = tokio::time::sleep(Duration::from_millis(300)) => {}
                    }
                    ctx.progress(
                        f64::from(step),
                        Some(4.0),
                        Some(&format!("section {step} of 4")),
                    );
                }
                Ok("The report is done.")
            },
        )
        // No progress for 1 s cancels it; progress every 300 ms keeps it alive.
        .idle_timeout(Duration::from_secs(1)),
    );

    let attempts = Arc::new(AtomicU32::new(0));
    let seen = attempts.clone();
    engine.register(
        InProcessTool::new(
            "fetch",
            "Fetches a page (fails twice, then works)",
            object(json!({"url": {"type": "string"}}), &["url"]),
            move |input, _ctx| {
                let n = seen.fetch_add(1, Ordering::SeqCst) + 1;
                async move {
                    if n <= 2 {
                        // Fail like a broken connection: retryable for an idempotent tool.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        return Err(ToolError::new(format!("connection reset (attempt {n})")));
                    }
                    Ok(json!({"url": input["url"], "status": 200, "attempt": n}))
                }
            },
        )
        .idempotent(true)
        .cache_ttl(Duration::from_secs(60))
        // A tool's own error is retried only when asked; a transport failure always is.
        .retries(3)
        .retry_on_tool_error(true),
    );

    engine.register(
        InProcessTool::blocking(
            "stuck",
            "Never returns and ignores cancellation",
            object(json!({}), &[]),
            |_i, _c| {
                // A blocking function that ignores its context: it cannot be killed, only abandoned.
                std::thread::park_timeout(Duration::from_secs(3));
                Ok("too late")
            },
        )
        .timeout(Duration::from_millis(800))
        .cancel_grace(Duration::from_millis(200)),
    );

    // Watch what happens, live.
    let mut events = engine.subscribe();
    let watcher = tokio::spawn(async move {
        while let Some(received) = events.recv().await {
            let Received::Event(e) = received else {
                continue;
            };
            let who = e
                .scope
                .call_id
                .as_ref()
                .map(|c| format!(" {c}"))
                .unwrap_or_default();
            let what = match &e.kind {
                EventKind::ToolProgress { progress, .. } => {
                    progress.message.clone().unwrap_or_default()
                }
                EventKind::ToolRetry {
                    attempt,
                    delay_ms,
                    cause,
                } => format!("attempt {attempt} in {delay_ms} ms after {cause}"),
                EventKind::ToolTimeout { kind, after_ms } => {
                    format!("{} deadline of {after_ms} ms", kind.as_str())
                }
                EventKind::ToolStopped { how, after_ms, .. } => {
                    format!("work {} after {after_ms} ms", how.as_str())
                }
                EventKind::ToolResult { result, .. } => result.outcome.status.name().to_owned(),
                _ => String::new(),
            };
            println!("  event {:>3} {:<16}{who} {what}", e.seq, e.kind.name());
        }
    });

    let calls = vec![
        ToolCall::new("c1", "add", json!({"a": 2, "b": 3})),
        ToolCall::new("c2", "report", json!({})),
        ToolCall::new("c3", "fetch", json!({"url": "https://example.com"})),
        ToolCall::new("c4", "stuck", json!({})),
    ];
    println!("turn of {} calls:", calls.len());
    let mut turn = engine.start_turn(TurnRequest::new("demo", calls))?;
    while let Some((index, result)) = turn.next_completed().await {
        println!(
            "call #{index} ({}) completed: {}",
            result.outcome.call_id,
            result.text()
        );
    }
    let done = turn.finish().await;
    println!("\nresults in call order:");
    for r in &done.results {
        println!("{}", serde_json::to_string(&r.outcome)?);
    }

    // The same fetch again: served from the cache, with provenance.
    let again = engine
        .call(
            "demo",
            ToolCall::new("c5", "fetch", json!({"url": "https://example.com"})),
        )
        .await;
    println!("\nagain: {}", serde_json::to_string(&again.outcome)?);

    // Let the stuck call's stop be recorded, then stop everything.
    tokio::time::sleep(Duration::from_millis(300)).await;
    engine.shutdown(Duration::from_secs(1)).await;
    watcher.abort();
    println!("\nmetrics (excerpt):");
    for line in engine
        .metrics()
        .encode()
        .lines()
        .filter(|l| l.starts_with("toolwarden_tool_calls_total"))
    {
        println!("  {line}");
    }
    Ok(())
}
