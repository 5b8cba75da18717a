//! The pipeline of one call, in this order: validate → tool pin (a changed definition held) →
//! rules → hooks → loop detector → approval gate → quotas → cache lookup with single flight (a stored result, or an identical running call's, is shared) →
//! breaker → concurrency gate → attempts (each under deadlines and cancellation) → classify →
//! record breaker → cache store → outcome. A call that must wait at the session's gate looks
//! only for a stored result before the breaker and joins single flight past the gate (a leader
//! never waits there). Every step that ends the call produces its outcome; nothing after it runs.
//!
//! A call borrows a narrow environment ([`CallEnv`]) and the part of its turn it needs
//! ([`CallTurn`]), and writes only into its own [`CallSlot`]; it knows nothing of the engine or
//! of other calls. Two guards make the pipeline safe to drop at any await (a client that
//! disconnects drops it): the finisher records the call's single outcome exactly once, and a
//! running attempt is handed to a tracked stop task instead of being dropped, so the backend is
//! still asked to stop, then forced, and `tool_stopped` says how.
//!
//! One module per job: `pipeline` (the steps in order), `finish` (recording the outcome),
//! `approve` (the approval gate), `guard` (hooks and quotas), `flight` (single flight),
//! `attempts` (attempts and retries),
//! `deadline` (waiting under the deadlines), `pacer` (progress pacing), `stop` (stopping an
//! attempt behind the call), `slot` and `env` (what a call writes to and borrows), `across` (a
//! named session's loop run and gate across replicas).

mod across;
mod approve;
mod attempts;
mod deadline;
mod env;
mod finish;
mod flight;
mod guard;
mod pacer;
mod pipeline;
mod slot;
mod stop;
#[cfg(test)]
mod tests;

pub(crate) use env::CallEnv;
pub(crate) use pipeline::{CallJob, Target, run_call};
pub use slot::CallProgress;
pub(crate) use slot::{CallSlot, CallTurn, Completion};
