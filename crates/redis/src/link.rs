//! The tasks behind the handle: the outbox that writes what only informs the others, the watcher
//! that (re)connects and resynchronises, the inbox that carries out what the others say, and the
//! forwarder of this replica's events.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{PushInfo, Value};
use tokio::sync::mpsc;
use toolwarden_core::shared::{
    AbortAnswer, AbortRequest, BreakerChange, CacheClaim, RemoteEvent, TaskAnswer, TaskAsk,
    TaskRequest,
};
use toolwarden_core::{Engine, Received};
use toolwarden_protocol::{BreakerStateKind, SessionKey, Timestamp};

use crate::conn::{RELEASE, RedisConn, Write};
use crate::wire::{AbortMsg, BreakerMsg, EventMsg, ReplyMsg, TaskMsg, TurnsAsk, own_events_start};

/// At most this many writes go in one pipeline.
const BATCH: usize = 512;

/// Milliseconds since the Unix epoch: breakers' half-open times are wall-clock times, the only
/// time replicas have in common.
fn epoch_ms() -> u64 {
    u64::try_from(Timestamp::now_unix_micros() / 1000).unwrap_or(0)
}

/// Writes the queued writes, in order, a pipeline at a time. While Redis is down they are
/// dropped (and counted): breakers are resynchronised when it is back; cache stores, releases
/// (their keys expire) and events are not needed later.
pub(crate) async fn drain_outbox(inner: Arc<RedisConn>, mut rx: mpsc::Receiver<Write>) {
    let mut batch = Vec::with_capacity(BATCH);
    while let Some(first) = rx.recv().await {
        batch.push(first);
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(w) => batch.push(w),
                Err(_) => break,
            }
        }
        if !inner.up.load(Ordering::Acquire) {
            let mut missed = inner.missed.lock();
            for w in batch.drain(..) {
                inner.metrics.fallback(w.op());
                missed.keep(w);
            }
            continue;
        }
        let mut pipe = redis::pipe();
        // What Redis must get even if this pipeline fails (it is written again when Redis is
        // back): a session's places left and its stale runs dropped.
        let mut keep = Vec::new();
        // The events of a run of consecutive writes go in one message, a line each.
        let mut events = String::new();
        for w in batch.drain(..) {
            if let Write::Event(payload) = w {
                if !events.is_empty() {
                    events.push('\n');
                }
                events.push_str(&payload);
                continue;
            }
            publish_events(&inner, &mut pipe, &mut events);
            match &w {
                Write::GateLeave { session, place } => keep.push(Write::GateLeave {
                    session: session.clone(),
                    place: place.clone(),
                }),
                Write::DropRun { session } => keep.push(Write::DropRun {
                    session: session.clone(),
                }),
                _ => {}
            }
            add_write(&inner, &mut pipe, w);
        }
        publish_events(&inner, &mut pipe, &mut events);
        let mut conn = inner.cmd.clone();
        let written: Option<()> = inner.run("outbox", pipe.query_async(&mut conn)).await;
        if written.is_none() {
            let mut missed = inner.missed.lock();
            for w in keep {
                missed.keep(w);
            }
        }
    }
}

/// Publishes the events gathered so far, if any, as one message: one [`EventMsg`] per line (JSON
/// has no raw line breaks), all of this replica. At 32 calls in flight a pipeline carries the
/// events of several calls, so a replica publishes (and every other one receives) a message
/// per pipeline instead of one per event.
fn publish_events(inner: &RedisConn, pipe: &mut redis::Pipeline, events: &mut String) {
    if !events.is_empty() {
        pipe.publish(inner.keys.events_channel(), std::mem::take(events))
            .ignore();
    }
}

