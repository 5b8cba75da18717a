//! Liveness of the replicas sharing a PostgreSQL trail: each holds a lease, and when one lets it
//! run out, a survivor records what it left open.
//!
//! - **The lease** is a row of `toolwarden_replicas`, renewed every third of `store.lease` by a
//!   thread of its own on a connection of its own (so a busy writer never delays it), from the
//!   moment the replica registers. Times are the database's clock, so replicas on machines whose
//!   clocks differ still agree.
//! - **A dead replica** is one whose last renewal is older than its lease — and than a whole
//!   lease since the looking replica's own renewals resumed without a gap, so that when the
//!   database (or one replica's way to it) was away, every replica renews again before anyone is
//!   declared dead. Every replica looks for them as often as it renews; the first to take the
//!   trail's takeover lock (a transaction's advisory lock) and to move the dead replica's row to
//!   its next *generation* is its survivor. It ends the connection that holds the dead replica's
//!   lock — its writer's, if the database still has it (a paused process's) — and only then reads
//!   the turns and calls that replica left open, as a restart does (`recover.rs`); it hands the
//!   events that end them — `interrupted` outcomes whose detail names both replicas — to its own
//!   engine, which records them as its own events. Once they are committed, the row says so. A
//!   survivor that fails on the way tries again; one that dies leaves the row declared dead and
//!   not taken over, and the next survivor does it (reading again what is still open).
//! - **A replica declared dead that comes back** (it was paused, or lost the database for longer
//!   than its lease) finds its generation moved on: its renewal and its writer's reconnection
//!   both fail. It waits until its survivor has finished, rejoins under a new generation, has
//!   its engine stop the turns the survivor ended, and drops every event of theirs — the outcome
//!   is the survivor's, and a call never gets a second one. Its writer wrote nothing meanwhile:
//!   the survivor ended the writer's connection before reading, and a writer connects again only
//!   under the current generation.
//! - **The lease costs no call anything**: no statement on the call's path reads or writes the
//!   row; a batch written by a replica that is not fenced is written as before.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use postgres::{Client, GenericClient};
use toolwarden_protocol::{Event, EventKind, ReplicaRecord, Timestamp};

use super::connect::{Connector, describe};
use crate::recover::{Interruption, close_turns};
use crate::redact::RedactedEvent;
use crate::writer;

/// The database's clock, in epoch milliseconds.
const NOW_MS: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// How long a starting replica waits for a live survivor still recording what it left open, in
/// leases (at most [`TAKEOVER_WAIT_MAX`]), before it recovers its calls itself.
const TAKEOVER_WAIT_LEASES: u32 = 10;
const TAKEOVER_WAIT_MAX: Duration = Duration::from_secs(120);

/// What a survivor found: a dead replica and the events that end what it left open.
#[derive(Debug)]
pub struct Takeover {
    /// The dead replica's id in the trail.
    pub replica: String,
    /// Its name among replicas on Redis, if it had told it.
    pub name: Option<String>,
    /// The events to record, in order (`interrupted` results, then each turn's `turn_end`).
    /// Their `seq` is not this replica's: the engine records them as new events.
    pub events: Vec<Event>,
    /// How many calls they end as `interrupted`.
    pub interrupted: usize,
}

/// Stops this replica's turns that a survivor ended (named by id), should it come back after
/// being declared dead.
pub type OnRejoin = Box<dyn Fn(&[String]) + Send + Sync>;

/// Records a takeover's events through this replica's engine and releases what the dead replica
/// held elsewhere (Redis); answers the `seq` of the last event recorded (0 if none).
pub type Survivor = Box<dyn Fn(Takeover) -> u64 + Send + Sync>;

/// This replica's lease: its generation, and the turns a survivor ended for it.
pub(crate) struct Fence {
    replica: String,
    lease: Duration,
    state: Mutex<FenceState>,
    /// Serialises rejoining (the lease thread and the writer may both find they must), without
    /// holding `state` — which the writer reads for every batch — across round trips.
    rejoining: Mutex<()>,
    /// Told the turns a survivor ended when this replica rejoins: the engine stops them.
    on_rejoin: std::sync::OnceLock<OnRejoin>,
    stop: AtomicBool,
}

