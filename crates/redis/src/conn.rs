//! What every part of the crate shares: the connection, whether Redis is up, the outbox, the
//! scripts — and the one rule that every operation runs under the timeout and marks Redis down
//! when it fails.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use redis::aio::ConnectionManager;
use tokio::sync::mpsc;
use toolwarden_core::metrics::SharedMetrics;
use toolwarden_core::shared::BreakerChange;

use crate::keys::Keys;
use crate::options::Options;
use crate::wire::ReplyMsg;

/// A write that only informs the other replicas, done behind the calls by the outbox.
#[derive(Debug)]
pub(crate) enum Write {
    Breaker {
        tool: String,
        change: BreakerChange,
    },
    /// Frees a probe lease or a cache lock this replica holds.
    Release {
        key: String,
    },
    CachePut {
        key: String,
        lock: String,
        value: Vec<u8>,
        ttl: Duration,
    },
    /// An event of this replica, as the message to publish.
    Event(String),
    /// Drops a session's run that this replica counted alone while Redis was away.
    DropRun {
        session: String,
    },
    /// Leaves a place in a session's line and tells the others.
    GateLeave {
        session: String,
        place: String,
    },
    /// Gives back a call's places among its quotas' running calls.
    QuotaRelease {
        buckets: Vec<String>,
        member: String,
    },
    /// Extends a running call's places among its quotas' running calls.
    QuotaRenew {
        buckets: Vec<String>,
        member: String,
        lease: Duration,
    },
}

impl Write {
    /// The operation's name in `toolwarden_redis_fallbacks_total`.
    pub(crate) fn op(&self) -> &'static str {
        match self {
            Write::Breaker { .. } => "breaker",
            Write::Release { .. } => "release",
            Write::CachePut { .. } => "cache_put",
            Write::Event(_) => "event",
            Write::GateLeave { .. } => "gate_leave",
            Write::DropRun { .. } => "drop_run",
            Write::QuotaRelease { .. } => "quota_release",
            Write::QuotaRenew { .. } => "quota_renew",
        }
    }
}

pub(crate) struct RedisConn {
    /// This replica's name in messages and leases (a ULID made at start).
    pub(crate) replica: Arc<str>,
    pub(crate) keys: Keys,
    pub(crate) options: Options,
    /// Commands and publishes.
    pub(crate) cmd: ConnectionManager,
    /// Whether Redis answered the last time it was asked; while it did not, nothing tries it.
    pub(crate) up: AtomicBool,
    /// Why it is not up.
    pub(crate) down_reason: Mutex<String>,
    pub(crate) metrics: SharedMetrics,
    /// Writes that only inform the others, done behind the calls (see [`RedisConn::post`]).
    pub(crate) outbox: mpsc::Sender<Write>,
    /// Aborts and requests for running turns sent to the others, waiting for their answers.
    pub(crate) pending: Mutex<HashMap<u64, mpsc::UnboundedSender<ReplyMsg>>>,
    pub(crate) next_req: AtomicU64,
    /// What Redis missed while it could not be reached, written when it is back.
    pub(crate) missed: Mutex<Missed>,
}

/// What a session's state in Redis missed while Redis could not be reached.
#[derive(Default)]
pub(crate) struct Missed {
    /// Sessions whose calls were counted here alone: the run Redis holds for them is stale.
    pub(crate) runs: std::collections::HashSet<String>,
    /// Places left here (session, place): Redis still holds them.
    pub(crate) leaves: Vec<(String, String)>,
}

/// At most this many sessions and places are remembered while Redis is away (beyond, a stale
/// run stays until its TTL and a place until its expiry).
pub(crate) const MISSED_MAX: usize = 65_536;

impl Missed {
    /// Remembers a write the outbox could not make, if it is one Redis must get later.
    pub(crate) fn keep(&mut self, write: Write) {
        match write {
            Write::GateLeave { session, place } if self.leaves.len() < MISSED_MAX => {
                self.leaves.push((session, place));
            }
            Write::DropRun { session } => self.run(&session),
            _ => {}
        }
    }

    /// Remembers a session whose answer was counted here alone.
    pub(crate) fn run(&mut self, session: &str) {
        if self.runs.len() < MISSED_MAX {
            self.runs.insert(session.to_owned());
        }
    }
}

/// A lost probe lease or cache lock frees itself after its TTL; these scripts free only what
/// this replica holds.
pub(crate) const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0";

/// A cached result (with its time left), or the lock taken, or someone else's lock.
pub(crate) const CLAIM: &str = r"
local v = redis.call('GET', KEYS[1])
if v then return {1, v, redis.call('PTTL', KEYS[1])} end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return {2} end
return {3}";

