//! What rmcp's client spends parsing one `tools/call` answer, with and without toolwarden's
//! structured outcome in `_meta["toolwarden/outcome"]` (docs/PERFORMANCE.md, "The official
//! reference server behind `/mcp`").
//!
//! ```sh
//! cargo run --release -p toolwarden-bench --example client_parse
//! ```
//!
//! rmcp reads a result as an untagged union of every result type, trying them in turn; each
//! try before `CallToolResult` (the sixteenth) reads the result's `_meta` into a fresh JSON
//! map, so every key of the outcome is paid for about sixteen times. The answers are copies of
//! real ones: the reference server's `echo` answer straight over stdio, and the same call's
//! answer through toolwarden's `/mcp`.
#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "a benchmark measures wall time"
)]

use std::time::{Duration, Instant};

const DIRECT: &str =
    r#"{"result":{"content":[{"type":"text","text":"Echo: hi"}]},"jsonrpc":"2.0","id":2}"#;
const THROUGH: &str = r#"{"jsonrpc":"2.0","id":2,"result":{"content":[{"type":"text","text":"Echo: hi"}],"isError":false,"_meta":{"toolwarden/outcome":{"attempts":1,"call_id":"2","duration_ms":3,"provenance":{"cache_hit":false,"digest":"sha256:5bef312cd57d53d9aa444515f6e59b9636b7b4dcdf00337d4abb16ce26be6036","fetched_at":"2026-11-25T02:14:32.949Z","source":"tool"},"status":"ok","tool":"echo","turn_id":"t_01M887QDQH3JKJASKPTQFXJJBX"}}}}"#;
const THROUGH_WITHOUT_OUTCOME: &str = r#"{"jsonrpc":"2.0","id":2,"result":{"content":[{"type":"text","text":"Echo: hi"}],"isError":false}}"#;

fn main() -> anyhow::Result<()> {
    let answers = [
        ("straight from the server", DIRECT),
        ("through toolwarden", THROUGH),
        (
            "through toolwarden, without the outcome",
            THROUGH_WITHOUT_OUTCOME,
        ),
    ];
    let n = 50_000u32;
    let mut best = [Duration::MAX; 3];
    // Rounds alternate the answers, so a noisy moment falls on all three; the best round counts.
    for _ in 0..5 {
        for (i, (_, json)) in answers.iter().enumerate() {
            let started = Instant::now();
            for _ in 0..n {
                let message: rmcp::model::ServerJsonRpcMessage = serde_json::from_str(json)?;
                std::hint::black_box(message);
            }
            best[i] = best[i].min(started.elapsed() / n);
        }
    }
    for ((name, _), time) in answers.iter().zip(best) {
        println!("{name}: {:.1} µs per answer", time.as_secs_f64() * 1e6);
    }
    Ok(())
}