#[derive(Default)]
struct FenceState {
    generation: i64,
    /// Since when (the database's clock) this replica has renewed its lease every round, and its
    /// last renewal: it declares another dead only once that other has had a whole lease to
    /// renew meanwhile, so that after the database (or this replica's way to it, or this
    /// replica itself) was away, the replicas renew before anyone is declared dead.
    renewing_since: Option<i64>,
    last_renewal: Option<i64>,
    /// Turns of this replica a survivor ended while it was declared dead: their events are
    /// dropped (until the turn's own `turn_end`, the last of them, is dropped in a commit).
    ended_elsewhere: HashSet<String>,
}

fn lease_ms(lease: Duration) -> i64 {
    i64::try_from(lease.as_millis()).unwrap_or(i64::MAX)
}

/// Bounds a transaction that locks a replica's row: a process paused (or cut off) inside it
/// would otherwise hold the row until the server notices it is gone.
fn bounded(tx: &mut postgres::Transaction<'_>, lease: Duration) -> Result<(), postgres::Error> {
    tx.batch_execute(&format!(
        "SET LOCAL lock_timeout = {ms}; SET LOCAL idle_in_transaction_session_timeout = {ms}",
        ms = lease_ms(lease).max(1000)
    ))
}

/// Whether replica `who`'s row says it is alive (renewing, neither dead nor stopped).
const ALIVE: &str = "EXISTS (SELECT 1 FROM toolwarden_replicas s WHERE s.replica = {who} \
    AND s.dead_at IS NULL AND s.stopped_at IS NULL AND s.heartbeat_at >= {now} - s.lease_ms)";

fn alive(who: &str) -> String {
    ALIVE.replace("{who}", who).replace("{now}", NOW_MS)
}

impl Fence {
    /// Registers `replica` (whose lock `client` holds, as the writer's connection) under a new
    /// generation. A survivor still recording what an earlier process of this replica left open
    /// is waited for while it is alive (at most ten leases).
    pub(crate) fn register(
        client: &mut Client,
        replica: &str,
        lease: Duration,
    ) -> Result<Arc<Fence>, String> {
        let err = |e: postgres::Error| describe(&e);
        let mut waited = Duration::ZERO;
        let generation = loop {
            let mut tx = client.transaction().map_err(err)?;
            bounded(&mut tx, lease).map_err(err)?;
            let row = tx
                .query_opt(
                    &format!(
                        "SELECT r.dead_at IS NOT NULL AND r.taken_over_at IS NULL \
                         AND {} FROM toolwarden_replicas r WHERE r.replica = $1 FOR UPDATE",
                        alive("r.taken_over_by")
                    ),
                    &[&replica],
                )
                .map_err(err)?;
            let taking_over = row.is_some_and(|r| r.get::<_, bool>(0));
            if taking_over && waited < (lease * TAKEOVER_WAIT_LEASES).min(TAKEOVER_WAIT_MAX) {
                drop(tx);
                pause(Duration::from_millis(100));
                waited += Duration::from_millis(100);
                continue;
            }
            let row = tx
                .query_one(
                    &format!(
                        "INSERT INTO toolwarden_replicas AS r (replica, generation, started_at, \
                         heartbeat_at, lease_ms) VALUES ($1, 1, {NOW_MS}, {NOW_MS}, $2) \
                         ON CONFLICT (replica) DO UPDATE SET generation = r.generation + 1, \
                         name = NULL, started_at = excluded.started_at, \
                         heartbeat_at = excluded.heartbeat_at, lease_ms = excluded.lease_ms, \
                         dead_at = NULL, taken_over_by = NULL, taken_over_at = NULL, \
                         interrupted = NULL, stopped_at = NULL \
                         RETURNING generation"
                    ),
                    &[&replica, &lease_ms(lease)],
                )
                .map_err(err)?;
            tx.commit().map_err(err)?;
            break row.get::<_, i64>(0);
        };
        Ok(Arc::new(Fence {
            replica: replica.to_owned(),
            lease,
            state: Mutex::new(FenceState {
                generation,
                ..FenceState::default()
            }),
            rejoining: Mutex::new(()),
            on_rejoin: std::sync::OnceLock::new(),
            stop: AtomicBool::new(false),
        }))
    }

