//! State shared by toolwarden replicas through Redis (docs/SCALE-OUT.md).
//!
//! Implements core's [`SharedState`](toolwarden_core::shared::SharedState): breakers opened or
//! closed on one replica are opened or closed on all, the one half-open probe is a lease, the
//! cache and its single flight span replicas, an abort reaches the replica that runs the turn,
//! and every replica's events reach every replica's `/v1/events`.
//!
//! The key design choice: **Redis is never on a call's path unless replicas must agree there**,
//! and never for long. A healthy call of a closed breaker makes no round trip; what only informs
//! the others (a breaker's change, a cached result, an event) is queued and written behind the
//! call by one task, in pipelines. Every operation is bounded by `[redis] timeout`; while Redis
//! cannot be reached, operations do not even try — each replica runs on its local state, says so
//! in `/healthz` and `toolwarden_redis_up`, and a watcher resynchronises it when Redis is back.
//!
//! The client is the `redis` crate's tokio [`ConnectionManager`](redis::aio::ConnectionManager):
//! a multiplexed connection that reconnects by itself and, over RESP3, resubscribes its pub/sub
//! channels after a reconnect — the two things a long-running replica needs — without the
//! connection pools, cluster routing and extra runtime that `fred` brings and this use does not
//! need.

#![deny(missing_docs)]

mod conn;
mod keys;
mod link;
mod options;
mod quota;
mod release;
mod session;
mod shared;
mod wire;

pub use options::{DEFAULT_PREFIX, DEFAULT_TIMEOUT, Options, OptionsError};
pub use shared::RedisShared;
