//! [`RedisShared`]: the handle the engine holds, and core's `SharedState` on it.
//!
//! Round trips a call makes (docs/SCALE-OUT.md): none for a call of a closed breaker that is not
//! cacheable; one (a script) for a cacheable call that missed this replica's cache, then one
//! pipelined write behind it; one (`SET NX`) for a half-open probe. Everything else — breaker
//! changes, cache stores, releases, events — goes through the outbox, off the call's path.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use redis::aio::ConnectionManager;
use tokio::sync::mpsc;
use toolwarden_core::BoxFuture;
use toolwarden_core::metrics::SharedMetrics;
use toolwarden_core::shared::{
    AbortAnswer, AbortRequest, BreakerChange, CacheClaim, GateAnswer, GatePlace, LoopRun,
    QuotaAnswer, QuotaTake, ReplicaTurns, SharedHealth, SharedState, TaskAnswer, TaskAsk,
    TaskRequest,
};
use toolwarden_protocol::SessionKey;

use crate::conn::{CLAIM, OUTBOX_CAPACITY, RedisConn, Write};
use crate::keys::Keys;
use crate::link;
use crate::options::Options;
use crate::session;
use crate::wire::{AbortMsg, ReplyMsg, TaskMsg};

/// State shared with other replicas through Redis. Cheap to clone.
#[derive(Clone)]
pub struct RedisShared {
    pub(crate) inner: Arc<RedisConn>,
}

impl std::fmt::Debug for RedisShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisShared")
            .field("replica", &self.inner.replica)
            .finish_non_exhaustive()
    }
}

impl RedisShared {
    /// Connects lazily (a Redis that is down at start only makes the replica start degraded) and
    /// starts the watcher and the outbox. Call [`RedisShared::attach`] once the engine is built.
    pub fn new(options: Options, metrics: SharedMetrics) -> Result<Self, redis::RedisError> {
        let client = redis::Client::open(options.url.as_str())?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.timeout))
            .set_response_timeout(Some(options.timeout))
            .set_number_of_retries(1)
            .set_max_delay(options.timeout);
        let cmd = ConnectionManager::new_lazy_with_config(client, config)?;
        let (outbox, rx) = mpsc::channel(OUTBOX_CAPACITY);
        metrics.set_up(false);
        let inner = Arc::new(RedisConn {
            replica: Arc::from(replica_name(options.label.as_deref())),
            keys: Keys::new(&options.prefix),
            options,
            cmd,
            up: AtomicBool::new(false),
            down_reason: Mutex::new("not connected yet".to_owned()),
            metrics,
            outbox,
            pending: Mutex::new(HashMap::new()),
            next_req: AtomicU64::new(1),
            missed: Mutex::default(),
        });
        tokio::spawn(link::drain_outbox(inner.clone(), rx));
        Ok(Self { inner })
    }

    /// Starts listening to the other replicas for `engine` and sending them its events; the
    /// watcher (re)connects and resynchronises. The tasks end with the process.
    pub fn attach(&self, engine: toolwarden_core::Engine) -> Result<(), redis::RedisError> {
        link::start(self.inner.clone(), engine)
    }

    /// This replica's name in messages.
    pub fn replica(&self) -> &str {
        &self.inner.replica
    }

    /// Frees at once what the replica named `name` holds — half-open probes, cache locks,
    /// places in sessions' lines and in quotas — once it has been declared dead; answers how
    /// many were freed (`None`: Redis did not answer, and they free themselves at their TTLs).
    pub async fn release_replica(&self, name: &str) -> Option<u64> {
        if !self.inner.usable("release_replica") {
            return None;
        }
        crate::release::release_replica(&self.inner, name).await
    }

    fn enqueue(&self, write: Write) {
        if self.inner.up.load(Ordering::Acquire) {
            self.inner.post(write);
        } else {
            // Breakers are resynchronised when Redis is back, and a session's places left; the
            // rest is lost to the others.
            self.inner.metrics.fallback(write.op());
            self.inner.missed.lock().keep(write);
        }
    }
}