    /// Checks, on a new writer connection, that this replica still holds its lease; rejoins
    /// once it was declared dead and its survivor has finished; fails while that survivor
    /// works. (A survivor ends whichever connection holds this replica's lock — the writer's —
    /// before it reads what the replica left open, so a writer that is not fenced here writes
    /// nothing a survivor has read.)
    pub(crate) fn claim_writer(&self, client: &mut Client) -> Result<(), String> {
        let generation = self.state.lock().generation;
        let held = client
            .query_opt(
                "SELECT 1 FROM toolwarden_replicas \
                 WHERE replica = $1 AND generation = $2 AND dead_at IS NULL",
                &[&self.replica, &generation],
            )
            .map_err(|e| describe(&e))?;
        if held.is_none() {
            self.rejoin(client)?;
        }
        Ok(())
    }

    /// Renews the lease (and tells this replica's name once it has one); rejoins when it was
    /// declared dead meanwhile and its survivor has finished.
    fn renew(&self, client: &mut Client, name: Option<&str>) -> Result<(), String> {
        let generation = self.state.lock().generation;
        let renewed = client
            .query_opt(
                &format!(
                    "UPDATE toolwarden_replicas SET heartbeat_at = {NOW_MS}, \
                     name = coalesce($3, name) \
                     WHERE replica = $1 AND generation = $2 AND dead_at IS NULL \
                     RETURNING heartbeat_at"
                ),
                &[&self.replica, &generation, &name],
            )
            .map_err(|e| describe(&e))?;
        let Some(row) = renewed else {
            return self.rejoin(client);
        };
        let at: i64 = row.get(0);
        let mut state = self.state.lock();
        // A gap of more than half a lease since the last renewal (this process or the
        // database was frozen, a connection took long to make) starts the streak again.
        let gap = state.last_renewal.map_or(i64::MAX, |last| at - last);
        if gap > lease_ms(self.lease) / 2 {
            state.renewing_since = Some(at);
        }
        state.last_renewal = Some(at);
        Ok(())
    }

    /// A renewal failed: the streak of renewals starts again.
    fn missed(&self) {
        let mut state = self.state.lock();
        state.renewing_since = None;
        state.last_renewal = None;
    }

    /// Comes back after being declared dead: once the survivor has recorded what this replica
    /// left open, takes a new generation, notes the turns the survivor ended (their events are
    /// dropped from then on) and has the engine stop them.
    fn rejoin(&self, client: &mut Client) -> Result<(), String> {
        let err = |e: postgres::Error| describe(&e);
        let _one = self.rejoining.lock();
        let known = self.state.lock().generation;
        let mut tx = client.transaction().map_err(err)?;
        bounded(&mut tx, self.lease).map_err(err)?;
        let row = tx
            .query_opt(
                "SELECT generation, dead_at, taken_over_at, taken_over_by \
                 FROM toolwarden_replicas WHERE replica = $1 FOR UPDATE",
                &[&self.replica],
            )
            .map_err(err)?
            .ok_or_else(|| format!("replica {:?} is no longer registered", self.replica))?;
        let (generation, dead_at, taken_over_at, by): (
            i64,
            Option<i64>,
            Option<i64>,
            Option<String>,
        ) = (row.get(0), row.get(1), row.get(2), row.get(3));
        if dead_at.is_none() {
            if generation == known {
                return Ok(());
            }
            return Err(format!(
                "replica id {:?} was registered again by another toolwarden process",
                self.replica
            ));
        }
        if taken_over_at.is_none() {
            return Err(format!(
                "this replica ({:?}) was declared dead when its lease ran out; waiting for replica {} to finish recording the calls it left open",
                self.replica,
                by.as_deref().unwrap_or("?")
            ));
        }
        // Its turns that another replica ended as `interrupted`.
        let ended: Vec<String> = tx
            .query(
                "SELECT turn_id FROM toolwarden_turns WHERE replica = $1 \
                 AND outcome = 'interrupted' AND end_replica IS DISTINCT FROM $1",
                &[&self.replica],
            )
            .map_err(err)?
            .into_iter()
            .map(|r| r.get(0))
            .collect();
        let row = tx
            .query_one(
                &format!(
                    "UPDATE toolwarden_replicas SET generation = generation + 1, dead_at = NULL, \
                     taken_over_by = NULL, taken_over_at = NULL, interrupted = NULL, \
                     started_at = {NOW_MS}, heartbeat_at = {NOW_MS} \
                     WHERE replica = $1 RETURNING generation"
                ),
                &[&self.replica],
            )
            .map_err(err)?;
        tx.commit().map_err(err)?;
        {
            let mut state = self.state.lock();
            state.generation = row.get(0);
            state.renewing_since = None;
            state.last_renewal = None;
            state.ended_elsewhere.extend(ended.iter().cloned());
        }
        tracing::warn!(
            replica = %self.replica,
            survivor = by.as_deref().unwrap_or("?"),
            turns = ended.len(),
            "this replica was declared dead while it could not renew its lease (paused, or cut off from the database); it rejoins, stops the turns its survivor ended and drops their events: their outcome is `interrupted`"
        );
        if let Some(stop) = self.on_rejoin.get() {
            stop(&ended);
        }
        Ok(())
    }