/// Counts a call's answer into a session's run: the run's new count (0: ended).
pub(crate) const LOOP_RECORD: &str = r"
if ARGV[2] == '' then
  redis.call('DEL', KEYS[1])
  return 0
end
local cur = redis.call('HMGET', KEYS[1], 'c', 'r', 'n')
local n = 1
if cur[1] == ARGV[1] and cur[2] == ARGV[2] then n = tonumber(cur[3]) + 1 end
redis.call('HSET', KEYS[1], 'c', ARGV[1], 'r', ARGV[2], 'n', n)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return n";

/// Takes (or keeps) a place in a session's line and says whether it may pass — the rule of the
/// local gate: an exclusive place passes when it is first, a parallel one when no exclusive place
/// is ahead of it. Places past their expiry (a replica that died) are dropped on the way.
pub(crate) const GATE_ENTER: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local me, ttl = ARGV[1], tonumber(ARGV[2])
if not redis.call('ZSCORE', KEYS[1], me) then
  redis.call('ZADD', KEYS[1], redis.call('HINCRBY', KEYS[2], '#', 1), me)
end
redis.call('HSET', KEYS[2], me, now + ttl)
for _, k in ipairs(KEYS) do
  if redis.call('PTTL', k) < ttl then redis.call('PEXPIRE', k, ttl) end
end
local exclusive = string.sub(me, 1, 1) == 'x'
for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if m == me then return 1 end
  local expiry = tonumber(redis.call('HGET', KEYS[2], m) or '0')
  if expiry < now then
    redis.call('ZREM', KEYS[1], m)
    redis.call('HDEL', KEYS[2], m)
  elseif exclusive or string.sub(m, 1, 1) == 'x' then
    return 0
  end
end
return 1";

/// A request sent to the other replicas, waiting for their replies: dropping it (answered,
/// timed out, or its caller gone) forgets the request.
pub(crate) struct Awaiting {
    inner: Arc<RedisConn>,
    pub(crate) req: u64,
    pub(crate) replies: mpsc::UnboundedReceiver<ReplyMsg>,
}

impl Drop for Awaiting {
    fn drop(&mut self) {
        self.inner.pending.lock().remove(&self.req);
    }
}

/// Writes waiting in the outbox past which new ones are not queued: Redis is up but does not
/// keep up, and a write is then treated as one made while it is down (counted, and kept for
/// later if Redis must get it).
pub(crate) const OUTBOX_CAPACITY: usize = 65_536;

impl RedisConn {
    /// Queues `write` for the outbox; a full outbox drops it as if Redis were down.
    pub(crate) fn post(&self, write: Write) {
        if let Err(mpsc::error::TrySendError::Full(write)) = self.outbox.try_send(write) {
            self.metrics.fallback(write.op());
            self.missed.lock().keep(write);
        }
    }

    /// A new request to the other replicas, whose replies come to the returned receiver.
    pub(crate) fn awaiting(self: &Arc<Self>) -> Awaiting {
        let req = self.next_req.fetch_add(1, Ordering::Relaxed);
        let (tx, replies) = mpsc::unbounded_channel();
        self.pending.lock().insert(req, tx);
        Awaiting {
            inner: self.clone(),
            req,
            replies,
        }
    }

    /// Marks Redis unreachable (the watcher notices when it is back).
    pub(crate) fn down(&self, why: String) {
        *self.down_reason.lock() = why;
        if self.up.swap(false, Ordering::AcqRel) {
            tracing::warn!(reason = %self.down_reason.lock(), "redis unreachable: running on local state");
        }
        self.metrics.set_up(false);
    }

    /// Runs one operation under the timeout; an error or a timeout marks Redis down.
    pub(crate) async fn run<T, F>(&self, op: &'static str, fut: F) -> Option<T>
    where
        F: Future<Output = redis::RedisResult<T>>,
    {
        match tokio::time::timeout(self.options.timeout, fut).await {
            Ok(Ok(v)) => Some(v),
            Ok(Err(e)) => {
                self.metrics.fallback(op);
                self.down(format!("{op}: {e}"));
                None
            }
            Err(_) => {
                self.metrics.fallback(op);
                self.down(format!(
                    "{op}: no answer within {}ms",
                    self.options.timeout.as_millis()
                ));
                None
            }
        }
    }

    /// Whether to try Redis at all; counts a fallback when not.
    pub(crate) fn usable(&self, op: &'static str) -> bool {
        let up = self.up.load(Ordering::Acquire);
        if !up {
            self.metrics.fallback(op);
        }
        up
    }
}
