//! The event bus: every event gets the next `seq` and goes to every subscriber without ever
//! blocking the engine.
//!
//! Built on a bounded broadcast ring. A subscriber that falls behind by more than the ring's size
//! loses the oldest events and is told how many ([`Received::Lagged`]); the engine never waits for
//! anyone. Durable sinks (the audit trail) are fed synchronously in `seq` order through
//! [`EventSink::record`], which must only enqueue.

use std::sync::Arc;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use parking_lot::{Mutex, RwLock};
use tokio::sync::broadcast;
use tokio::time::Instant;
use toolwarden_protocol::{Event, EventKind, Timestamp};

use crate::clock::WallClock;

/// The default number of events a subscriber may fall behind before it loses some.
pub const DEFAULT_CAPACITY: usize = 8192;

/// Receives every event in `seq` order (e.g. the audit trail). `record` runs on the engine's path:
/// it must not block — enqueue and return.
pub trait EventSink: Send + Sync + 'static {
    /// One event, in order.
    fn record(&self, event: &Arc<Event>);

    /// Whether the sink still wants events; a sink that does not is dropped from the bus.
    fn alive(&self) -> bool {
        true
    }
}

/// The events a filter accepts, in `seq` order, none lost (see [`EventBus::subscribe_matching`]).
#[derive(Debug)]
pub struct Matching {
    rx: tokio::sync::mpsc::UnboundedReceiver<Arc<Event>>,
}

impl Matching {
    /// The next accepted event; `None` once the bus is gone.
    pub async fn recv(&mut self) -> Option<Arc<Event>> {
        self.rx.recv().await
    }
}

struct MatchingSink<F> {
    filter: F,
    tx: tokio::sync::mpsc::UnboundedSender<Arc<Event>>,
}

impl<F> EventSink for MatchingSink<F>
where
    F: Fn(&Event) -> bool + Send + Sync + 'static,
{
    fn record(&self, event: &Arc<Event>) {
        if (self.filter)(event) {
            let _ = self.tx.send(event.clone());
        }
    }

    fn alive(&self) -> bool {
        !self.tx.is_closed()
    }
}

pub use toolwarden_protocol::EventScope;

/// The bus. Cheap to share (`Arc`).
pub struct EventBus {
    tx: broadcast::Sender<Arc<Event>>,
    /// The last `seq` handed out.
    seq: AtomicU64,
    /// Held while an observed event is numbered, kept and sent, so that channel order is `seq`
    /// order; it guards the most recent events, kept for subscribers that resume
    /// (`Last-Event-ID`), off until [`EventBus::keep_recent`] turns it on.
    sending: Mutex<Recent>,
    sinks: RwLock<Vec<Arc<dyn EventSink>>>,
    /// Live subscriptions; with the two flags below, tells without a lock whether anything
    /// would see an event.
    observers: Arc<AtomicUsize>,
    has_sinks: AtomicBool,
    keeping: AtomicBool,
    /// Stamps events (and the engine's other wall-clock times) from monotonic instants.
    clock: WallClock,
}

#[derive(Default)]
struct Recent {
    capacity: usize,
    events: std::collections::VecDeque<Arc<Event>>,
    /// Events out of the ring, waiting to be freed in one batch.
    evicted: Vec<Arc<Event>>,
}

impl std::fmt::Debug for EventBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventBus")
            .field("seq", &self.last_seq())
            .finish()
    }
}

impl EventBus {
    /// A bus whose subscribers may fall `capacity` events behind.
    pub fn new(capacity: usize) -> Self {
        let (tx, _) = broadcast::channel(capacity.max(16));
        Self {
            tx,
            seq: AtomicU64::new(0),
            sending: Mutex::new(Recent::default()),
            sinks: RwLock::new(Vec::new()),
            observers: Arc::new(AtomicUsize::new(0)),
            has_sinks: AtomicBool::new(false),
            keeping: AtomicBool::new(false),
            clock: WallClock::new(),
        }
    }

    /// Adds a durable sink.
    pub fn add_sink(&self, sink: Arc<dyn EventSink>) {
        let mut sinks = self.sinks.write();
        sinks.retain(|s| s.alive());
        sinks.push(sink);
        self.has_sinks.store(true, Ordering::Release);
    }

    /// The events `filter` accepts, handed over as they are emitted. For a watcher that cares
    /// about a few kinds of events: unlike a [`Subscription`], it is not woken for the others,
    /// and it never lags. `filter` runs on the engine's path, in `emit`: it must be quick and
    /// must not block. Dropping the returned [`Matching`] ends it.
    pub fn subscribe_matching(
        &self,
        filter: impl Fn(&Event) -> bool + Send + Sync + 'static,
    ) -> Matching {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        self.add_sink(Arc::new(MatchingSink { filter, tx }));
        Matching { rx }
    }

    /// Keeps the last `capacity` events for [`EventBus::subscribe_since`] (0 turns it off).
    pub fn keep_recent(&self, capacity: usize) {
        let mut recent = self.sending.lock();
        recent.capacity = capacity;
        self.keeping.store(capacity > 0, Ordering::Release);
        while recent.events.len() > capacity {
            recent.events.pop_front();
        }
    }

