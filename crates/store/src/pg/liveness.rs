//! Liveness of the replicas sharing a PostgreSQL trail: each holds a lease, and when one lets it
//! run out, a survivor records what it left open.
//!
//! - **The lease** is a row of `toolwarden_replicas`, renewed every third of `store.lease` by a
//!   thread of its own on a connection of its own (so a busy writer never delays it). Times are
//!   the database's clock, so replicas on machines whose clocks differ still agree.
//! - **A dead replica** is one whose last renewal is older than its lease — and than a whole
//!   lease since the looking replica's own renewals resumed, so that when the database (or one
//!   replica's way to it) was away, every replica renews again before anyone is declared dead.
//!   Every replica looks for them as often as it renews; the first to take the trail's takeover lock (a transaction's
//!   advisory lock) and to move the dead replica's row to its next *generation* is its survivor.
//!   It ends the dead replica's writer connection, if the database still has it (a paused
//!   process's), reads the turns and calls that replica left open as a restart does
//!   (`recover.rs`), and hands the events that end them — `interrupted` outcomes whose detail
//!   names both replicas — to its own engine, which records them as its own events. Once they are
//!   committed, the row says so. A survivor that dies on the way leaves the row declared dead and
//!   not taken over, and the next survivor does it (reading again what is still open).
//! - **A replica declared dead that comes back** (it was paused, or lost the database for longer
//!   than its lease) finds its generation moved on: its renewal and its writer's reconnection
//!   both fail. It waits until its survivor has finished, rejoins under a new generation, and
//!   drops every event of the turns the survivor ended — the outcome is the survivor's, and a
//!   call never gets a second one. Its writer wrote nothing meanwhile: the survivor ended the
//!   writer's connection before reading, and a writer connects again only under the current
//!   generation.
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
use crate::redact::Prepared;
use crate::writer;

/// The database's clock, in epoch milliseconds.
const NOW_MS: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// How long a starting replica waits for a survivor still recording what it left open, in
/// leases, before it recovers its calls itself.
const TAKEOVER_WAIT_LEASES: u32 = 3;

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

/// Records a takeover's events through this replica's engine and releases what the dead replica
/// held elsewhere (Redis); answers the `seq` of the last event recorded (0 if none).
pub type Survivor = Box<dyn Fn(Takeover) -> u64 + Send + Sync>;

/// This replica's lease: its generation, and the turns a survivor ended for it.
pub(crate) struct Fence {
    replica: String,
    lease: Duration,
    state: Mutex<FenceState>,
    stop: AtomicBool,
}

#[derive(Default)]
struct FenceState {
    generation: i64,
    /// Since when (the database's clock) this replica has renewed its lease without a failure:
    /// it declares another dead only once that other has had a whole lease to renew meanwhile,
    /// so that after the database (or this replica's way to it) was away, the replicas renew
    /// before anyone is declared dead.
    renewing_since: Option<i64>,
    /// Turns of this replica a survivor ended while it was declared dead: their events are
    /// dropped (until the turn's own `turn_end`, the last of them).
    ended_elsewhere: HashSet<String>,
}

fn lease_ms(lease: Duration) -> i64 {
    i64::try_from(lease.as_millis()).unwrap_or(i64::MAX)
}

