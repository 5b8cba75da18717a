//! `[[quotas]]`: token-bucket rates and concurrency caps per principal, session, tool or for
//! everyone (docs/RULES.md, "Quotas").
//!
//! A call takes one token from the bucket of every quota that matches it, and a place among the
//! running calls of every quota with a `concurrency` — all of them or none: a call turned away by
//! one quota takes nothing from the others. The place is held by the [`QuotaHold`] until the call
//! ends.
//!
//! Alone, a replica keeps its buckets in memory. With shared state (Redis), the buckets and the
//! running calls are the shared ones, taken in one round trip per call; while the shared state
//! cannot be reached, each replica enforces its share of each limit locally — the limit divided
//! by the number of live replicas it last knew, rounded up — never no limit at all.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;
use toolwarden_protocol::{DenyReason, QuotaConfig, QuotaPer};

use crate::rules::glob;
use crate::shared::{QuotaAnswer, QuotaTake, SharedState};

/// How long a call turned away by a concurrency cap is told to wait: the cap frees a place when
/// some running call ends, which nothing here can foresee.
pub const CONCURRENCY_RETRY: Duration = Duration::from_secs(1);

/// A rate: `count` calls per `period`, bursting to `count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    /// Calls per period (and the bucket's size).
    pub count: u32,
    /// The period.
    pub period: Duration,
}

impl Rate {
    /// Parses `"N/PERIOD"`: `60/min`, `5/s`, `1000/h`, `100/day`, `10/30s`.
    pub fn parse(text: &str) -> Result<Rate, String> {
        let bad = || {
            format!(
                "{text:?} is not a rate: write \"N/PERIOD\", N calls per period, like \"60/min\", \"5/s\", \"1000/h\" or \"10/30s\""
            )
        };
        let (count, period) = text.split_once('/').ok_or_else(bad)?;
        let count: u32 = count.trim().parse().map_err(|_| bad())?;
        if count == 0 {
            return Err(format!(
                "{text:?} allows no call at all: a rate's count must be at least 1 (deny the calls with a rule instead)"
            ));
        }
        let period = match period.trim() {
            "s" | "sec" | "second" => Duration::from_secs(1),
            "m" | "min" | "minute" => Duration::from_secs(60),
            "h" | "hour" => Duration::from_secs(3600),
            "d" | "day" => Duration::from_secs(86_400),
            other => {
                let ms = toolwarden_protocol::parse_duration(other).map_err(|_| bad())?;
                Duration::from_millis(u64::try_from(ms).map_err(|_| bad())?)
            }
        };
        if period.is_zero() {
            return Err(bad());
        }
        Ok(Rate { count, period })
    }

    fn per_ms(self) -> f64 {
        f64::from(self.count) / (self.period.as_secs_f64() * 1000.0)
    }
}

/// One compiled `[[quotas]]` entry.
#[derive(Debug)]
pub struct Quota {
    /// Its index in the config file's `[[quotas]]`.
    pub index: usize,
    principals: Option<Vec<String>>,
    tools: Option<Vec<String>>,
    /// Its rate, if any.
    pub rate: Option<Rate>,
    /// Its concurrency cap, if any.
    pub concurrency: Option<u32>,
    /// Whose bucket a call takes from.
    pub per: QuotaPer,
}

impl Quota {
    fn matches(&self, facts: &QuotaFacts<'_>) -> bool {
        self.tools
            .as_ref()
            .is_none_or(|g| g.iter().any(|g| glob(g, facts.tool)))
            && self
                .principals
                .as_ref()
                .is_none_or(|g| g.iter().any(|g| glob(g, facts.principal)))
    }

    /// The name of the bucket `facts` take from.
    fn bucket(&self, facts: &QuotaFacts<'_>) -> String {
        match self.per {
            QuotaPer::Principal => facts.principal.to_owned(),
            QuotaPer::Session => facts.session.to_owned(),
            QuotaPer::Tool => facts.tool.to_owned(),
            QuotaPer::Global => "global".to_owned(),
        }
    }
}

/// An error in one `[[quotas]]` entry.
#[derive(Debug)]
pub struct QuotaError {
    /// The entry's index.
    pub index: usize,
    /// The key at fault.
    pub key: &'static str,
    /// What is wrong.
    pub message: String,
}

