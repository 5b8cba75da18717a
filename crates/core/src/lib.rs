//! The toolwarden engine: governed execution of tool calls and turns.
//!
//! Front doors (MCP gateway, HTTP API, CLI, Rust programs) hand the engine calls; backends (MCP
//! servers, the exec tool, in-process functions) run them. The engine stands between and applies
//! every rule of the spec — validation, loop detection, approvals, cache, circuit breaker,
//! per-session exclusivity, deadlines, retries — and gives back exactly one typed outcome per call.
//!
//! The key design choice: **the caller's outcome and the stopping of the work are separate.** A
//! cancel or timeout decides the outcome at once; stopping the backend's work (cooperatively, then
//! by force) continues behind it on a tracked task and ends in a `tool_stopped` event. Core knows
//! nothing of MCP, HTTP or processes: backends plug in through [`backend::Backend`].
//!
//! ```no_run
//! use serde_json::json;
//! use toolwarden_core::{Engine, InProcessTool, ToolError};
//! use toolwarden_core::protocol::ToolCall;
//!
//! # async fn demo() {
//! let engine = Engine::new();
//! engine.register(InProcessTool::new(
//!     "add",
//!     "Adds two integers",
//!     json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
//!            "required": ["a", "b"]}),
//!     |input, _ctx| async move {
//!         let sum = input["a"].as_i64().unwrap_or(0) + input["b"].as_i64().unwrap_or(0);
//!         Ok::<_, ToolError>(sum.to_string())
//!     },
//! ));
//! let result = engine.call("session-1", ToolCall::new("c1", "add", json!({"a": 2, "b": 3}))).await;
//! assert_eq!(result.text(), "5");
//! # }
//! ```
#![deny(missing_docs)]

pub mod backend;
mod breaker;
mod cache;
mod call;
mod cancel;
pub mod canonical;
pub(crate) mod clock;
pub mod config;
mod engine;
pub mod events;
mod gate;
mod inproc;
pub mod interaction;
mod loop_detect;
pub mod metrics;
pub mod policy;
mod reaper;
mod registry;
mod retry;
mod session;
pub mod store;
mod text;
mod turn;

/// Maps keyed by ids and digests on the hot path: a fast, DoS-resistant-enough seeded hasher
/// instead of SipHash.
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// Maps keyed by SHA-256 digests (the cache, the loop detector): see [`digest_hash`].
pub(crate) type DigestMap<K, V> = std::collections::HashMap<K, V, digest_hash::DigestState>;

mod digest_hash {
    //! A hasher for keys that are SHA-256 digests. Their bits are already uniform, so hashing
    //! all 32 bytes again (as a general hasher must) is wasted work: the first 8 bytes, folded
    //! with a per-process secret, make the hash. The secret keeps bucket positions unpredictable,
    //! so crafted inputs cannot pile into one bucket.

    use std::hash::{BuildHasher, Hasher};
    use std::sync::OnceLock;

    /// Builds [`DigestHasher`]s seeded with the process's secret.
    #[derive(Clone, Copy, Debug)]
    pub(crate) struct DigestState(u64);

    impl Default for DigestState {
        fn default() -> Self {
            static SEED: OnceLock<u64> = OnceLock::new();
            Self(*SEED.get_or_init(rand::random))
        }
    }

    impl BuildHasher for DigestState {
        type Hasher = DigestHasher;

        fn build_hasher(&self) -> DigestHasher {
            DigestHasher(self.0)
        }
    }

    /// Hashes the first 8 bytes it is given (a digest's) with the seed.
    pub(crate) struct DigestHasher(u64);

    impl Hasher for DigestHasher {
        fn write(&mut self, bytes: &[u8]) {
            let mut word = [0u8; 8];
            let n = bytes.len().min(8);
            word[..n].copy_from_slice(&bytes[..n]);
            // A folded multiply: every output bit depends on every bit of the word and seed.
            let product = u128::from(self.0 ^ u64::from_le_bytes(word))
                * u128::from(0x9E37_79B9_7F4A_7C15_u64);
            self.0 = (product as u64) ^ ((product >> 64) as u64);
        }

        /// The length an array or slice hashes first: the same for every digest.
        fn write_usize(&mut self, _: usize) {}

        fn finish(&self) -> u64 {
            self.0
        }
    }

    #[cfg(test)]
    mod tests {
        use std::hash::BuildHasher;

        use super::DigestState;

        #[test]
        fn digests_that_differ_hash_apart_and_equal_ones_alike() {
            // Fixed seeds (the process's is random): the test is the same on every run.
            for seed in [0, 1, 0xdead_beef, u64::MAX] {
                let state = DigestState(seed);
                let a = [7u8; 32];
                let mut b = a;
                b[0] = 8;
                assert_eq!(state.hash_one(a), state.hash_one(a));
                assert_ne!(state.hash_one(a), state.hash_one(b));
                // The low bits (a table's bucket) spread too, not just the high ones: 4,096 keys
                // that differ only in their first two bytes fill 64 buckets evenly.
                let mut buckets = [0u32; 64];
                for i in 0..4096u16 {
                    let mut k = [0u8; 32];
                    k[..2].copy_from_slice(&i.to_le_bytes());
                    buckets[(state.hash_one(k) & 0x3f) as usize] += 1;
                }
                let (min, max) = (buckets.iter().min(), buckets.iter().max());
                assert!(
                    min >= Some(&32) && max <= Some(&96),
                    "seed {seed}: {min:?}..{max:?} per bucket, 64 expected"
                );
            }
        }
    }
}

pub use backend::{
    Attempt, AttemptEnd, AttemptError, AttemptMeta, Backend, BackendHost, BoxFuture, Heartbeat,
    ProgressRelay, StopSignals, ToolOutput,
};
pub use config::{
    Config, ConfigDiagnostic, ConfigError, ConfigErrorKind, ConfigOrigin, apply_hints,
};
pub use engine::{Engine, EngineBuilder, NotFound, PREFIX_SEPARATOR, ServerStatus};
pub use events::{EventBus, EventScope, EventSink, Matching, Received, Subscription};
pub use inproc::{INPROCESS, InProcessTool, IntoToolOutput, ToolContext, ToolError};
pub use interaction::{
    AnswerError, AnswerSender, InteractionEnd, InteractionRequest, Interactions, Interactor,
};
pub use metrics::Metrics;
pub use policy::{PolicySource, ToolOrigin};
pub use store::{AuditStore, StoreHealth, StoreReadError, StoreUnavailable};
pub use text::outcome_text;
pub use toolwarden_protocol as protocol;
pub use turn::{CallProgress, ResultRenderer, TurnError, TurnHandle, TurnOutput, TurnRequest};