fn add_write(inner: &RedisConn, pipe: &mut redis::Pipeline, write: Write) {
    match write {
        Write::Breaker { tool, change } => {
            let open_for_ms = match change {
                BreakerChange::Open { for_ } => {
                    let ms = for_.as_millis() as u64;
                    pipe.hset(inner.keys.breakers(), &tool, epoch_ms() + ms)
                        .ignore();
                    Some(ms)
                }
                BreakerChange::Closed => {
                    pipe.hdel(inner.keys.breakers(), &tool).ignore();
                    None
                }
            };
            let msg = BreakerMsg {
                replica: inner.replica.to_string(),
                tool,
                open_for_ms,
            };
            pipe.publish(
                inner.keys.breaker_channel(),
                serde_json::to_string(&msg).unwrap_or_default(),
            )
            .ignore();
        }
        Write::Release { key } => {
            release(pipe, &key, &inner.replica);
        }
        Write::CachePut {
            key,
            lock,
            value,
            ttl,
        } => {
            pipe.cmd("SET")
                .arg(&key)
                .arg(value)
                .arg("PX")
                .arg(ttl.as_millis().max(1) as u64)
                .ignore();
            release(pipe, &lock, &inner.replica);
        }
        Write::Event(payload) => {
            let mut events = payload;
            publish_events(inner, pipe, &mut events);
        }
        Write::DropRun { session } => {
            pipe.del(inner.keys.loop_run(&session)).ignore();
        }
        Write::GateLeave { session, place } => {
            pipe.zrem(inner.keys.gate(&session), &place)
                .ignore()
                .hdel(inner.keys.gate_expiry(&session), &place)
                .ignore()
                .publish(inner.keys.gate_channel(), session)
                .ignore();
        }
        Write::QuotaRelease { buckets, member } => {
            let member = format!("{}:{member}", inner.replica);
            for bucket in buckets {
                pipe.zrem(inner.keys.quota_running(&bucket), &member)
                    .ignore();
            }
        }
        Write::QuotaRenew {
            buckets,
            member,
            lease,
        } => {
            // Only a place still held: one already given back stays given back. Scored in
            // Redis's clock, as the take scored it, and the set kept at least as long.
            let member = format!("{}:{member}", inner.replica);
            let cmd = pipe.cmd("EVAL");
            cmd.arg(crate::quota::QUOTA_RENEW).arg(buckets.len());
            for bucket in &buckets {
                cmd.arg(inner.keys.quota_running(bucket));
            }
            cmd.arg(&member)
                .arg(u64::try_from(lease.as_millis()).unwrap_or(u64::MAX).max(1))
                .ignore();
        }
    }
}

fn release(pipe: &mut redis::Pipeline, key: &str, replica: &str) {
    pipe.cmd("EVAL")
        .arg(RELEASE)
        .arg(1)
        .arg(key)
        .arg(replica)
        .ignore();
}

/// Reads the claim script's answer.
pub(crate) fn claim_answer(value: Value) -> CacheClaim {
    let Value::Array(items) = value else {
        return CacheClaim::Unavailable;
    };
    match items.as_slice() {
        [Value::Int(1), Value::BulkString(v), Value::Int(ttl)] => CacheClaim::Hit {
            value: v.clone(),
            ttl: Duration::from_millis(u64::try_from(*ttl).unwrap_or(1).max(1)),
        },
        [Value::Int(2)] => CacheClaim::Lead,
        [Value::Int(3)] => CacheClaim::Follow,
        _ => CacheClaim::Unavailable,
    }
}

/// Starts the subscription, the watcher, the inbox and the event forwarder for `engine`.
pub(crate) fn start(inner: Arc<RedisConn>, engine: Engine) -> redis::RedisResult<()> {
    let (push_tx, push_rx) = mpsc::unbounded_channel::<PushInfo>();
    let mut info = redis::IntoConnectionInfo::into_connection_info(inner.options.url.as_str())?;
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(redis::ProtocolVersion::RESP3);
    info = info.set_redis_settings(settings);
    let client = redis::Client::open(info)?;
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(inner.options.timeout))
        .set_response_timeout(Some(inner.options.timeout))
        .set_number_of_retries(1)
        .set_max_delay(inner.options.timeout)
        .set_push_sender(push_tx)
        .set_automatic_resubscription();
    let sub = ConnectionManager::new_lazy_with_config(client, config)?;
    tokio::spawn(watch(inner.clone(), sub, engine.clone()));
    tokio::spawn(inbox(inner.clone(), push_rx, engine.clone()));
    tokio::spawn(forward_events(inner, engine));
    Ok(())
}

/// Checks that Redis answers every `check_every`; when it comes back (or first answers),
/// subscribes again, resynchronises the breakers and marks it up.
async fn watch(inner: Arc<RedisConn>, mut sub: ConnectionManager, engine: Engine) {
    let bound = inner.options.timeout;
    loop {
        let check = async {
            let mut cmd = inner.cmd.clone();
            let _: String = redis::cmd("PING").query_async(&mut cmd).await?;
            let _: Value = redis::cmd("PING").query_async(&mut sub).await?;
            if !inner.up.load(Ordering::Acquire) {
                let channels = vec![
                    inner.keys.breaker_channel(),
                    inner.keys.abort_channel(),
                    inner.keys.task_update_channel(),
                    inner.keys.reply_channel(&inner.replica),
                    inner.keys.events_channel(),
                    inner.keys.gate_channel(),
                    inner.keys.turns_channel(),
                ];
                sub.subscribe(channels).await?;
                resync(&inner, &engine).await?;
            }
            redis::RedisResult::Ok(())
        };
        match tokio::time::timeout(bound * 4, check).await {
            Ok(Ok(())) => {
                if !inner.up.swap(true, Ordering::AcqRel) {
                    tracing::info!("redis reached: replicas share state");
                }
                inner.metrics.set_up(true);
                flush_missed(&inner);
            }
            Ok(Err(e)) => inner.down(e.to_string()),
            Err(_) => inner.down(format!("no answer within {}ms", (bound * 4).as_millis())),
        }
        tokio::time::sleep(inner.options.check_every).await;
    }
}