/// What a quota is asked about.
pub struct QuotaFacts<'a> {
    /// The tool, as agents call it.
    pub tool: &'a str,
    /// The principal's name.
    pub principal: &'a str,
    /// The session, as a bucket name (its principal and id).
    pub session: &'a str,
}

/// A call turned away.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaRefusal {
    /// The quota's index.
    pub quota: usize,
    /// `rate_limit` or `concurrency`.
    pub reason: DenyReason,
    /// Whose bucket.
    pub bucket: String,
    /// When to try again.
    pub retry_after: Duration,
    /// The quota, as the model's text names it (`5/min per principal`).
    pub what: String,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Every `[[quotas]]` entry, compiled, and the buckets and running counts kept in this replica.
#[derive(Debug)]
pub struct Quotas {
    list: Vec<Quota>,
    /// Local buckets, by quota index and bucket name.
    buckets: Mutex<HashMap<(usize, String), Bucket>>,
    /// Local running calls, by quota index and bucket name.
    running: Mutex<HashMap<(usize, String), u32>>,
    /// The live replicas the shared state last counted (1 alone).
    replicas: AtomicU32,
    /// By quota index: the tokens left in the bucket a call last took from.
    last_tokens: Mutex<std::collections::BTreeMap<usize, f64>>,
    /// Past this many local buckets, the full ones are forgotten (a full bucket is what a new one
    /// would be): callers name sessions, and their buckets must not grow without end.
    evict_at: std::sync::atomic::AtomicUsize,
}

/// The local buckets kept before the full ones are first forgotten.
const EVICT_AT: usize = 10_000;

impl Quotas {
    /// Compiles `[[quotas]]`; `None` when there are none.
    pub fn compile(configs: &[QuotaConfig]) -> Result<Option<Quotas>, QuotaError> {
        if configs.is_empty() {
            return Ok(None);
        }
        let mut list = Vec::with_capacity(configs.len());
        for (index, c) in configs.iter().enumerate() {
            let fail = |key, message: String| QuotaError {
                index,
                key,
                message,
            };
            let rate = c
                .rate
                .as_deref()
                .map(Rate::parse)
                .transpose()
                .map_err(|m| fail("rate", m))?;
            let concurrency = match c.concurrency {
                None => None,
                Some(n) if n >= 1 => Some(u32::try_from(n).unwrap_or(u32::MAX)),
                Some(n) => {
                    return Err(fail(
                        "concurrency",
                        format!(
                            "{n} would let no call run: concurrency must be at least 1 (deny the calls with a rule instead)"
                        ),
                    ));
                }
            };
            if rate.is_none() && concurrency.is_none() {
                return Err(fail(
                    "rate",
                    "a quota needs a rate (\"60/min\"), a concurrency (4), or both".to_owned(),
                ));
            }
            for (key, globs) in [("tools", &c.tools), ("principals", &c.principals)] {
                if globs.as_ref().is_some_and(Vec::is_empty) {
                    return Err(fail(
                        key,
                        format!(
                            "an empty list matches nothing: leave {key} out to match every one, or name some"
                        ),
                    ));
                }
            }
            list.push(Quota {
                index,
                principals: c.principals.clone(),
                tools: c.tools.clone(),
                rate,
                concurrency,
                per: c.per.unwrap_or_default(),
            });
        }
        Ok(Some(Quotas {
            list,
            buckets: Mutex::default(),
            running: Mutex::default(),
            replicas: AtomicU32::new(1),
            last_tokens: Mutex::default(),
            evict_at: std::sync::atomic::AtomicUsize::new(EVICT_AT),
        }))
    }

    /// The compiled entries, in file order.
    pub fn list(&self) -> &[Quota] {
        &self.list
    }

    /// The quotas that calls of `tool` by `principal` take from, by index.
    pub fn matching(&self, tool: &str, principal: &str) -> Vec<usize> {
        let facts = QuotaFacts {
            tool,
            principal,
            session: "",
        };
        self.list
            .iter()
            .filter(|q| q.matches(&facts))
            .map(|q| q.index)
            .collect()
    }

    /// Whether any quota applies to calls of `tool` (by any principal).
    pub fn names_tool(&self, tool: &str) -> bool {
        self.list.iter().any(|q| {
            q.tools
                .as_ref()
                .is_none_or(|g| g.iter().any(|g| glob(g, tool)))
        })
    }

