//! The result cache with single-flight (docs/GOVERNANCE.md, "The cache and single flight").
//!
//! Keyed by tool name and the SHA-256 of the input's canonical JSON. Only `ok` results of
//! idempotent tools with `cache_ttl > 0` are stored. Identical calls that arrive while one is
//! running share that execution: the first becomes the *leader*, the others wait for its result.
//! If the leader does not end `ok` (or goes away), the waiters try again — one of them becomes the
//! next leader — so one cancelled caller never fails the others.

use crate::maps::{CallDigest, DigestMap};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;
use toolwarden_protocol::{CallId, CallResult, Content};

/// A stored `ok` result: the producing call's own result, shared, and how many of its content
/// blocks came from the tool (the engine may have appended notes). Cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct CachedResult {
    pub(crate) result: Arc<CallResult>,
    pub(crate) tool_blocks: usize,
}

impl CachedResult {
    pub(crate) fn content(&self) -> &[Content] {
        &self.result.content[..self.tool_blocks.min(self.result.content.len())]
    }

    pub(crate) fn origin_call_id(&self) -> &CallId {
        &self.result.outcome.call_id
    }

    /// The form other replicas read (docs/SCALE-OUT.md): JSON of the result and its tool blocks.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let wire = serde_json::json!({"tool_blocks": self.tool_blocks, "result": &*self.result});
        serde_json::to_vec(&wire).unwrap_or_default()
    }

    /// Reads what [`CachedResult::encode`] made; `None` for anything else.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Self> {
        let mut wire: serde_json::Value = serde_json::from_slice(bytes).ok()?;
        let tool_blocks = usize::try_from(wire.get("tool_blocks")?.as_u64()?).ok()?;
        let result: CallResult = serde_json::from_value(wire.get_mut("result")?.take()).ok()?;
        Some(Self {
            result: Arc::new(result),
            tool_blocks,
        })
    }
}

struct CacheEntry {
    result: CachedResult,
    expires: Instant,
}

/// A running execution's outcome as waiters see it: `None` while running, then `Some(None)` when
/// it ended without a shareable result, `Some(Some(r))` when it ended `ok`.
type Flight = watch::Receiver<Option<Option<CachedResult>>>;

/// What a lookup found.
pub(crate) enum Lookup {
    /// A fresh stored result.
    Hit(CachedResult),
    /// Nobody has it; the caller runs the call and must complete the guard.
    Lead(FlightGuard),
    /// An identical call is running; wait on it.
    Follow(Flight),
}

/// The cache of every tool.
pub(crate) struct Cache {
    inner: Arc<Mutex<CacheInner>>,
    max_entries: usize,
}

/// A running execution. Its channel is made only when a second identical call arrives.
type FlightSender = Option<watch::Sender<Option<Option<CachedResult>>>>;

#[derive(Default)]
struct CacheInner {
    entries: DigestMap<CacheEntry>,
    flights: DigestMap<FlightSender>,
    /// Stored keys in the order they were stored, with the expiry they were stored with: the
    /// eviction order when the cache is full (oldest first). An item whose entry was since
    /// replaced or removed is stale and skipped.
    order: VecDeque<(Instant, CallDigest)>,
    /// Results out of the cache, waiting to be freed in one batch on the reaper thread.
    evicted: Vec<CachedResult>,
}

impl CacheInner {
    /// Makes room for one more entry by evicting the oldest stored ones (expired or not).
    fn make_room(&mut self, max_entries: usize, now: Instant) {
        while self.entries.len() >= max_entries {
            let Some((expires, key)) = self.order.pop_front() else {
                break;
            };
            if let std::collections::hash_map::Entry::Occupied(entry) = self.entries.entry(key)
                && entry.get().expires == expires
            {
                self.evicted.push(entry.remove().result);
            }
        }
        // Stale items (entries replaced or expired and dropped) must not pile up.
        if self.order.len() > 2 * max_entries {
            let entries = &self.entries;
            self.order.retain(|(expires, key)| {
                entries
                    .get(key)
                    .is_some_and(|e| e.expires == *expires && e.expires > now)
            });
            self.entries.retain(|_, e| e.expires > now);
        }
    }
}

impl Cache {
    pub(crate) fn new(max_entries: usize) -> Self {
        Self {
            inner: Arc::new(Mutex::new(CacheInner::default())),
            max_entries: max_entries.max(1),
        }
    }

    /// A fresh stored result for `key`, without joining or leading an execution.
    pub(crate) fn hit(&self, key: &CallDigest, now: Instant) -> Option<CachedResult> {
        let inner = self.inner.lock();
        inner
            .entries
            .get(key)
            .filter(|e| e.expires > now)
            .map(|e| e.result.clone())
    }

    /// Looks `key` up at `now`: a hit, or the duty to lead its execution, or one to follow.
    pub(crate) fn lookup(&self, key: &CallDigest, now: Instant) -> Lookup {
        let mut inner = self.inner.lock();
        if let Some(entry) = inner.entries.get(key) {
            if entry.expires > now {
                return Lookup::Hit(entry.result.clone());
            }
            inner.entries.remove(key);
        }
        if let Some(flight) = inner.flights.get_mut(key) {
            let tx = flight.get_or_insert_with(|| watch::channel(None).0);
            return Lookup::Follow(tx.subscribe());
        }
        inner.flights.insert(*key, None);
        Lookup::Lead(FlightGuard {
            key: Some(*key),
            inner: self.inner.clone(),
            max_entries: self.max_entries,
        })
    }

    /// How many results are stored (expired ones included until swept).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.inner.lock().entries.len()
    }
}