impl Fence {
    /// Registers `replica` (whose lock `client` holds, as the writer's connection) under a new
    /// generation. A survivor still recording what an earlier process of this replica left open
    /// is waited for (at most a few leases).
    pub(crate) fn register(
        client: &mut Client,
        replica: &str,
        lease: Duration,
    ) -> Result<Arc<Fence>, String> {
        let err = |e: postgres::Error| describe(&e);
        let mut waited = Duration::ZERO;
        let generation = loop {
            let mut tx = client.transaction().map_err(err)?;
            let row = tx
                .query_opt(
                    "SELECT dead_at IS NOT NULL AND taken_over_at IS NULL \
                     FROM toolwarden_replicas WHERE replica = $1 FOR UPDATE",
                    &[&replica],
                )
                .map_err(err)?;
            let taking_over = row.is_some_and(|r| r.get::<_, bool>(0));
            if taking_over && waited < lease * TAKEOVER_WAIT_LEASES {
                drop(tx);
                pause(Duration::from_millis(100));
                waited += Duration::from_millis(100);
                continue;
            }
            let row = tx
                .query_one(
                    &format!(
                        "INSERT INTO toolwarden_replicas AS r (replica, generation, started_at, \
                         heartbeat_at, lease_ms, writer_pid, writer_since) \
                         VALUES ($1, 1, {NOW_MS}, {NOW_MS}, $2, pg_backend_pid(), \
                          (SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid())) \
                         ON CONFLICT (replica) DO UPDATE SET generation = r.generation + 1, \
                         name = NULL, started_at = excluded.started_at, \
                         heartbeat_at = excluded.heartbeat_at, lease_ms = excluded.lease_ms, \
                         writer_pid = excluded.writer_pid, writer_since = excluded.writer_since, \
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
                renewing_since: None,
                ended_elsewhere: HashSet::new(),
            }),
            stop: AtomicBool::new(false),
        }))
    }

    /// Makes `client` (a new writer connection) this replica's writer: recorded, so that a
    /// survivor can end it. Fails while the replica is declared dead and its survivor has not
    /// finished; rejoins once it has.
    pub(crate) fn claim_writer(&self, client: &mut Client) -> Result<(), String> {
        let generation = self.state.lock().generation;
        let n = client
            .execute(
                "UPDATE toolwarden_replicas SET writer_pid = pg_backend_pid(), writer_since = \
                 (SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()) \
                 WHERE replica = $1 AND generation = $2 AND dead_at IS NULL",
                &[&self.replica, &generation],
            )
            .map_err(|e| describe(&e))?;
        if n == 0 {
            self.rejoin(client, true)?;
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
        match renewed {
            Some(row) => {
                let mut state = self.state.lock();
                state.renewing_since.get_or_insert(row.get(0));
            }
            None => self.rejoin(client, false)?,
        }
        Ok(())
    }

    /// A renewal failed: the streak of renewals starts again.
    fn missed(&self) {
        self.state.lock().renewing_since = None;
    }

    /// Comes back after being declared dead: once the survivor has recorded what this replica
    /// left open, takes a new generation and notes the turns it ended (their events are
    /// dropped from then on).
    fn rejoin(&self, client: &mut Client, writer: bool) -> Result<(), String> {
        let err = |e: postgres::Error| describe(&e);
        let mut state = self.state.lock();
        let mut tx = client.transaction().map_err(err)?;
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
        let Some(dead_at) = dead_at else {
            if generation == state.generation {
                return Ok(());
            }
            return Err(format!(
                "replica id {:?} was registered again by another toolwarden process",
                self.replica
            ));
        };
        if taken_over_at.is_none() {
            return Err(format!(
                "this replica ({:?}) was declared dead when its lease ran out; waiting for replica {} to finish recording the calls it left open",
                self.replica,
                by.as_deref().unwrap_or("?")
            ));
        }
        let ended: Vec<String> = tx
            .query(
                "SELECT turn_id FROM toolwarden_turns WHERE outcome = 'interrupted' \
                 AND end_replica IS DISTINCT FROM $1 AND ended_at >= $2",
                &[&self.replica, &(dead_at - 60_000)],
            )
            .map_err(err)?
            .into_iter()
            .map(|r| r.get(0))
            .collect();
        let row = tx
            .query_one(
                &format!(
                    "UPDATE toolwarden_replicas SET generation = generation + 1, dead_at = NULL, \
                     heartbeat_at = {NOW_MS}, writer_pid = CASE WHEN $2 THEN pg_backend_pid() END, \
                     writer_since = CASE WHEN $2 THEN (SELECT backend_start FROM pg_stat_activity \
                      WHERE pid = pg_backend_pid()) END \
                     WHERE replica = $1 RETURNING generation"
                ),
                &[&self.replica, &writer],
            )
            .map_err(err)?;
        tx.commit().map_err(err)?;
        state.generation = row.get(0);
        tracing::warn!(
            replica = %self.replica,
            survivor = by.as_deref().unwrap_or("?"),
            turns = ended.len(),
            "this replica was declared dead while it could not renew its lease (paused, or cut off from the database); it rejoins, and the events of the turns its survivor ended are dropped: their outcome is `interrupted`"
        );
        state.ended_elsewhere.extend(ended);
        Ok(())
    }

    /// The items of a batch to write: all of them, unless a survivor ended some of their turns.
    pub(crate) fn keep<'b, 'a>(&self, items: &'b [Prepared<'a>]) -> Vec<&'b Prepared<'a>> {
        let mut state = self.state.lock();
        if state.ended_elsewhere.is_empty() {
            return items.iter().collect();
        }
        let mut kept = Vec::with_capacity(items.len());
        for item in items {
            let turn = item.event.scope.turn_id.as_ref().map(|t| t.as_str());
            match turn {
                Some(turn) if state.ended_elsewhere.contains(turn) => {
                    if matches!(item.event.kind, EventKind::TurnEnd { .. }) {
                        state.ended_elsewhere.remove(turn);
                    }
                }
                _ => kept.push(item),
            }
        }
        kept
    }

    /// Says this replica stopped cleanly (after its last commit): nobody takes it over.
    pub(crate) fn stopped(&self, client: &mut Client) {
        self.stop.store(true, Ordering::Release);
        let generation = self.state.lock().generation;
        if let Err(e) = client.execute(
            &format!(
                "UPDATE toolwarden_replicas SET stopped_at = {NOW_MS}, writer_pid = NULL \
                 WHERE replica = $1 AND generation = $2"
            ),
            &[&self.replica, &generation],
        ) {
            tracing::warn!(error = %e, "could not record in the trail that this replica stopped; the others will declare it dead when its lease runs out");
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

/// The lease's threads: one renews it, one looks for dead replicas and takes them over.
pub struct Liveness {
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
    /// Starts renewing `fence`'s lease, and looking for dead replicas (taken over once a
    /// [`Survivor`] is given).
    pub(crate) fn start(
        connector: Connector,
        fence: Arc<Fence>,
        shared: Arc<writer::Shared>,
    ) -> std::io::Result<Liveness> {
        let liveness = Liveness {
            fence,
            name: Arc::default(),
            survivor: Arc::default(),
        };
        let (fence, name, c) = (
            liveness.fence.clone(),
            liveness.name.clone(),
            connector.clone(),
        );
        std::thread::Builder::new()
            .name("toolwarden-lease".into())
            .spawn(move || renew_loop(&c, &fence, &name))?;
        let (fence, survivor) = (liveness.fence.clone(), liveness.survivor.clone());
        std::thread::Builder::new()
            .name("toolwarden-takeover".into())
            .spawn(move || takeover_loop(&connector, &fence, &survivor, &shared))?;
        Ok(liveness)
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
struct Conn<'a> {
    connector: &'a Connector,
    client: Option<Client>,
}

impl Conn<'_> {
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
    let mut conn = Conn {
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
            Err(e) if !failing => {
                fence.missed();
                failing = true;
                tracing::warn!(error = %e, "this replica cannot renew its lease in the trail");
            }
            Err(_) => fence.missed(),
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
    let mut conn = Conn {
        connector,
        client: None,
    };
    while !fence.stop.load(Ordering::Acquire) {
        pause(fence.lease / 3);
        let Some(survivor) = survivor.get() else {
            continue;
        };
        if let Err(e) = conn.run(|c| take_over_dead(c, fence, survivor, shared)) {
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

/// Takes over every replica whose lease ran out (or whose survivor died on the way), one at a
/// time, while this one is alive and no other survivor is at it.
fn take_over_dead(
    client: &mut Client,
    fence: &Fence,
    survivor: &Survivor,
    shared: &writer::Shared,
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
                   OR (r.dead_at IS NOT NULL AND NOT EXISTS (SELECT 1 FROM toolwarden_replicas s \
                     WHERE s.replica = r.taken_over_by AND s.dead_at IS NULL \
                     AND s.stopped_at IS NULL AND s.heartbeat_at >= {NOW_MS} - s.lease_ms))) \
                 ORDER BY r.replica"
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
        take_over(client, fence, survivor, shared, dead)?;
    }
    Ok(())
}

fn take_over(
    client: &mut Client,
    fence: &Fence,
    survivor: &Survivor,
    shared: &writer::Shared,
    dead: Dead,
) -> Result<(), String> {
    let err = |e: postgres::Error| describe(&e);
    let mut tx = client.transaction().map_err(err)?;
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
    let Some(row) = tx
        .query_opt(
            "SELECT writer_pid, writer_since FROM toolwarden_replicas \
             WHERE replica = $1 AND generation = $2 FOR UPDATE",
            &[&dead.replica, &dead.generation],
        )
        .map_err(err)?
    else {
        return Ok(());
    };
    let (pid, since): (Option<i32>, Option<std::time::SystemTime>) = (row.get(0), row.get(1));
    tx.execute(
        &format!(
            "UPDATE toolwarden_replicas SET dead_at = coalesce(dead_at, {NOW_MS}), \
             generation = generation + 1, taken_over_by = $2, writer_pid = NULL, \
             writer_since = NULL WHERE replica = $1"
        ),
        &[&dead.replica, &fence.replica],
    )
    .map_err(err)?;
    tx.commit().map_err(err)?;
    tracing::warn!(replica = %dead.replica, "a replica's lease ran out: it is declared dead, and this replica records the calls it left open");
    // A paused process's writer could still commit: its connection ends here, before the
    // open calls are read (its rows are then either committed or gone).
    if let (Some(pid), Some(since)) = (pid, since) {
        end_backend(client, pid, since)?;
    }
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
    // Marked taken over only once its events are committed: a survivor that dies before leaves
    // it to the next, which reads again what is still open.
    while last > 0 && !shared.is_durable(last) {
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

/// Ends the backend `pid` if it is still the connection that started at `since` (a pid can be
/// reused), waiting until it has gone.
fn end_backend(
    client: &mut impl GenericClient,
    pid: i32,
    since: std::time::SystemTime,
) -> Result<(), String> {
    client
        .query(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity \
             WHERE pid = $1 AND backend_start = $2",
            &[&pid, &since],
        )
        .map_err(|e| describe(&e))?;
    Ok(())
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
