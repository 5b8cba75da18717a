//! The audit trail's benchmarks, on the real binary (figures in docs/PERFORMANCE.md):
//!
//! ```sh
//! cargo build --release -p toolwarden -p toolwarden-testkit -p toolwarden-bench
//! B="${CARGO_TARGET_DIR:-target}/release"
//! $B/store-bench speed [ROUNDS] [CALLS]     # store off / before_execution / async, side by side
//! $B/store-bench soak [RATE] [SECONDS]      # calls at RATE/s through POST /v1/turns; every event counted
//! $B/store-bench query [TURNS]              # toolwarden audit over a trail of TURNS ten-call turns
//! $B/store-bench pg [ROUNDS] [CALLS]        # store off / SQLite / PostgreSQL ×3, side by side
//! $B/store-bench scale [ROUNDS] [CALLS]     # one node against replicas on PostgreSQL and Redis
//! $B/store-bench abort [ABORTS]             # an abort posted to one replica, the call on another
//! $B/store-bench writer [ROUNDS] [CALLS]    # the store's own cost, in process: CPU per call, the writer's
//! ```
//!
//! `speed` starts three `toolwarden serve`s — without a store, with `before_execution`, with
//! `async` — each in front of `tw-test-server`, and measures them in turn, round after round, in
//! a rotating order (the machine is noisy: alternating spreads its noise over all three): calls
//! per second at concurrency 32, and the median latency at concurrency 1, through
//! `POST /v1/turns` to an echo tool. It then reports each store's size per 1,000 calls.
//! `soak` checks that nothing is lost at a steady rate: after the run it counts every call's four
//! events in the database. `query` builds a trail of TURNS turns (ten calls each: about 2.2 events
//! per call) with the engine and the store as a library, then times `toolwarden audit` and the
//! reader's queries over it. `pg` compares PostgreSQL with SQLite and no store as `speed` does.
//! `scale` measures replicas sharing Redis and PostgreSQL against a single node and counts the
//! Redis commands and round trips per call; `abort` times aborts forwarded between replicas.
//! Nothing here asserts a timing; it prints figures.
//!
//! One module per job: [`speed`], [`soak`], [`query`], [`pg`], [`scale`], [`abort`]; [`common`]
//! starts and drives the servers, [`redis_server`] runs a Redis of the run's own.
#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "a benchmark measures wall time"
)]

mod abort;
mod common;
#[path = "../../cpu.rs"]
mod cpu;
#[path = "../../echo_serve.rs"]
mod echo_serve;
mod pg;
mod query;
mod redis_server;
mod scale;
mod soak;
mod speed;
mod writer;

use anyhow::{Context, Result, bail};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: u64| -> Result<u64> {
        args.get(i)
            .map(|s| s.parse().context("a number"))
            .transpose()
            .map(|v| v.unwrap_or(default))
    };
    let dir = std::env::current_exe()?
        .parent()
        .context("the benchmark's directory")?
        .to_path_buf();
    let tmp = std::env::temp_dir().join(format!("toolwarden-store-bench-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let result = match args.first().map(String::as_str) {
        Some("speed") => {
            speed::speed(&dir, &tmp, arg(1, 5)? as usize, arg(2, 20_000)? as usize).await
        }
        Some("soak") => soak::soak(&dir, &tmp, arg(1, 1000)?, arg(2, 60)?).await,
        Some("query") => query::query(&dir, &tmp, arg(1, 50_000)? as usize).await,
        Some("pg") => pg::pg(&dir, &tmp, arg(1, 5)? as usize, arg(2, 20_000)? as usize).await,
        Some("scale") => {
            scale::scale(&dir, &tmp, arg(1, 5)? as usize, arg(2, 10_000)? as usize).await
        }
        Some("abort") => abort::abort(&dir, &tmp, arg(1, 200)? as usize).await,
        Some("writer") => writer::writer(&tmp, arg(1, 5)? as usize, arg(2, 50_000)? as usize).await,
        _ => bail!(
            "usage: store-bench speed [ROUNDS] [CALLS] | soak [RATE] [SECONDS] | query [TURNS] | pg [ROUNDS] [CALLS] | scale [ROUNDS] [CALLS] | abort [ABORTS] | writer [ROUNDS] [CALLS]"
        ),
    };
    let _ = std::fs::remove_dir_all(&tmp);
    result
}
