//! Quotas across replicas (docs/RULES.md, "Quotas"): one script per call takes a token from
//! every bucket of the quotas that match it and a place among their running calls — all or
//! none — and counts the replicas seen alive lately, whose number divides each limit into a
//! replica's local share while Redis is away.
//!
//! A bucket is a hash (`t` the tokens left, `a` when they were counted, in Redis's own clock);
//! the running calls of a bucket are a sorted set of members scored by when their lease ends, so
//! that a replica that died holding places frees them when their leases end.

use std::sync::Arc;
use std::time::Duration;

use toolwarden_core::shared::{QuotaAnswer, QuotaTake};
use toolwarden_protocol::DenyReason;

use crate::conn::RedisConn;

/// How long a replica counts as alive after its last quota check.
const ALIVE_MS: u64 = 60_000;

/// KEYS: the replicas' set, then per take its bucket and its running set. ARGV: this replica,
/// the call's member, its lease (ms), then per take the rate's count and period (ms, 0: none)
/// and the concurrency cap (0: none). Returns `{take (1-based, 0: none refused), reason (1 rate,
/// 2 concurrency), retry after (ms), live replicas}`, then, when none was refused, per take the
/// tokens left in its bucket (`-1`: no rate) as text.
const QUOTA_TAKE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[4]))
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[4]))
local live = redis.call('ZCARD', KEYS[1])
local member, lease = ARGV[2], tonumber(ARGV[3])
local n = (#KEYS - 1) / 2
local left = {}
for i = 1, n do
  local bucket, running = KEYS[2 * i], KEYS[2 * i + 1]
  local count = tonumber(ARGV[2 + 3 * i])
  local period = tonumber(ARGV[3 + 3 * i])
  local cap = tonumber(ARGV[4 + 3 * i])
  if count > 0 then
    local b = redis.call('HMGET', bucket, 't', 'a')
    local tokens = tonumber(b[1]) or count
    local at = tonumber(b[2]) or now
    if now > at then tokens = math.min(count, tokens + (now - at) * count / period) end
    if tokens < 1 then
      return {i, 1, math.max(1, math.ceil((1 - tokens) * period / count)), live}
    end
    left[i] = tokens
  end
  if cap > 0 then
    redis.call('ZREMRANGEBYSCORE', running, '-inf', now)
    if redis.call('ZCARD', running) >= cap then return {i, 2, 1000, live} end
  end
end
for i = 1, n do
  local bucket, running = KEYS[2 * i], KEYS[2 * i + 1]
  local period = tonumber(ARGV[3 + 3 * i])
  if left[i] then
    redis.call('HSET', bucket, 't', tostring(left[i] - 1), 'a', now)
    redis.call('PEXPIRE', bucket, period * 2)
  end
  if tonumber(ARGV[4 + 3 * i]) > 0 then
    redis.call('ZADD', running, now + lease, member)
    if redis.call('PTTL', running) < lease then redis.call('PEXPIRE', running, lease) end
  end
end
local out = {0, 0, 0, live}
for i = 1, n do
  if left[i] then out[4 + i] = tostring(left[i] - 1) else out[4 + i] = '-1' end
end
return out";

/// KEYS: the running sets of a call's buckets. ARGV: its member, its lease (ms). Extends the
/// member's place in each set that still holds it to a lease from now (Redis's clock), and the
/// set's own expiry to at least that.
pub(crate) const QUOTA_RENEW: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local member, lease = ARGV[1], tonumber(ARGV[2])
for _, k in ipairs(KEYS) do
  if redis.call('ZSCORE', k, member) then
    redis.call('ZADD', k, now + lease, member)
    if redis.call('PTTL', k) < lease then redis.call('PEXPIRE', k, lease) end
  end
end
return 0";

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

pub(crate) async fn take(
    inner: Arc<RedisConn>,
    takes: Vec<QuotaTake>,
    member: String,
    lease: Duration,
) -> Result<QuotaAnswer, ()> {
    if !inner.usable("quota") {
        return Err(());
    }
    let script = redis::Script::new(QUOTA_TAKE);
    let mut invocation = script.key(inner.keys.replicas());
    invocation
        .arg(&*inner.replica)
        .arg(format!("{}:{member}", inner.replica))
        .arg(millis(lease))
        .arg(ALIVE_MS);
    for take in &takes {
        invocation
            .key(inner.keys.quota(&take.bucket))
            .key(inner.keys.quota_running(&take.bucket));
        let (count, period) = take.rate.map_or((0, 0), |(c, p)| (c, millis(p)));
        invocation
            .arg(count)
            .arg(period)
            .arg(take.concurrency.unwrap_or(0));
    }
    let mut conn = inner.cmd.clone();
    let answer: Option<Vec<redis::Value>> =
        inner.run("quota", invocation.invoke_async(&mut conn)).await;
    let answer = answer.ok_or(())?;
    let num = |k: usize| -> u64 {
        match answer.get(k) {
            Some(redis::Value::Int(n)) => u64::try_from(*n).unwrap_or(0),
            _ => 0,
        }
    };
    let (i, why, retry_ms, live) = (
        usize::try_from(num(0)).unwrap_or(0),
        num(1),
        num(2),
        u32::try_from(num(3)).unwrap_or(1),
    );
    let left = (0..takes.len())
        .map(|k| match answer.get(4 + k) {
            Some(redis::Value::BulkString(b)) => std::str::from_utf8(b)
                .ok()
                .and_then(|t| t.parse::<f64>().ok())
                .filter(|t| *t >= 0.0),
            _ => None,
        })
        .collect();
    let refused = (i > 0).then(|| {
        let reason = if why == 2 {
            DenyReason::Concurrency
        } else {
            DenyReason::RateLimit
        };
        (i - 1, reason, Duration::from_millis(retry_ms))
    });
    Ok(QuotaAnswer {
        refused,
        replicas: live.max(1),
        left,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use toolwarden_core::shared::{QuotaTake, SharedState};

    use crate::{Options, RedisShared};

    /// The Redis the scale-out tests use (`TOOLWARDEN_TEST_REDIS_URL`, else the local one).
    fn url() -> String {
        std::env::var("TOOLWARDEN_TEST_REDIS_URL")
            .unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
    }

    fn cap_of_one() -> Vec<QuotaTake> {
        vec![QuotaTake {
            bucket: "0:global".into(),
            rate: None,
            concurrency: Some(1),
        }]
    }

    /// A place renewed while its call runs outlives its first lease, set and all; given back,
    /// it frees the cap.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_renewed_place_outlives_its_first_lease() {
        let metrics = toolwarden_core::Metrics::new();
        let prefix = format!("twtest:quota-renew:{}:", ulid::Ulid::new());
        let shared = RedisShared::new(
            Options {
                url: url(),
                prefix,
                timeout: Duration::from_secs(2),
                check_every: Duration::from_secs(1),
                label: None,
            },
            metrics.shared().clone(),
        )
        .unwrap();
        // No engine here: Redis is taken as reached (the watcher would say so).
        shared.inner.up.store(true, Ordering::Release);
        let lease = Duration::from_millis(400);
        let first = shared
            .quota_take(cap_of_one(), "t1/c1".into(), lease)
            .await
            .unwrap();
        assert_eq!(first.refused, None);
        let second = shared
            .quota_take(cap_of_one(), "t2/c1".into(), lease)
            .await
            .unwrap();
        assert!(second.refused.is_some(), "{second:?}");
        // Renewed for longer: past the first lease, the place (and its set) is still there.
        shared.quota_renew(
            vec!["0:global".into()],
            "t1/c1".into(),
            Duration::from_secs(5),
        );
        tokio::time::sleep(Duration::from_millis(800)).await;
        let still = shared
            .quota_take(cap_of_one(), "t3/c1".into(), lease)
            .await
            .unwrap();
        assert!(
            still.refused.is_some(),
            "the renewed place lapsed: {still:?}"
        );
        // Given back: the next call gets it.
        shared.quota_release(vec!["0:global".into()], "t1/c1".into());
        tokio::time::sleep(Duration::from_millis(200)).await;
        let freed = shared
            .quota_take(cap_of_one(), "t4/c1".into(), lease)
            .await
            .unwrap();
        assert_eq!(freed.refused, None);
    }
}