    /// Takes what a call needs from every quota that matches it: `Ok` with the hold to keep
    /// while it runs (nothing to hold when none matches), or the first refusal. `member` names
    /// the call among the running ones across replicas; `lease` bounds how long a replica that
    /// died may be counted as running it.
    pub async fn take(
        self: &Arc<Self>,
        facts: &QuotaFacts<'_>,
        shared: Option<&Arc<dyn SharedState>>,
        member: &str,
        lease: Duration,
    ) -> Result<Option<QuotaHold>, QuotaRefusal> {
        let matched: Vec<(&Quota, String)> = self
            .list
            .iter()
            .filter(|q| q.matches(facts))
            .map(|q| (q, q.bucket(facts)))
            .collect();
        if matched.is_empty() {
            return Ok(None);
        }
        if let Some(shared) = shared {
            let takes: Vec<QuotaTake> = matched
                .iter()
                .map(|(q, bucket)| QuotaTake {
                    bucket: format!("{}:{bucket}", q.index),
                    rate: q.rate.map(|r| (r.count, r.period)),
                    concurrency: q.concurrency,
                })
                .collect();
            if let Ok(QuotaAnswer {
                refused,
                replicas,
                left,
            }) = shared.quota_take(takes, member.to_owned(), lease).await
            {
                self.replicas.store(replicas.max(1), Ordering::Relaxed);
                {
                    let mut last = self.last_tokens.lock();
                    for ((q, _), left) in matched.iter().zip(left) {
                        if let Some(left) = left {
                            last.insert(q.index, left);
                        }
                    }
                }
                if let Some((i, reason, retry_after)) = refused {
                    let (q, bucket) = &matched[i.min(matched.len() - 1)];
                    return Err(refusal(q, bucket.clone(), reason, retry_after));
                }
                let shared_keys: Vec<String> = matched
                    .iter()
                    .filter(|(q, _)| q.concurrency.is_some())
                    .map(|(q, bucket)| format!("{}:{bucket}", q.index))
                    .collect();
                // A place held across replicas is renewed while the call runs: every half lease.
                let renew = (!shared_keys.is_empty()).then(|| {
                    let (shared, keys, member) =
                        (shared.clone(), shared_keys.clone(), member.to_owned());
                    tokio::spawn(async move {
                        let every = (lease / 2).max(Duration::from_millis(500));
                        let mut tick = tokio::time::interval_at(Instant::now() + every, every);
                        loop {
                            tick.tick().await;
                            shared.quota_renew(keys.clone(), member.clone(), lease);
                        }
                    })
                    .abort_handle()
                });
                return Ok(Some(QuotaHold {
                    quotas: self.clone(),
                    local: Vec::new(),
                    shared: (!shared_keys.is_empty())
                        .then(|| (shared.clone(), shared_keys, member.to_owned())),
                    renew,
                }));
            }
        }
        // Alone, or the shared state away: this replica's share of each limit.
        let share = if shared.is_some() {
            self.replicas.load(Ordering::Relaxed).max(1)
        } else {
            1
        };
        self.take_local(&matched, share)
    }