/// Publishes `payload` on `channel` and reads the replies of every replica that heard it (this
/// one included), at most twice the timeout: the first reply `decide` makes an answer of is the
/// answer, else `otherwise`. (The request is forgotten when `awaiting` goes, whatever ends the
/// wait.)
async fn ask_others<T>(
    inner: &Arc<RedisConn>,
    op: &'static str,
    channel: String,
    payload: String,
    mut awaiting: crate::conn::Awaiting,
    otherwise: T,
    decide: impl Fn(ReplyMsg) -> Option<T>,
) -> T {
    let mut conn = inner.cmd.clone();
    let sent: Option<u64> = inner
        .run(
            op,
            redis::cmd("PUBLISH")
                .arg(&channel)
                .arg(&payload)
                .query_async(&mut conn),
        )
        .await;
    let listeners = match sent {
        None | Some(0) => return otherwise,
        Some(n) => n,
    };
    let wait = async {
        for _ in 0..listeners {
            match awaiting.replies.recv().await {
                Some(reply) => {
                    if let Some(answer) = decide(reply) {
                        return Some(answer);
                    }
                }
                None => return None,
            }
        }
        None
    };
    tokio::time::timeout(inner.options.timeout * 2, wait)
        .await
        .ok()
        .flatten()
        .unwrap_or(otherwise)
}

/// A replica's name: a ULID made now, or `LABEL-` and the ULID's last eight (random)
/// characters.
fn replica_name(label: Option<&str>) -> String {
    let ulid = ulid::Ulid::new().to_string();
    match label.filter(|l| !l.is_empty()) {
        Some(label) => format!("{label}-{}", &ulid[ulid.len() - 8..]),
        None => ulid,
    }
}

impl SharedState for RedisShared {
    fn health(&self) -> SharedHealth {
        if self.inner.up.load(Ordering::Acquire) {
            SharedHealth::Ok
        } else {
            SharedHealth::Degraded(format!(
                "redis unreachable, running on local state: {}",
                self.inner.down_reason.lock()
            ))
        }
    }

    fn breaker_changed(&self, tool: &str, change: BreakerChange) {
        self.enqueue(Write::Breaker {
            tool: tool.to_owned(),
            change,
        });
    }

    fn probe_lease(&self, tool: &str, ttl: Duration) -> BoxFuture<bool> {
        let inner = self.inner.clone();
        let key = inner.keys.probe(tool);
        Box::pin(async move {
            if !inner.usable("probe_lease") {
                return true;
            }
            let mut cmd = redis::cmd("SET");
            cmd.arg(&key)
                .arg(&*inner.replica)
                .arg("NX")
                .arg("PX")
                .arg(ttl.as_millis().max(1) as u64);
            let mut conn = inner.cmd.clone();
            let got: Option<Option<String>> =
                inner.run("probe_lease", cmd.query_async(&mut conn)).await;
            match got {
                Some(answer) => answer.is_some(),
                // Unreachable: the local breaker decides alone.
                None => true,
            }
        })
    }

    fn probe_release(&self, tool: &str) {
        self.enqueue(Write::Release {
            key: self.inner.keys.probe(tool),
        });
    }

    fn cache_claim(&self, key: &[u8; 32], lock_ttl: Duration) -> BoxFuture<CacheClaim> {
        let inner = self.inner.clone();
        let (value_key, lock_key) = (inner.keys.cache(key), inner.keys.cache_lock(key));
        Box::pin(async move {
            if !inner.usable("cache_claim") {
                return CacheClaim::Unavailable;
            }
            let script = redis::Script::new(CLAIM);
            let mut invocation = script.key(&value_key);
            invocation
                .key(&lock_key)
                .arg(&*inner.replica)
                .arg(lock_ttl.as_millis().max(1) as u64);
            let mut conn = inner.cmd.clone();
            let answer: Option<redis::Value> = inner
                .run("cache_claim", invocation.invoke_async(&mut conn))
                .await;
            match answer {
                Some(value) => link::claim_answer(value),
                None => CacheClaim::Unavailable,
            }
        })
    }

    fn cache_put(&self, key: &[u8; 32], value: Vec<u8>, ttl: Duration) {
        self.enqueue(Write::CachePut {
            key: self.inner.keys.cache(key),
            lock: self.inner.keys.cache_lock(key),
            value,
            ttl,
        });
    }

    fn cache_release(&self, key: &[u8; 32]) {
        self.enqueue(Write::Release {
            key: self.inner.keys.cache_lock(key),
        });
    }

