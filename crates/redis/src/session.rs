//! A named session's state across replicas — its loop run and its gate — and the request for
//! every replica's running turns (docs/SCALE-OUT.md).
//!
//! Round trips on a call's path: one `HMGET` before a call of a named session (its run), one
//! script after it (counting its answer), and — only when some tool is exclusive — one script to
//! pass the session's gate (again after each wake-up while it waits); leaving the gate is
//! written behind the call.

use std::sync::Arc;
use std::time::Duration;

use toolwarden_core::shared::{GateAnswer, GatePlace, LoopRun, ReplicaTurns};

use crate::conn::{GATE_ENTER, LOOP_RECORD, RedisConn, Write};
use crate::wire::TurnsAsk;

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// A session's place name: its kind, this replica and the place's id.
pub(crate) fn place_name(inner: &RedisConn, place: GatePlace) -> String {
    let kind = if place.exclusive { 'x' } else { 'r' };
    format!("{kind}:{}:{}", inner.replica, place.id)
}

pub(crate) async fn loop_run(
    inner: Arc<RedisConn>,
    session: String,
) -> Result<Option<LoopRun>, ()> {
    if !inner.usable("loop_run") {
        return Err(());
    }
    let mut cmd = redis::cmd("HMGET");
    cmd.arg(inner.keys.loop_run(session.as_str()))
        .arg("c")
        .arg("n");
    let mut conn = inner.cmd.clone();
    let got: Option<(Option<Vec<u8>>, Option<u32>)> =
        inner.run("loop_run", cmd.query_async(&mut conn)).await;
    match got {
        None => Err(()),
        Some((Some(call), Some(count))) => Ok(<[u8; 32]>::try_from(call.as_slice())
            .ok()
            .map(|call| LoopRun { call, count })),
        Some(_) => Ok(None),
    }
}

pub(crate) async fn loop_record(
    inner: Arc<RedisConn>,
    session: String,
    call: [u8; 32],
    result: Option<[u8; 32]>,
    ttl: Duration,
) -> Option<u32> {
    if !inner.usable("loop_record") {
        inner.missed.lock().run(session.as_str());
        return None;
    }
    let script = redis::Script::new(LOOP_RECORD);
    let mut invocation = script.key(inner.keys.loop_run(session.as_str()));
    invocation
        .arg(&call[..])
        .arg(result.as_ref().map_or(&[][..], |r| &r[..]))
        .arg(millis(ttl));
    let mut conn = inner.cmd.clone();
    let count = inner
        .run("loop_record", invocation.invoke_async(&mut conn))
        .await;
    if count.is_none() {
        inner.missed.lock().run(session.as_str());
    }
    count
}

pub(crate) async fn gate_enter(
    inner: Arc<RedisConn>,
    session: String,
    place: GatePlace,
    ttl: Duration,
) -> GateAnswer {
    if !inner.usable("gate_enter") {
        return GateAnswer::Unavailable;
    }
    let script = redis::Script::new(GATE_ENTER);
    let name = place_name(&inner, place);
    let mut invocation = script.key(inner.keys.gate(session.as_str()));
    invocation
        .key(inner.keys.gate_expiry(session.as_str()))
        .arg(&name)
        .arg(millis(ttl));
    let mut conn = inner.cmd.clone();
    let answer: Option<i64> = inner
        .run("gate_enter", invocation.invoke_async(&mut conn))
        .await;
    match answer {
        Some(1) => GateAnswer::Pass,
        Some(_) => GateAnswer::Wait,
        None => {
            // Redis may have taken the place before it stopped answering: leave it when it is
            // back (the caller no longer holds it).
            inner.missed.lock().keep(Write::GateLeave {
                session: session.to_string(),
                place: name,
            });
            GateAnswer::Unavailable
        }
    }
}

/// Asks every replica for its running turns; the answers that arrive within twice the timeout.
pub(crate) async fn turns_elsewhere(inner: Arc<RedisConn>) -> Vec<ReplicaTurns> {
    if !inner.usable("turns") {
        return Vec::new();
    }
    let mut awaiting = inner.awaiting();
    let payload = serde_json::to_string(&TurnsAsk {
        replica: inner.replica.to_string(),
        req: awaiting.req,
    })
    .unwrap_or_default();
    let mut conn = inner.cmd.clone();
    let sent: Option<u64> = inner
        .run(
            "turns",
            redis::cmd("PUBLISH")
                .arg(inner.keys.turns_channel())
                .arg(&payload)
                .query_async(&mut conn),
        )
        .await;
    let mut all = Vec::new();
    if let Some(listeners) = sent {
        // Every replica that heard it answers (this one with nothing).
        let collect = async {
            for _ in 0..listeners {
                let Some(reply) = awaiting.replies.recv().await else {
                    return;
                };
                if let (Some(replica), Some(turns)) = (reply.replica, reply.turns) {
                    all.push(ReplicaTurns { replica, turns });
                }
            }
        };
        let _ = tokio::time::timeout(inner.options.timeout * 2, collect).await;
    }
    all
}
