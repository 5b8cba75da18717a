//! What the benchmarks of a governed call share — core's `engine` and otel's `spans`, each of
//! which includes this file (`#[path]`): the calls' inputs, the caller's session, and the timed
//! governed call itself, and the allocator and runtime they run with.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use divan::Bencher;
use serde_json::{Value, json};
use toolwarden_core::Engine;
use toolwarden_core::protocol::{SessionId, ToolCall};

/// The allocator the `toolwarden` binary ships with.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The runtime the calls run on: one thread, as a caller's `block_on`.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

static N: AtomicU64 = AtomicU64::new(0);

/// A new input at every call (so that no cache answers it).
pub(crate) fn next_input() -> Value {
    json!({"n": N.fetch_add(1, Ordering::Relaxed)})
}

/// The caller's session id, made once (ids are `Arc<str>`: a clone is a reference count).
pub(crate) fn session() -> SessionId {
    static SESSION: OnceLock<SessionId> = OnceLock::new();
    SESSION.get_or_init(|| SessionId::from("bench")).clone()
}

/// Times `engine`'s governed call of the `noop` tool, one `block_on` on `rt` per call.
pub(crate) fn governed_noop(bencher: Bencher, rt: &tokio::runtime::Runtime, engine: &Engine) {
    bencher
        .with_inputs(|| ToolCall::new("c", "noop", next_input()))
        .bench_local_values(|call| rt.block_on(engine.call(session(), call)));
}