/// Breakers after Redis was away (or at start): the others' open breakers open here, and this
/// replica's open breakers (opened while Redis was away) are told to the others.
async fn resync(inner: &RedisConn, engine: &Engine) -> redis::RedisResult<()> {
    let mut conn = inner.cmd.clone();
    let stored: HashMap<String, u64> = redis::cmd("HGETALL")
        .arg(inner.keys.breakers())
        .query_async(&mut conn)
        .await?;
    let now = epoch_ms();
    let mut pipe = redis::pipe();
    for (tool, until) in &stored {
        if *until > now {
            let for_ = Duration::from_millis(until - now);
            engine.apply_shared_breaker(tool, BreakerChange::Open { for_ });
        } else {
            pipe.hdel(inner.keys.breakers(), tool).ignore();
        }
    }
    for breaker in engine.open_breakers() {
        let (BreakerStateKind::Open, Some(left)) = (breaker.state, breaker.retry_after_ms) else {
            continue;
        };
        if stored.get(&breaker.tool).is_some_and(|u| *u >= now + left) {
            continue;
        }
        add_write(
            inner,
            &mut pipe,
            Write::Breaker {
                tool: breaker.tool,
                change: BreakerChange::Open {
                    for_: Duration::from_millis(left),
                },
            },
        );
    }
    if pipe.is_empty() {
        return Ok(());
    }
    pipe.query_async::<()>(&mut conn).await
}

/// Sessions after Redis was away, once it is up again: a run counted here alone is dropped
/// there (the session's next call starts a new run rather than resume a stale one), and the
/// places left meanwhile are left there too — through the outbox, behind the calls.
fn flush_missed(inner: &RedisConn) {
    let missed = std::mem::take(&mut *inner.missed.lock());
    for session in missed.runs {
        inner.post(Write::DropRun { session });
    }
    for (session, place) in missed.leaves {
        inner.post(Write::GateLeave { session, place });
    }
}

/// How an accepted tool change is told apart in a message of events without parsing it.
const ACCEPTED: &str = "\"type\":\"tool_accepted\"";

/// Carries out what the other replicas say, in the order they said it.
async fn inbox(inner: Arc<RedisConn>, mut rx: mpsc::UnboundedReceiver<PushInfo>, engine: Engine) {
    let (breakers, aborts, replies, events) = (
        inner.keys.breaker_channel(),
        inner.keys.abort_channel(),
        inner.keys.reply_channel(&inner.replica),
        inner.keys.events_channel(),
    );
    let (gates, turns) = (inner.keys.gate_channel(), inner.keys.turns_channel());
    let updates = inner.keys.task_update_channel();
    let own_events = own_events_start(&inner.replica);
    while let Some(push) = rx.recv().await {
        let Some(msg) = redis::Msg::from_push_info(push) else {
            continue;
        };
        let channel = msg.get_channel_name();
        let payload = msg.get_payload_bytes();
        if channel == events {
            // This replica's own events come back on the channel, and nobody may be following
            // the others': neither is read any further.
            // (A tool's change accepted elsewhere is read whoever follows: it frees the calls
            // this replica holds for it.)
            let followed = engine.remote_events_followed();
            let accepted = payload
                .windows(ACCEPTED.len())
                .any(|w| w == ACCEPTED.as_bytes());
            if payload.starts_with(&own_events) || !(followed || accepted) {
                continue;
            }
            for line in payload.split(|b| *b == b'\n') {
                if let Ok(m) = serde_json::from_slice::<EventMsg>(line)
                    && *m.replica != *inner.replica
                {
                    if let toolwarden_protocol::EventKind::ToolAccepted {
                        digest,
                        by: Some(_),
                        ..
                    } = &m.event.kind
                        && let Some(tool) = &m.event.scope.tool
                    {
                        engine.tool_accepted_elsewhere(tool, digest);
                    }
                    if followed {
                        engine.push_remote_event(RemoteEvent {
                            replica: Arc::from(m.replica),
                            event: m.event,
                        });
                    }
                }
            }
        } else if channel == gates {
            if let Some(session) = std::str::from_utf8(payload)
                .ok()
                .and_then(SessionKey::decode)
            {
                engine.gate_released_elsewhere(&session);
            }
        } else if channel == turns {
            if let Ok(m) = serde_json::from_slice::<TurnsAsk>(payload) {
                answer_turns(&inner, &engine, m);
            }
        } else if channel == updates {
            if let Ok(m) = serde_json::from_slice::<TaskMsg>(payload) {
                carry_out_task(&inner, &engine, m);
            }
        } else if channel == aborts {
            if let Ok(m) = serde_json::from_slice::<AbortMsg>(payload) {
                carry_out_abort(&inner, &engine, m);
            }
        } else if channel == replies {
            if let Ok(m) = serde_json::from_slice::<ReplyMsg>(payload)
                && let Some(tx) = inner.pending.lock().get(&m.req)
            {
                let _ = tx.send(m);
            }
        } else if channel == breakers
            && let Ok(m) = serde_json::from_slice::<BreakerMsg>(payload)
            && *m.replica != *inner.replica
        {
            let change = match m.open_for_ms {
                Some(ms) => BreakerChange::Open {
                    for_: Duration::from_millis(ms),
                },
                None => BreakerChange::Closed,
            };
            engine.apply_shared_breaker(&m.tool, change);
        }
    }
}