    /// The items of a batch to write: all of them, unless a survivor ended some of their turns.
    /// Changes nothing: a batch that fails is tried again, filtered the same way.
    pub(crate) fn keep<'b, 'a>(
        &self,
        items: &'b [RedactedEvent<'a>],
    ) -> Vec<&'b RedactedEvent<'a>> {
        let state = self.state.lock();
        if state.ended_elsewhere.is_empty() {
            return items.iter().collect();
        }
        items
            .iter()
            .filter(|item| {
                item.event
                    .scope
                    .turn_id
                    .as_ref()
                    .is_none_or(|t| !state.ended_elsewhere.contains(t.as_str()))
            })
            .collect()
    }

    /// A batch was committed: the turns a survivor ended whose own `turn_end` it dropped are
    /// done with.
    pub(crate) fn committed(&self, items: &[RedactedEvent<'_>]) {
        let mut state = self.state.lock();
        if state.ended_elsewhere.is_empty() {
            return;
        }
        for item in items {
            if let (Some(turn), EventKind::TurnEnd { .. }) =
                (&item.event.scope.turn_id, &item.event.kind)
            {
                state.ended_elsewhere.remove(turn.as_str());
            }
        }
    }

    /// Says this replica stopped cleanly (after its last commit): nobody takes it over.
    pub(crate) fn stopped(&self, client: &mut Client) {
        self.stop.store(true, Ordering::Release);
        let generation = self.state.lock().generation;
        if let Err(e) = client.execute(
            &format!(
                "UPDATE toolwarden_replicas SET stopped_at = {NOW_MS} \
                 WHERE replica = $1 AND generation = $2"
            ),
            &[&self.replica, &generation],
        ) {
            tracing::warn!(error = %describe(&e), "could not record in the trail that this replica stopped; the others will declare it dead when its lease runs out");
        }
    }
}

/// Sleeps on a thread of the store's own (never a runtime's).
fn pause(d: Duration) {
    #[allow(
        clippy::disallowed_methods,
        reason = "runs on the store's own threads (the lease's, or opening's off_runtime): no runtime worker waits"
    )]
    std::thread::sleep(d);
}

/// The lease's threads: one renews it (from the moment the replica registers), one looks for
/// dead replicas and takes them over (once the writer runs).
pub struct Liveness {
    connector: Connector,
    fence: Arc<Fence>,
    name: Arc<Mutex<Option<String>>>,
    survivor: Arc<std::sync::OnceLock<Survivor>>,
}

