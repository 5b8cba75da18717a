//! The seam of scale-out: state several replicas share (docs/SCALE-OUT.md).
//!
//! Core defines what it needs from the others and nothing of how it is shared: the
//! [`SharedState`] trait, which `toolwarden-redis` implements on Redis. The engine keeps every
//! rule local and fast — each breaker, cache entry and running turn lives in this process — and
//! asks the shared state only at the moments where replicas must agree: a breaker changing state,
//! the one half-open probe, a cacheable call that missed locally, an abort for a turn this replica
//! does not run. What other replicas tell this one arrives through [`crate::Engine`]'s
//! `apply_shared_breaker`, `abort_turn`/`abort_call` and `remote_events`.
//!
//! **Nothing here may make a call fail or wait long.** Every future is bounded by the
//! implementation's own timeout and answers "unavailable" (the local rule then applies) when the
//! shared state cannot be reached; methods without a future only enqueue.

use std::sync::Arc;
use std::time::Duration;

use toolwarden_protocol::{ActiveTurn, CallId, CancelReason, Event, SessionKey, TurnId};

use crate::backend::BoxFuture;

#[cfg(any(test, feature = "fakes"))]
pub mod fake;

/// Whether the shared state can be reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SharedHealth {
    /// Reached; replicas share state.
    Ok,
    /// Not reached: this replica runs on its local state. The text says why.
    Degraded(String),
}

/// A breaker's change as other replicas must learn it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakerChange {
    /// Opened (or opened again by a failed probe) for this long from now.
    Open {
        /// How long it stays open.
        for_: Duration,
    },
    /// Closed by a successful probe.
    Closed,
}

/// The answer to a cacheable call that found nothing in this replica's cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheClaim {
    /// Another replica stored this result (the bytes its leader put), fresh for `ttl` more.
    Hit {
        /// The stored result.
        value: Vec<u8>,
        /// How long it stays fresh.
        ttl: Duration,
    },
    /// Nobody runs this call: this replica does, and must put or release the key.
    Lead,
    /// Another replica runs it now: look again a little later.
    Follow,
    /// The shared state cannot be reached: run it here, sharing nothing.
    Unavailable,
}

/// An abort that the replica running the turn must carry out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AbortRequest {
    /// The turn.
    pub turn_id: TurnId,
    /// One call of it, or the whole turn.
    pub call_id: Option<CallId>,
    /// Why.
    pub reason: CancelReason,
    /// Only if the turn is this principal's (the asker may not abort others' turns); `None`:
    /// whoever's it is.
    pub only_of: Option<Arc<str>>,
}

/// What became of an abort on one replica, or on all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AbortAnswer {
    /// It runs there and was aborted.
    Done,
    /// Not running there.
    NotFound,
    /// It runs there, but is not the asker's: left running.
    NotYours,
}

/// An event of another replica.
#[derive(Clone, Debug)]
pub struct RemoteEvent {
    /// The replica it happened on.
    pub replica: Arc<str>,
    /// The event, with that replica's `seq`.
    pub event: Arc<Event>,
}

/// A session's loop run as the replicas share it: the call it repeats and how many calls in a
/// row gave one same result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoopRun {
    /// The call's digest (tool and canonical input).
    pub call: [u8; 32],
    /// How many calls in a row.
    pub count: u32,
}

/// A call's place in its session's gate across replicas: unique within this replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GatePlace {
    /// Unique among this replica's places.
    pub id: u64,
    /// An exclusive call owns the gate; a parallel one shares it.
    pub exclusive: bool,
}

/// The answer to a call asking to pass its session's gate across replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateAnswer {
    /// It may run.
    Pass,
    /// A call ahead of it (on any replica) holds the gate: ask again when one leaves.
    Wait,
    /// The shared state cannot be reached: the local gate alone decides.
    Unavailable,
}

/// One replica's running turns.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplicaTurns {
    /// The replica's name.
    pub replica: String,
    /// Its running turns, oldest first.
    pub turns: Vec<ActiveTurn>,
}

/// What a call takes from one quota's bucket across replicas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaTake {
    /// The bucket's name: the quota's index and whose bucket (`0:alice`).
    pub bucket: String,
    /// The quota's rate (count per period), if it has one: one token is taken.
    pub rate: Option<(u32, Duration)>,
    /// The quota's concurrency cap, if it has one: a place among the running calls is taken.
    pub concurrency: Option<u32>,
}

/// The shared state's answer to a call's quota takes.
#[derive(Clone, Debug, PartialEq)]
pub struct QuotaAnswer {
    /// `None`: every take was made. Else the first take that could not be made (its index in
    /// the takes), why, and when to try again; nothing was taken from any bucket.
    pub refused: Option<(usize, toolwarden_protocol::DenyReason, Duration)>,
    /// The replicas seen alive lately (this one included): a replica's local share of each
    /// limit when the shared state is away.
    pub replicas: u32,
    /// Per take, when the call was let through: the tokens left in its bucket (`None`: no rate).
    pub left: Vec<Option<f64>>,
}

/// A request about a task for the replica whose task it is: a client's answers to its questions
/// (`tasks/update`), or its live state (`tasks/get`).
#[derive(Clone, Debug, PartialEq)]
pub struct TaskRequest {
    /// The task.
    pub task_id: String,
    /// Whose it must be: another principal's task is answered as unknown.
    pub principal: String,
    /// What is asked.
    pub ask: TaskAsk,
}

/// What a [`TaskRequest`] asks.
#[derive(Clone, Debug, PartialEq)]
pub enum TaskAsk {
    /// Take these answers, keyed by question, as the client sent them.
    Update(serde_json::Value),
    /// Say the task's state, as `tasks/get` answers it.
    Get,
}