/// Answers request `req` of replica `asker` (the asker counts every answer). A request this
/// replica sent itself comes back on the channel: it was tried here before it was sent, so it is
/// answered "not here" at once. Another replica's is answered on its channel with what `answer`
/// carries out here.
fn answer_request(
    inner: &Arc<RedisConn>,
    asker: &str,
    req: u64,
    answer: impl FnOnce() -> ReplyMsg,
) {
    if *asker == *inner.replica {
        if let Some(tx) = inner.pending.lock().get(&req) {
            let _ = tx.send(ReplyMsg {
                req,
                ..ReplyMsg::default()
            });
        }
        return;
    }
    reply(inner, asker, &ReplyMsg { req, ..answer() });
}

/// A request about a task from a replica that does not hold it — its answers, or its state —
/// carried out here if this one holds it, and answered either way.
fn carry_out_task(inner: &Arc<RedisConn>, engine: &Engine, m: TaskMsg) {
    answer_request(inner, &m.replica, m.req, || {
        let answer = engine.answer_task_here(&TaskRequest {
            task_id: m.task_id,
            principal: m.principal,
            ask: if m.get {
                TaskAsk::Get
            } else {
                TaskAsk::Update(m.responses)
            },
        });
        let (found, refused, task) = match answer {
            TaskAnswer::Done(task) => (true, None, task),
            TaskAnswer::Refused(why) => (true, Some(why), None),
            TaskAnswer::NotFound => (false, None, None),
        };
        ReplyMsg {
            found,
            refused,
            task,
            ..ReplyMsg::default()
        }
    });
}

/// An abort from a replica that does not run the turn: carried out here if this one does, and
/// answered either way.
fn carry_out_abort(inner: &Arc<RedisConn>, engine: &Engine, m: AbortMsg) {
    answer_request(inner, &m.replica, m.req, || {
        let answer = engine.abort_here(&AbortRequest {
            turn_id: m.turn_id,
            call_id: m.call_id,
            reason: m.reason,
            only_of: m.only_of.map(Arc::from),
        });
        ReplyMsg {
            found: answer == AbortAnswer::Done,
            not_yours: answer == AbortAnswer::NotYours,
            ..ReplyMsg::default()
        }
    });
}

/// A request for this replica's running turns: answered with them (one's own request is
/// answered with nothing, the asker has its own).
fn answer_turns(inner: &Arc<RedisConn>, engine: &Engine, m: TurnsAsk) {
    answer_request(inner, &m.replica, m.req, || ReplyMsg {
        found: true,
        replica: Some(inner.replica.to_string()),
        turns: Some(engine.active_turns()),
        ..ReplyMsg::default()
    });
}

/// Publishes an answer on the asker's channel, behind the inbox.
fn reply(inner: &Arc<RedisConn>, asker: &str, msg: &ReplyMsg) {
    let reply = serde_json::to_string(msg).unwrap_or_default();
    let channel = inner.keys.reply_channel(asker);
    let inner = inner.clone();
    tokio::spawn(async move {
        let mut conn = inner.cmd.clone();
        let _: Option<u64> = inner
            .run(
                "reply",
                redis::cmd("PUBLISH")
                    .arg(&channel)
                    .arg(&reply)
                    .query_async(&mut conn),
            )
            .await;
    });
}

/// Sends every event of this replica to the others (while Redis is up).
async fn forward_events(inner: Arc<RedisConn>, engine: Engine) {
    let mut sub = engine.subscribe();
    while let Some(received) = sub.recv().await {
        let Received::Event(event) = received else {
            continue;
        };
        if !inner.up.load(Ordering::Acquire) {
            // Lost to the others, as every write behind a call is while Redis is away: counted.
            inner.metrics.fallback("event");
            continue;
        }
        let msg = EventMsg {
            replica: inner.replica.to_string(),
            event,
        };
        if let Ok(payload) = serde_json::to_string(&msg) {
            inner.post(Write::Event(payload));
        }
    }
}