impl std::fmt::Debug for Liveness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Liveness")
            .field("replica", &self.fence.replica)
            .finish_non_exhaustive()
    }
}

impl Liveness {
    /// Starts renewing `fence`'s lease: right after registering, so that a replica whose start
    /// takes long (recovery, pruning) is not declared dead meanwhile.
    pub(crate) fn renewing(connector: Connector, fence: Arc<Fence>) -> std::io::Result<Liveness> {
        let liveness = Liveness {
            connector,
            fence,
            name: Arc::default(),
            survivor: Arc::default(),
        };
        let (fence, name, c) = (
            liveness.fence.clone(),
            liveness.name.clone(),
            liveness.connector.clone(),
        );
        std::thread::Builder::new()
            .name("toolwarden-lease".into())
            .spawn(move || renew_loop(&c, &fence, &name))?;
        Ok(liveness)
    }

    /// Starts looking for dead replicas (taken over once a [`Survivor`] is given).
    pub(crate) fn start_takeovers(&self, shared: Arc<writer::Shared>) -> std::io::Result<()> {
        let (fence, survivor, connector) = (
            self.fence.clone(),
            self.survivor.clone(),
            self.connector.clone(),
        );
        std::thread::Builder::new()
            .name("toolwarden-takeover".into())
            .spawn(move || takeover_loop(&connector, &fence, &survivor, &shared))?;
        Ok(())
    }

    /// This replica's name among replicas (Redis), written with its next renewal: a survivor
    /// releases what that name holds.
    pub fn set_name(&self, name: &str) {
        *self.name.lock() = Some(name.to_owned());
    }

    /// Who records a dead replica's open calls here; until it is given, this replica takes no
    /// replica over (the others do).
    pub fn survive_with(&self, survivor: Survivor) {
        let _ = self.survivor.set(survivor);
    }

    /// Who stops this replica's turns that a survivor ended, should this replica come back
    /// after being declared dead (their calls' outcomes are the survivor's `interrupted`).
    pub fn on_rejoin(&self, stop: OnRejoin) {
        let _ = self.fence.on_rejoin.set(stop);
    }

    /// The lease.
    pub fn lease(&self) -> Duration {
        self.fence.lease
    }
}

impl Drop for Liveness {
    fn drop(&mut self) {
        self.fence.stop.store(true, Ordering::Release);
    }
}

/// A connection kept between rounds, made again when lost.
struct KeptConn<'a> {
    connector: &'a Connector,
    client: Option<Client>,
}

impl KeptConn<'_> {
    fn run<T>(&mut self, f: impl FnOnce(&mut Client) -> Result<T, String>) -> Result<T, String> {
        let client = match self.client.take() {
            Some(c) if !c.is_closed() => c,
            _ => self.connector.connect().map_err(|e| describe(&e))?,
        };
        let client = self.client.insert(client);
        f(client)
    }
}

fn renew_loop(connector: &Connector, fence: &Fence, name: &Mutex<Option<String>>) {
    let mut conn = KeptConn {
        connector,
        client: None,
    };
    let mut failing = false;
    while !fence.stop.load(Ordering::Acquire) {
        let name = name.lock().clone();
        match conn.run(|c| fence.renew(c, name.as_deref())) {
            Ok(()) if failing => {
                failing = false;
                tracing::info!("this replica renews its lease again");
            }
            Ok(()) => {}
            Err(e) => {
                fence.missed();
                if !failing {
                    failing = true;
                    tracing::warn!(error = %e, "this replica cannot renew its lease in the trail");
                }
            }
        }
        pause(fence.lease / 3);
    }
}

fn takeover_loop(
    connector: &Connector,
    fence: &Fence,
    survivor: &std::sync::OnceLock<Survivor>,
    shared: &writer::Shared,
) {
    let mut conn = KeptConn {
        connector,
        client: None,
    };
    // The last event handed to the engine by a takeover: none is begun (or begun again) before
    // it is committed, so that what is read as still open never counts events on their way.
    let mut handed = 0;
    while !fence.stop.load(Ordering::Acquire) {
        pause(fence.lease / 3);
        let Some(survivor) = survivor.get() else {
            continue;
        };
        if !shared.is_durable(handed) {
            continue;
        }
        if let Err(e) = conn.run(|c| take_over_dead(c, fence, survivor, shared, &mut handed)) {
            tracing::warn!(error = %e, "looking for replicas whose lease ran out failed");
        }
    }
}