/// What became of a [`TaskRequest`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskAnswer {
    /// Done: the task's call got its answers (`None`), or here is its state (`Some`).
    Done(Option<serde_json::Value>),
    /// No replica (reached) holds the task, or it is not the principal's.
    NotFound,
    /// The replica that holds it refused the request; the text says why.
    Refused(String),
}

/// How a front door answers a [`TaskRequest`] for a task it holds (registered with
/// [`crate::Engine::set_task_answerer`]).
pub type TaskAnswerer = dyn Fn(&TaskRequest) -> TaskAnswer + Send + Sync;

/// State shared with the other replicas. Implemented by `toolwarden-redis`.
pub trait SharedState: Send + Sync + 'static {
    /// Whether the shared state is reached now.
    fn health(&self) -> SharedHealth;

    /// A breaker of this replica changed state: tell the others. Only enqueues.
    fn breaker_changed(&self, tool: &str, change: BreakerChange);

    /// Asks for the one half-open probe of `tool` across replicas, for at most `ttl`. `true`: this
    /// replica probes (also when the shared state cannot be reached); `false`: another one does.
    fn probe_lease(&self, tool: &str, ttl: Duration) -> BoxFuture<bool>;

    /// The probe of `tool` ended: another replica may probe. Only enqueues.
    fn probe_release(&self, tool: &str);

    /// Looks a cacheable call up across replicas, taking the right to run it when nobody has.
    fn cache_claim(&self, key: &[u8; 32], lock_ttl: Duration) -> BoxFuture<CacheClaim>;

    /// Stores the result of a call this replica led, for `ttl`, and frees its key. Only enqueues.
    fn cache_put(&self, key: &[u8; 32], value: Vec<u8>, ttl: Duration);

    /// Frees the key of a call this replica led that ended without a result to share. Only
    /// enqueues.
    fn cache_release(&self, key: &[u8; 32]);

    /// Asks the other replicas to carry out an abort: `Done` or `NotYours` from the one that
    /// runs the turn, `NotFound` when none does (or none answers).
    fn abort_elsewhere(&self, abort: AbortRequest) -> BoxFuture<AbortAnswer>;

    /// This replica's name among the replicas.
    fn replica(&self) -> &str;

    /// The running turns of every other replica that answers within the implementation's bound
    /// (none when the shared state cannot be reached).
    fn turns_elsewhere(&self) -> BoxFuture<Vec<ReplicaTurns>>;

    /// The loop run of a named session, as every replica recorded it. `Err(())`: the shared state
    /// cannot be reached (the local detector decides); `Ok(None)`: no run.
    fn loop_run(&self, session: &SessionKey) -> BoxFuture<Result<Option<LoopRun>, ()>>;

    /// Counts a call's answer into its session's shared run — `result`: the digest of its
    /// result, `None` for an answer that ends the run — and keeps the run for `ttl`. The run's
    /// new count (`0` when it ended); `None` when the shared state cannot be reached.
    fn loop_record(
        &self,
        session: &SessionKey,
        call: &[u8; 32],
        result: Option<[u8; 32]>,
        ttl: Duration,
    ) -> BoxFuture<Option<u32>>;

    /// Asks to pass a named session's gate across replicas, taking a place in its line on the
    /// first ask (held at most `ttl` from each ask). After any answer but `Unavailable`, the
    /// place must be left with [`SharedState::gate_leave`]; after `Unavailable` the
    /// implementation leaves whatever place it may have taken.
    fn gate_enter(
        &self,
        session: &SessionKey,
        place: GatePlace,
        ttl: Duration,
    ) -> BoxFuture<GateAnswer>;

    /// Leaves the place: the calls behind it may pass. Only enqueues.
    fn gate_leave(&self, session: &SessionKey, place: GatePlace);

    /// Takes from every bucket of `takes` at once, or from none (docs/RULES.md, "Quotas"):
    /// one round trip. `member` names the call among the running calls of the buckets with a
    /// concurrency cap, for at most `lease`. `Err`: the shared state cannot be reached.
    fn quota_take(
        &self,
        takes: Vec<QuotaTake>,
        member: String,
        lease: Duration,
    ) -> BoxFuture<Result<QuotaAnswer, ()>>;

    /// Gives back the places `member` holds among the running calls of `buckets` (queued).
    fn quota_release(&self, buckets: Vec<String>, member: String);

    /// Extends the places `member` holds among the running calls of `buckets` to `lease` from
    /// now (queued): a call still running keeps its place past its first lease.
    fn quota_renew(&self, buckets: Vec<String>, member: String, lease: Duration);

    /// Hands a request about a task to the replica that holds the task, and says what became
    /// of it (`NotFound` when none answers in time).
    fn task_elsewhere(&self, request: TaskRequest) -> BoxFuture<TaskAnswer> {
        let _ = request;
        Box::pin(std::future::ready(TaskAnswer::NotFound))
    }
}

/// How long a named session's shared loop run is kept after its last call: as long as a replica
/// keeps an idle session.
pub(crate) const LOOP_RUN_TTL: Duration = Duration::from_secs(3600);

/// How long a lease (half-open probe, cache key) is held at most for a call with this total
/// timeout: the timeout and its grace, or a minute when the call has none.
pub(crate) fn lease_ttl(timeout: Duration, grace: Duration) -> Duration {
    if timeout.is_zero() {
        Duration::from_secs(60)
    } else {
        (timeout + grace).max(Duration::from_secs(1))
    }
}