    /// The kept events with `seq` above `after`, oldest first, and whether they are complete
    /// (no event after `after` has already been dropped from the ring).
    pub fn since(&self, after: u64) -> (Vec<Arc<Event>>, bool) {
        let recent = self.sending.lock();
        self.replay_after(&recent, after)
    }

    fn replay_after(&self, recent: &Recent, after: u64) -> (Vec<Arc<Event>>, bool) {
        let last = self.last_seq();
        let complete = recent.events.front().is_none_or(|e| e.seq <= after + 1) || after >= last;
        (
            recent
                .events
                .iter()
                .filter(|e| e.seq > after)
                .cloned()
                .collect(),
            complete,
        )
    }

    /// A subscription plus the kept events after `after`, with nothing lost or repeated between
    /// them.
    pub fn subscribe_since(&self, after: u64) -> (Vec<Arc<Event>>, bool, Subscription) {
        // No event is sent between the snapshot and the subscription.
        let recent = self.sending.lock();
        let (replay, complete) = self.replay_after(&recent, after);
        (replay, complete, self.subscribe())
    }

    /// Whether anything would see an event now (a subscriber, a sink, the replay ring). Callers
    /// skip building costly events nobody would see; `seq` numbering stays dense regardless
    /// because [`EventBus::emit`] is what hands numbers out.
    pub fn is_observed(&self) -> bool {
        self.observers.load(Ordering::Acquire) > 0
            || self.keeping.load(Ordering::Acquire)
            || self.has_sinks.load(Ordering::Acquire)
    }

    /// Publishes the event `kind()` builds, building it only when something observes events;
    /// returns its `seq` either way.
    pub fn emit_with(&self, scope: &Arc<EventScope>, kind: impl FnOnce() -> EventKind) -> u64 {
        self.publish(scope, None, kind)
    }

    /// [`EventBus::emit_with`] for something that happened at `at` (an instant the caller read
    /// anyway: the event is stamped from it instead of reading the clock again).
    pub(crate) fn emit_with_at(
        &self,
        scope: &Arc<EventScope>,
        at: Instant,
        kind: impl FnOnce() -> EventKind,
    ) -> u64 {
        self.publish(scope, Some(at), kind)
    }

    /// Publishes an event about `scope` and returns its `seq`.
    pub fn emit(&self, scope: &Arc<EventScope>, kind: EventKind) -> u64 {
        self.publish(scope, None, || kind)
    }

    /// [`EventBus::emit`] for something that happened at `at`.
    pub(crate) fn emit_at(&self, scope: &Arc<EventScope>, at: Instant, kind: EventKind) -> u64 {
        self.publish(scope, Some(at), || kind)
    }

    /// The wall-clock time of `at` (see [`crate::clock`]).
    pub(crate) fn stamp(&self, at: Instant) -> Timestamp {
        self.clock.stamp(at)
    }

    /// Numbers the event and, when something observes events, builds it (stamped at `at`, or
    /// now) and hands it out.
    fn publish(
        &self,
        scope: &Arc<EventScope>,
        at: Option<Instant>,
        kind: impl FnOnce() -> EventKind,
    ) -> u64 {
        if !self.is_observed() {
            // Nobody would see it: a number, no event, no lock.
            return self.seq.fetch_add(1, Ordering::AcqRel) + 1;
        }
        let ts = match at {
            Some(at) => self.clock.stamp(at),
            None => self.clock.now(),
        };
        let kind = kind();
        let mut recent = self.sending.lock();
        let n = self.seq.fetch_add(1, Ordering::AcqRel) + 1;
        let event = Arc::new(Event {
            seq: n,
            ts,
            scope: scope.clone(),
            kind,
        });
        if self.has_sinks.load(Ordering::Acquire) {
            for sink in self.sinks.read().iter() {
                sink.record(&event);
            }
        }
        // The oldest kept events are freed in batches on the reaper thread: freeing them (and
        // what they were the last to hold) is not the emitting call's work.
        let mut batch = Vec::new();
        if self.keeping.load(Ordering::Acquire) && recent.capacity > 0 {
            if recent.events.len() >= recent.capacity
                && let Some(oldest) = recent.events.pop_front()
            {
                recent.evicted.push(oldest);
                batch = crate::reaper::full_batch(&mut recent.evicted);
            }
            recent.events.push_back(event.clone());
        }
        if self.observers.load(Ordering::Acquire) > 0 {
            let _ = self.tx.send(event);
        }
        drop(recent);
        crate::reaper::bury(batch);
        n
    }

    /// Makes `seq` continue after `seq` (the audit trail's last one, so that `seq` keeps
    /// increasing across restarts); never moves it back.
    pub fn continue_after(&self, seq: u64) {
        self.seq.fetch_max(seq, Ordering::AcqRel);
    }

    /// The last `seq` handed out.
    pub fn last_seq(&self) -> u64 {
        self.seq.load(Ordering::Acquire)
    }