/// A dead replica, as a survivor finds it.
struct Dead {
    replica: String,
    name: Option<String>,
    generation: i64,
}

/// Takes over every replica whose lease ran out (or whose survivor died on the way, or whose
/// takeover this replica began and did not finish), one at a time, while this one is alive and
/// no other survivor is at it.
fn take_over_dead(
    client: &mut Client,
    fence: &Fence,
    survivor: &Survivor,
    shared: &writer::Shared,
    handed: &mut u64,
) -> Result<(), String> {
    let err = |e: postgres::Error| describe(&e);
    let (generation, since) = {
        let state = fence.state.lock();
        (state.generation, state.renewing_since)
    };
    let Some(since) = since else {
        return Ok(());
    };
    let found: Vec<Dead> = client
        .query(
            &format!(
                "SELECT r.replica, r.name, r.generation FROM toolwarden_replicas r \
                 WHERE r.replica <> $1 AND r.stopped_at IS NULL AND r.taken_over_at IS NULL \
                 AND EXISTS (SELECT 1 FROM toolwarden_replicas m WHERE m.replica = $1 \
                   AND m.generation = $2 AND m.dead_at IS NULL \
                   AND m.heartbeat_at >= {NOW_MS} - m.lease_ms) \
                 AND ((r.dead_at IS NULL AND r.heartbeat_at < {NOW_MS} - r.lease_ms \
                   AND $3 <= {NOW_MS} - r.lease_ms) \
                   OR (r.dead_at IS NOT NULL AND (r.taken_over_by = $1 OR NOT {}))) \
                 ORDER BY r.replica",
                alive("r.taken_over_by")
            ),
            &[&fence.replica, &generation, &since],
        )
        .map_err(err)?
        .into_iter()
        .map(|r| Dead {
            replica: r.get(0),
            name: r.get(1),
            generation: r.get(2),
        })
        .collect();
    for dead in found {
        if fence.stop.load(Ordering::Acquire) {
            break;
        }
        take_over(client, fence, survivor, shared, dead, handed)?;
    }
    Ok(())
}

fn take_over(
    client: &mut Client,
    fence: &Fence,
    survivor: &Survivor,
    shared: &writer::Shared,
    dead: Dead,
    handed: &mut u64,
) -> Result<(), String> {
    let err = |e: postgres::Error| describe(&e);
    let mut tx = client.transaction().map_err(err)?;
    bounded(&mut tx, fence.lease).map_err(err)?;
    let locked: bool = tx
        .query_one(
            "SELECT pg_try_advisory_xact_lock(hashtext('toolwarden.takeover:' || current_schema()))",
            &[],
        )
        .map_err(err)?
        .get(0);
    if !locked {
        return Ok(());
    }
    // Still as found (not renewed, not taken by another survivor meanwhile): this one is its
    // survivor.
    let claimed = tx
        .execute(
            &format!(
                "UPDATE toolwarden_replicas SET dead_at = coalesce(dead_at, {NOW_MS}), \
                 generation = generation + 1, taken_over_by = $3 \
                 WHERE replica = $1 AND generation = $2"
            ),
            &[&dead.replica, &dead.generation, &fence.replica],
        )
        .map_err(err)?;
    if claimed == 0 {
        return Ok(());
    }
    tx.commit().map_err(err)?;
    tracing::warn!(replica = %dead.replica, "a replica's lease ran out: it is declared dead, and this replica records the calls it left open");
    // A paused process's writer could still commit: the connection holding its lock ends here,
    // before the open calls are read (its rows are then either committed or gone). Should it
    // not end, the takeover is tried again later (it is this replica's, unfinished).
    end_writer(client, &dead.replica)?;
    let open = super::read::open_turns(client, &dead.replica)?;
    let mut seq = 0;
    let why = Interruption::Dead {
        replica: &dead.replica,
        by: &fence.replica,
    };
    let (events, interrupted) = close_turns(&mut seq, Timestamp::now(), open, &why);
    let last = survivor(Takeover {
        replica: dead.replica.clone(),
        name: dead.name,
        events,
        interrupted,
    });
    *handed = (*handed).max(last);
    // Marked taken over only once its events are committed: a survivor that dies before leaves
    // it to the next, which reads again what is still open.
    while !shared.is_durable(last) {
        if fence.stop.load(Ordering::Acquire) {
            return Ok(());
        }
        pause(Duration::from_millis(20));
    }
    client
        .execute(
            &format!(
                "UPDATE toolwarden_replicas SET taken_over_at = {NOW_MS}, interrupted = $3 \
                 WHERE replica = $1 AND taken_over_by = $2 AND dead_at IS NOT NULL"
            ),
            &[
                &dead.replica,
                &fence.replica,
                &i64::try_from(interrupted).unwrap_or(i64::MAX),
            ],
        )
        .map_err(err)?;
    tracing::warn!(replica = %dead.replica, interrupted, "recorded the calls a dead replica left open as interrupted");
    Ok(())
}