/// Waits for a leader's result: `Some` when it ended `ok`, `None` when the waiter should look up
/// again.
pub(crate) async fn follow(mut flight: Flight) -> Option<CachedResult> {
    loop {
        if let Some(done) = flight.borrow_and_update().clone() {
            return done;
        }
        if flight.changed().await.is_err() {
            return flight.borrow().clone().flatten();
        }
    }
}

/// The leader's duty: publish how its execution ended. Dropping it publishes "no result".
pub(crate) struct FlightGuard {
    key: Option<CallDigest>,
    inner: Arc<Mutex<CacheInner>>,
    max_entries: usize,
}

impl FlightGuard {
    /// The execution ended `ok`: store the result for `ttl` and hand it to the waiters.
    pub(crate) fn complete(mut self, result: CachedResult, ttl: Duration, now: Instant) {
        let Some(key) = self.key.take() else { return };
        let mut inner = self.inner.lock();
        inner.make_room(self.max_entries, now);
        let expires = now + ttl;
        inner.order.push_back((expires, key));
        inner.entries.insert(
            key,
            CacheEntry {
                result: result.clone(),
                expires,
            },
        );
        if let Some(Some(tx)) = inner.flights.remove(&key) {
            tx.send_replace(Some(Some(result)));
        }
        let batch = crate::reaper::full_batch(&mut inner.evicted);
        drop(inner);
        crate::reaper::bury(batch);
    }
}

impl Drop for FlightGuard {
    fn drop(&mut self) {
        if let Some(key) = self.key.take()
            && let Some(Some(tx)) = self.inner.lock().flights.remove(&key)
        {
            tx.send_replace(Some(None));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> CallDigest {
        CallDigest([n; 32])
    }

    fn result(origin: &str) -> CachedResult {
        use toolwarden_protocol::{Outcome, Status};
        let outcome = Outcome {
            status: Status::Ok,
            attempts: 1,
            call_id: origin.into(),
            turn_id: "t".into(),
            tool: "t".into(),
            duration_ms: 0,
            provenance: None,
            detail: None,
            repeat_count: None,
        };
        let result = CallResult {
            outcome,
            content: vec![Content::text("r")],
            structured_content: None,
            is_error: false,
        };
        CachedResult {
            result: Arc::new(result),
            tool_blocks: 1,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn results_live_for_their_ttl() {
        let cache = Cache::new(100);
        let now = Instant::now();
        let Lookup::Lead(guard) = cache.lookup(&key(1), now) else {
            panic!("expected to lead")
        };
        guard.complete(result("c1"), Duration::from_secs(10), now);
        assert!(
            matches!(cache.lookup(&key(1), now + Duration::from_secs(9)), Lookup::Hit(r) if r.origin_call_id().as_str() == "c1")
        );
        assert!(matches!(
            cache.lookup(&key(1), now + Duration::from_secs(10)),
            Lookup::Lead(_)
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn identical_calls_share_one_execution() {
        let cache = Cache::new(100);
        let now = Instant::now();
        let Lookup::Lead(guard) = cache.lookup(&key(1), now) else {
            panic!()
        };
        let Lookup::Follow(f1) = cache.lookup(&key(1), now) else {
            panic!()
        };
        let Lookup::Follow(f2) = cache.lookup(&key(1), now) else {
            panic!()
        };
        let w1 = tokio::spawn(follow(f1));
        let w2 = tokio::spawn(follow(f2));
        guard.complete(result("leader"), Duration::from_secs(5), now);
        assert_eq!(
            w1.await.unwrap().unwrap().origin_call_id().as_str(),
            "leader"
        );
        assert_eq!(
            w2.await.unwrap().unwrap().origin_call_id().as_str(),
            "leader"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_leader_that_fails_lets_a_waiter_lead() {
        let cache = Cache::new(100);
        let now = Instant::now();
        let Lookup::Lead(guard) = cache.lookup(&key(1), now) else {
            panic!()
        };
        let Lookup::Follow(f) = cache.lookup(&key(1), now) else {
            panic!()
        };
        drop(guard);
        assert!(follow(f).await.is_none());
        assert!(matches!(cache.lookup(&key(1), now), Lookup::Lead(_)));
    }

    #[tokio::test(start_paused = true)]
    async fn stays_within_its_size() {
        let cache = Cache::new(10);
        let now = Instant::now();
        for n in 0..50u8 {
            let Lookup::Lead(g) = cache.lookup(&key(n), now) else {
                panic!()
            };
            g.complete(result("c"), Duration::from_secs(u64::from(n) + 1), now);
        }
        assert!(cache.len() <= 10);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_cache_drops_the_oldest_stored_first() {
        let cache = Cache::new(3);
        let mut now = Instant::now();
        for n in 0..5u8 {
            let Lookup::Lead(g) = cache.lookup(&key(n), now) else {
                panic!()
            };
            g.complete(result("c"), Duration::from_secs(60), now);
            now += Duration::from_millis(1);
        }
        assert_eq!(cache.len(), 3);
        for n in 0..2 {
            assert!(
                cache.hit(&key(n), now).is_none(),
                "{n} was among the oldest"
            );
        }
        for n in 2..5 {
            assert!(
                cache.hit(&key(n), now).is_some(),
                "{n} was among the newest"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn stored_again_and_again_its_bookkeeping_stays_bounded() {
        let cache = Cache::new(4);
        let mut now = Instant::now();
        for _ in 0..1000 {
            // Expired by the next lookup: removed there, then stored again.
            let Lookup::Lead(g) = cache.lookup(&key(1), now) else {
                panic!()
            };
            g.complete(result("c"), Duration::from_secs(1), now);
            now += Duration::from_secs(2);
        }
        let inner = cache.inner.lock();
        assert!(inner.order.len() <= 8, "{} queued", inner.order.len());
        assert!(inner.entries.len() <= 4);
    }
}