    fn abort_elsewhere(&self, abort: AbortRequest) -> BoxFuture<AbortAnswer> {
        let inner = self.inner.clone();
        Box::pin(async move {
            if !inner.usable("abort") {
                return AbortAnswer::NotFound;
            }
            let awaiting = inner.awaiting();
            let msg = AbortMsg {
                replica: inner.replica.to_string(),
                req: awaiting.req,
                turn_id: abort.turn_id,
                call_id: abort.call_id,
                reason: abort.reason,
                only_of: abort.only_of.map(|p| p.to_string()),
            };
            let payload = serde_json::to_string(&msg).unwrap_or_default();
            let channel = inner.keys.abort_channel();
            // The first replica that runs the turn decides.
            ask_others(
                &inner,
                "abort",
                channel,
                payload,
                awaiting,
                AbortAnswer::NotFound,
                |reply| {
                    if reply.found {
                        Some(AbortAnswer::Done)
                    } else if reply.not_yours {
                        Some(AbortAnswer::NotYours)
                    } else {
                        None
                    }
                },
            )
            .await
        })
    }

    fn task_elsewhere(&self, request: TaskRequest) -> BoxFuture<TaskAnswer> {
        let inner = self.inner.clone();
        Box::pin(async move {
            if !inner.usable("task_update") {
                return TaskAnswer::NotFound;
            }
            let awaiting = inner.awaiting();
            let (responses, get) = match request.ask {
                TaskAsk::Update(responses) => (responses, false),
                TaskAsk::Get => (serde_json::Value::Null, true),
            };
            let msg = TaskMsg {
                replica: inner.replica.to_string(),
                req: awaiting.req,
                task_id: request.task_id,
                principal: request.principal,
                responses,
                get,
            };
            let payload = serde_json::to_string(&msg).unwrap_or_default();
            let channel = inner.keys.task_update_channel();
            // The replica that holds the task decides.
            ask_others(
                &inner,
                "task_update",
                channel,
                payload,
                awaiting,
                TaskAnswer::NotFound,
                |reply| match reply.refused {
                    Some(why) => Some(TaskAnswer::Refused(why)),
                    None => reply.found.then_some(TaskAnswer::Done(reply.task)),
                },
            )
            .await
        })
    }

    fn replica(&self) -> &str {
        &self.inner.replica
    }

    fn turns_elsewhere(&self) -> BoxFuture<Vec<ReplicaTurns>> {
        Box::pin(session::turns_elsewhere(self.inner.clone()))
    }

    fn loop_run(&self, session: &SessionKey) -> BoxFuture<Result<Option<LoopRun>, ()>> {
        Box::pin(session::loop_run(self.inner.clone(), session.encode()))
    }

    fn loop_record(
        &self,
        session: &SessionKey,
        call: &[u8; 32],
        result: Option<[u8; 32]>,
        ttl: Duration,
    ) -> BoxFuture<Option<u32>> {
        Box::pin(session::loop_record(
            self.inner.clone(),
            session.encode(),
            *call,
            result,
            ttl,
        ))
    }

    fn gate_enter(
        &self,
        session: &SessionKey,
        place: GatePlace,
        ttl: Duration,
    ) -> BoxFuture<GateAnswer> {
        Box::pin(session::gate_enter(
            self.inner.clone(),
            session.encode(),
            place,
            ttl,
        ))
    }

    fn quota_take(
        &self,
        takes: Vec<QuotaTake>,
        member: String,
        lease: Duration,
    ) -> BoxFuture<Result<QuotaAnswer, ()>> {
        Box::pin(crate::quota::take(self.inner.clone(), takes, member, lease))
    }

    fn quota_release(&self, buckets: Vec<String>, member: String) {
        self.enqueue(Write::QuotaRelease { buckets, member });
    }

    fn quota_renew(&self, buckets: Vec<String>, member: String, lease: Duration) {
        self.enqueue(Write::QuotaRenew {
            buckets,
            member,
            lease,
        });
    }

    fn gate_leave(&self, session: &SessionKey, place: GatePlace) {
        self.enqueue(Write::GateLeave {
            session: session.encode(),
            place: session::place_name(&self.inner, place),
        });
    }
}
