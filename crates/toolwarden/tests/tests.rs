//! Integration tests: they drive the real `toolwarden` binary, one temp dir and one command per
//! test, against real processes (`exec` commands, `tw-test-server`) on 127.0.0.1.

// clippy's allow-unwrap-in-tests covers #[test] functions only, not helpers.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub, dead_code)]

mod util;

mod api;
mod audit;
mod auth;
mod availability;
mod call;
mod chaos;
mod check;
mod config;
mod deploy;
mod guards;
mod help;
mod limits;
mod mcp;
mod otel;
mod pins;
mod readme;
mod replicas;
mod rules;
mod scale_out;
mod scale_out_sessions;
mod serve;
mod soak;