    fn take_local(
        self: &Arc<Self>,
        matched: &[(&Quota, String)],
        share: u32,
    ) -> Result<Option<QuotaHold>, QuotaRefusal> {
        let now = Instant::now();
        let mut buckets = self.buckets.lock();
        let mut running = self.running.lock();
        let evict_at = self.evict_at.load(Ordering::Relaxed);
        if buckets.len() > evict_at {
            buckets.retain(|(index, _), b| {
                let Some(rate) = self.list.get(*index).and_then(|q| q.rate) else {
                    return false;
                };
                refill(b, rate, now);
                b.tokens < f64::from(rate.count)
            });
            // Those left are in use: look again only once as many more have come.
            self.evict_at
                .store((buckets.len() * 2).max(EVICT_AT), Ordering::Relaxed);
        }
        // Check every quota first: a call turned away takes nothing from any.
        for (q, bucket) in matched {
            let key = (q.index, bucket.clone());
            if let Some(rate) = q.rate {
                let rate = Rate {
                    count: rate.count.div_ceil(share),
                    ..rate
                };
                let b = buckets.entry(key.clone()).or_insert(Bucket {
                    tokens: f64::from(rate.count),
                    at: now,
                });
                refill(b, rate, now);
                if b.tokens < 1.0 {
                    let wait_ms = ((1.0 - b.tokens) / rate.per_ms()).ceil().max(1.0);
                    let retry_after = Duration::from_millis(wait_ms as u64);
                    return Err(refusal(
                        q,
                        bucket.clone(),
                        DenyReason::RateLimit,
                        retry_after,
                    ));
                }
            }
            if let Some(cap) = q.concurrency {
                let cap = cap.div_ceil(share);
                if running.get(&key).copied().unwrap_or(0) >= cap {
                    return Err(refusal(
                        q,
                        bucket.clone(),
                        DenyReason::Concurrency,
                        CONCURRENCY_RETRY,
                    ));
                }
            }
        }
        let mut held = Vec::new();
        let mut last = self.last_tokens.lock();
        for (q, bucket) in matched {
            let key = (q.index, bucket.clone());
            if q.rate.is_some()
                && let Some(b) = buckets.get_mut(&key)
            {
                b.tokens -= 1.0;
                last.insert(q.index, b.tokens);
            }
            if q.concurrency.is_some() {
                *running.entry(key.clone()).or_insert(0) += 1;
                held.push(key);
            }
        }
        Ok(Some(QuotaHold {
            quotas: self.clone(),
            local: held,
            shared: None,
            renew: None,
        }))
    }

    /// By quota index, the tokens left in the bucket a call last took from (for
    /// `toolwarden_quota_tokens{quota}`).
    pub fn tokens(&self) -> Vec<(usize, f64)> {
        self.last_tokens
            .lock()
            .iter()
            .map(|(i, t)| (*i, *t))
            .collect()
    }
}

/// For explain: the hooks asked about calls of `tool` (by name, in the order they are asked)
/// and the quotas calls of it by `principal` take from (by index).
pub fn guards_of(
    hooks: Option<&crate::hooks::HookSet>,
    quotas: Option<&Quotas>,
    tool: &str,
    principal: &str,
) -> (Vec<String>, Vec<usize>) {
    let hooks = hooks.map_or_else(Vec::new, |h| {
        h.for_tool(tool).map(|h| h.name.clone()).collect()
    });
    let quotas = quotas.map_or_else(Vec::new, |q| q.matching(tool, principal));
    (hooks, quotas)
}

fn refill(b: &mut Bucket, rate: Rate, now: Instant) {
    let elapsed_ms = now.saturating_duration_since(b.at).as_secs_f64() * 1000.0;
    b.tokens = (b.tokens + elapsed_ms * rate.per_ms()).min(f64::from(rate.count));
    b.at = now;
}

fn refusal(q: &Quota, bucket: String, reason: DenyReason, retry_after: Duration) -> QuotaRefusal {
    let mut what = Vec::new();
    if let Some(rate) = q.rate {
        what.push(format!(
            "{}/{}",
            rate.count,
            toolwarden_protocol::format_duration(rate.period)
        ));
    }
    if let Some(cap) = q.concurrency {
        what.push(format!("{cap} at once"));
    }
    QuotaRefusal {
        quota: q.index,
        reason,
        what: format!(
            "quota {}: {} per {}",
            q.index,
            what.join(", "),
            q.per.as_str()
        ),
        bucket,
        retry_after,
    }
}

/// A call's places among the running calls of its quotas, given back when it is dropped.
pub struct QuotaHold {
    quotas: Arc<Quotas>,
    local: Vec<(usize, String)>,
    shared: Option<(Arc<dyn SharedState>, Vec<String>, String)>,
    /// The task renewing the shared places' leases.
    renew: Option<tokio::task::AbortHandle>,
}

impl Drop for QuotaHold {
    fn drop(&mut self) {
        if let Some(renew) = self.renew.take() {
            renew.abort();
        }
        if !self.local.is_empty() {
            let mut running = self.quotas.running.lock();
            for key in self.local.drain(..) {
                if let Some(n) = running.get_mut(&key) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        running.remove(&key);
                    }
                }
            }
        }
        if let Some((shared, keys, member)) = self.shared.take() {
            shared.quota_release(keys, member);
        }
    }
}

#[cfg(test)]
mod tests;