    /// A new subscription, starting with the next event.
    pub fn subscribe(&self) -> Subscription {
        self.observers.fetch_add(1, Ordering::AcqRel);
        Subscription {
            rx: self.tx.subscribe(),
            _observer: Observer(self.observers.clone()),
        }
    }
}

/// Counts a live subscription; gone when the subscription is dropped.
#[derive(Debug)]
struct Observer(Arc<AtomicUsize>);

impl Drop for Observer {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What a subscription yields.
#[derive(Debug, Clone)]
pub enum Received {
    /// The next event.
    Event(Arc<Event>),
    /// This many events were lost because the subscriber fell behind.
    Lagged(u64),
}

/// A live view of the bus.
#[derive(Debug)]
pub struct Subscription {
    rx: broadcast::Receiver<Arc<Event>>,
    _observer: Observer,
}

impl Subscription {
    /// The next event or loss notice; `None` once the bus is gone.
    pub async fn recv(&mut self) -> Option<Received> {
        match self.rx.recv().await {
            Ok(e) => Some(Received::Event(e)),
            Err(broadcast::error::RecvError::Lagged(n)) => Some(Received::Lagged(n)),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }

    /// The next event if one is ready.
    pub fn try_recv(&mut self) -> Option<Received> {
        match self.rx.try_recv() {
            Ok(e) => Some(Received::Event(e)),
            Err(broadcast::error::TryRecvError::Lagged(n)) => Some(Received::Lagged(n)),
            Err(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolwarden_protocol::CancelReason;

    fn abort() -> EventKind {
        EventKind::TurnAbort {
            reason: CancelReason::User,
        }
    }

    #[tokio::test]
    async fn a_matching_subscription_gets_only_what_it_asked_for_in_order_and_ends_when_dropped() {
        let bus = EventBus::new(16);
        let mut aborts = bus.subscribe_matching(|e| matches!(e.kind, EventKind::TurnAbort { .. }));
        let other = || EventKind::ToolLateResult {
            is_error: false,
            after_ms: 1,
        };
        // Far more than the broadcast ring holds: a matching subscription never lags.
        for _ in 0..100 {
            bus.emit(&Arc::default(), other());
            bus.emit(&Arc::default(), abort());
        }
        let mut seqs = Vec::new();
        for _ in 0..100 {
            seqs.push(aborts.recv().await.map(|e| e.seq));
        }
        assert_eq!(seqs, (1..=100).map(|n| Some(2 * n)).collect::<Vec<_>>());
        drop(aborts);
        let _next = bus.subscribe_matching(|_| true);
        assert_eq!(bus.sinks.read().len(), 1, "the dropped one is gone");
    }

    #[tokio::test]
    async fn seq_increases_by_one_in_order() {
        let bus = EventBus::new(64);
        let mut sub = bus.subscribe();
        for _ in 0..5 {
            bus.emit(&Arc::default(), abort());
        }
        let mut seqs = Vec::new();
        for _ in 0..5 {
            match sub.recv().await {
                Some(Received::Event(e)) => seqs.push(e.seq),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(seqs, vec![1, 2, 3, 4, 5]);
    }

    #[tokio::test]
    async fn a_slow_subscriber_loses_events_and_is_told_the_engine_never_waits() {
        let bus = EventBus::new(16);
        let mut slow = bus.subscribe();
        for _ in 0..100 {
            bus.emit(&Arc::default(), abort());
        }
        match slow.recv().await {
            Some(Received::Lagged(n)) => assert_eq!(n, 84),
            other => panic!("expected a loss notice, got {other:?}"),
        }
        match slow.recv().await {
            Some(Received::Event(e)) => assert_eq!(e.seq, 85),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[tokio::test]
    async fn resuming_replays_kept_events_then_goes_live() {
        let bus = EventBus::new(64);
        bus.keep_recent(5);
        for _ in 0..8 {
            bus.emit(&Arc::default(), abort());
        }
        let (replay, complete, mut sub) = bus.subscribe_since(5);
        assert!(complete);
        assert_eq!(
            replay.iter().map(|e| e.seq).collect::<Vec<_>>(),
            vec![6, 7, 8]
        );
        let (_, complete, _) = bus.subscribe_since(1);
        assert!(!complete, "events 2 and 3 were dropped from the ring");
        bus.emit(&Arc::default(), abort());
        match sub.recv().await {
            Some(Received::Event(e)) => assert_eq!(e.seq, 9),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn sinks_see_every_event_even_without_subscribers() {
        struct Count(Mutex<Vec<u64>>);
        impl EventSink for Count {
            fn record(&self, event: &Arc<Event>) {
                self.0.lock().push(event.seq);
            }
        }
        let bus = EventBus::new(16);
        let sink = Arc::new(Count(Mutex::new(Vec::new())));
        bus.add_sink(sink.clone());
        for _ in 0..40 {
            bus.emit(&Arc::default(), abort());
        }
        assert_eq!(*sink.0.lock(), (1..=40).collect::<Vec<_>>());
    }
}