/// The connections holding `replica`'s lock (its writer's), as `pg_locks` shows them.
const LOCK_HOLDERS: &str = "SELECT l.pid FROM pg_locks l WHERE l.locktype = 'advisory' \
    AND l.granted AND l.objsubid = 1 AND ((l.classid::bigint << 32) | l.objid::bigint) = \
    hashtext('toolwarden.replica:' || current_schema() || ':' || $1)::bigint";

/// Ends the connection that holds `replica`'s lock — its writer's — and waits until it has
/// gone; an error while one still holds it.
fn end_writer(client: &mut impl GenericClient, replica: &str) -> Result<(), String> {
    let err = |e: postgres::Error| describe(&e);
    client
        .query(
            &format!("SELECT pg_terminate_backend(pid, 5000) FROM ({LOCK_HOLDERS}) h"),
            &[&replica],
        )
        .map_err(err)?;
    let left = client.query(LOCK_HOLDERS, &[&replica]).map_err(err)?;
    if left.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the connection of replica {replica:?}'s writer could not be ended (the database user needs the right to end its own role's connections): its calls are recorded later"
        ))
    }
}

/// Every replica of the trail, as `GET /v1/replicas` lists them.
pub(crate) fn list(client: &mut Client, this: &str) -> Result<Vec<ReplicaRecord>, String> {
    let rows = client
        .query(
            &format!(
                "SELECT replica, name, generation, started_at, heartbeat_at, lease_ms, dead_at, \
                 taken_over_by, interrupted, stopped_at, {NOW_MS} \
                 FROM toolwarden_replicas ORDER BY replica"
            ),
            &[],
        )
        .map_err(|e| describe(&e))?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let replica: String = r.get(0);
            let heartbeat: i64 = r.get(4);
            let lease: i64 = r.get(5);
            let dead_at: Option<i64> = r.get(6);
            let stopped_at: Option<i64> = r.get(9);
            let now: i64 = r.get(10);
            let state = if stopped_at.is_some() {
                "stopped"
            } else if dead_at.is_some() {
                "dead"
            } else if heartbeat < now - lease {
                "late"
            } else {
                "live"
            };
            ReplicaRecord {
                this: replica == this,
                replica,
                name: r.get(1),
                state: state.to_owned(),
                generation: r.get::<_, i64>(2).max(0) as u64,
                started_at: Timestamp::from_unix_millis(r.get(3)),
                heartbeat_at: Timestamp::from_unix_millis(heartbeat),
                lease_ms: lease.max(0) as u64,
                dead_at: dead_at.map(Timestamp::from_unix_millis),
                taken_over_by: r.get(7),
                interrupted: r.get::<_, Option<i64>>(8).map(|n| n.max(0) as u64),
                stopped_at: stopped_at.map(Timestamp::from_unix_millis),
            }
        })
        .collect())
}
