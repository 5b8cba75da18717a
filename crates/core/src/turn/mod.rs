//! Turns: the ordered set of calls one model response asked for.
//!
//! A turn's calls run in parallel; its results come back **in call order, exactly one per call**,
//! whatever happened, and are also streamed one by one as they complete. A turn's life is here
//! from start to end: `prepare` (check the request, find the session, give each call its slot and
//! place in line, register the turn), `drive` (run the calls, assemble and announce the end,
//! unregister), and `handle` (a turn on its own task). `runtime` holds the turns running now and
//! their sessions; `state` is one running turn.

mod drive;
mod handle;
mod prepare;
mod request;
mod runtime;
mod state;

pub(crate) use drive::drive_turn;
pub use handle::TurnHandle;
pub(crate) use prepare::prepare;
pub use request::{ResultRenderer, TurnError, TurnOutput, TurnRequest};
pub(crate) use runtime::TurnRuntime;
pub use runtime::{AbortError, NotFound};
