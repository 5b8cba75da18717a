//! Writing to PostgreSQL: one transaction per batch, and a handful of statements per transaction
//! whatever the batch's size — every event of the batch goes in with one `INSERT … SELECT FROM
//! unnest(…)`, and so do the turns and calls they start and end — so a commit costs about the
//! same few round trips for one call or for hundreds.
//!
//! Writers of several replicas take turns to commit (a transaction-scoped advisory lock), so that
//! `pos`, the trail's order over every replica, is also the order in which events became
//! visible: a reader paging by `pos` never misses an event committed later with a smaller one.

use std::collections::HashMap;
use std::time::Duration;

use postgres::{Client, Statement};
use toolwarden_protocol::{EventKind, TaskRecord, Timestamp};

use super::connect::Connector;
use crate::apply::Prepared;
use crate::writer::Backend;

/// Rows deleted per statement when pruning.
const PRUNE_CHUNK: i64 = 5000;

const LOCK: &str =
    "SELECT pg_advisory_xact_lock(hashtext('toolwarden.commit:' || current_schema()))";

const TURNS_STARTED: &str = "
    INSERT INTO toolwarden_turns (replica, turn_id, session_id, parent_turn_id, started_at, start_seq)
    SELECT $1, u.tid, u.sid, u.parent, u.ts, u.seq
    FROM unnest($2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[])
        WITH ORDINALITY AS u(tid, sid, parent, ts, seq, n)
    ORDER BY u.n
    ON CONFLICT (turn_id) DO UPDATE SET replica = excluded.replica, ended_at = NULL,
        outcome = NULL, end_seq = NULL, end_replica = NULL, start_seq = excluded.start_seq";

const CALLS: &str = "
    INSERT INTO toolwarden_calls (replica, turn_id, call_id, session_id, tool, started_at, ran)
    SELECT $1, u.tid, u.cid, u.sid, u.tool, u.ts, u.ran
    FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::bigint[], $7::bool[])
        WITH ORDINALITY AS u(tid, cid, sid, tool, ts, ran, n)
    ORDER BY u.n
    ON CONFLICT (turn_id, call_id) DO UPDATE SET ran = true
        WHERE excluded.ran AND NOT toolwarden_calls.ran";

const CALLS_ENDED: &str = "
    UPDATE toolwarden_calls c SET status = u.status, ended_at = u.ts, duration_ms = u.dur,
        attempts = u.attempts
    FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[])
        AS u(tid, cid, status, ts, dur, attempts)
    WHERE c.turn_id = u.tid AND c.call_id = u.cid";

const TURNS_ENDED: &str = "
    UPDATE toolwarden_turns t SET ended_at = u.ts, outcome = u.outcome, end_seq = u.seq,
        end_replica = $1
    FROM unnest($2::text[], $3::text[], $4::bigint[], $5::bigint[]) AS u(tid, outcome, ts, seq)
    WHERE t.turn_id = u.tid AND (t.replica <> $1 OR t.start_seq IS NULL OR t.start_seq < u.seq)";

const EVENTS: &str = "
    INSERT INTO toolwarden_events (replica, seq, ts, type, session_id, turn_id, call_id, body)
    SELECT $1, u.seq, u.ts, u.type, u.sid, u.tid, u.cid, u.body
    FROM unnest($2::bigint[], $3::bigint[], $4::text[], $5::text[], $6::text[], $7::text[],
        $8::text[]) WITH ORDINALITY AS u(seq, ts, type, sid, tid, cid, body, n)
    ORDER BY u.n
    ON CONFLICT (replica, seq) DO NOTHING";

/// The statements of a batch, prepared once per connection.
struct Statements {
    lock: Statement,
    turns_started: Statement,
    calls: Statement,
    calls_ended: Statement,
    turns_ended: Statement,
    events: Statement,
}

impl Statements {
    fn prepare(client: &mut Client) -> Result<Self, postgres::Error> {
        Ok(Statements {
            lock: client.prepare(LOCK)?,
            turns_started: client.prepare(TURNS_STARTED)?,
            calls: client.prepare(CALLS)?,
            calls_ended: client.prepare(CALLS_ENDED)?,
            turns_ended: client.prepare(TURNS_ENDED)?,
            events: client.prepare(EVENTS)?,
        })
    }
}

/// The PostgreSQL writer: a connection, made again after it is lost.
pub(crate) struct PgWriter {
    connector: Connector,
    conn: Option<(Client, Statements)>,
}

impl PgWriter {
    /// A writer over `client` (already connected, holding this replica's lock).
    pub(crate) fn new(connector: Connector, mut client: Client) -> Result<Self, postgres::Error> {
        let statements = Statements::prepare(&mut client)?;
        Ok(PgWriter {
            connector,
            conn: Some((client, statements)),
        })
    }

    fn conn(&mut self) -> Result<&mut (Client, Statements), String> {
        let conn = match self.conn.take() {
            Some((client, statements)) if !client.is_closed() => (client, statements),
            _ => {
                let mut client = self.connector.connect_writer()?;
                let statements = Statements::prepare(&mut client).map_err(|e| e.to_string())?;
                tracing::info!("reconnected to the PostgreSQL audit trail");
                (client, statements)
            }
        };
        Ok(self.conn.insert(conn))
    }
}

impl Backend for PgWriter {
    fn write(&mut self, items: &[Prepared<'_>]) -> Result<(), String> {
        let replica = self.connector.replica.clone();
        let (client, statements) = self.conn()?;
        let result = write_batch(client, statements, &replica, items);
        if result.is_err() && client.is_closed() {
            self.conn = None;
        }
        result.map_err(|e| e.to_string())
    }

    fn prune(&mut self, retain: Duration, now: Timestamp) -> Result<(), String> {
        let (client, _) = self.conn()?;
        super::tasks::prune(client, now.unix_millis()).map_err(|e| e.to_string())?;
        if retain.is_zero() {
            return Ok(());
        }
        let cutoff = now.unix_millis() - retain.as_millis().min(i64::MAX as u128) as i64;
        prune(client, cutoff).map_err(|e| e.to_string())
    }

    fn put_task(&mut self, task: &TaskRecord) -> Result<(), String> {
        let replica = self.connector.replica.clone();
        let (client, _) = self.conn()?;
        let result = super::tasks::write(client, &replica, task);
        if result.is_err() && client.is_closed() {
            self.conn = None;
        }
        result.map_err(|e| e.to_string())
    }

    fn close(&mut self) {
        self.conn = None;
    }
}

/// Deletes events older than `cutoff` and calls and turns that ended before it, in chunks.
pub(crate) fn prune(client: &mut Client, cutoff: i64) -> Result<(), postgres::Error> {
    for sql in [
        "DELETE FROM toolwarden_events WHERE pos IN \
         (SELECT pos FROM toolwarden_events WHERE ts < $1 LIMIT $2)",
        "DELETE FROM toolwarden_calls WHERE id IN \
         (SELECT id FROM toolwarden_calls WHERE ended_at < $1 LIMIT $2)",
        "DELETE FROM toolwarden_turns WHERE id IN \
         (SELECT id FROM toolwarden_turns WHERE ended_at < $1 LIMIT $2)",
    ] {
        while client.execute(sql, &[&cutoff, &PRUNE_CHUNK])? as i64 >= PRUNE_CHUNK {}
    }
    Ok(())
}

/// What one batch writes, column by column.
#[derive(Default)]
struct Columns {
    // Events.
    seq: Vec<i64>,
    ts: Vec<i64>,
    kind: Vec<&'static str>,
    session: Vec<Option<String>>,
    turn: Vec<Option<String>>,
    call: Vec<Option<String>>,
    body: Vec<String>,
    // Turns started: by turn id, the last start of the batch wins.
    started: Vec<(String, Option<String>, Option<String>, i64, i64)>,
    started_at: HashMap<String, usize>,
    // Calls touched, in the order first seen.
    calls: Vec<(String, String, Option<String>, Option<String>, i64, bool)>,
    call_at: HashMap<(String, String), usize>,
    // Calls ended: the last result of the batch wins.
    ended: HashMap<(String, String), (String, i64, i64, i64)>,
    // Turns ended.
    turns_ended: HashMap<String, (String, i64, i64)>,
}

impl Columns {
    fn add(&mut self, item: &Prepared<'_>) {
        let event = item.event;
        let ts = event.ts.unix_millis();
        let seq = event.seq as i64;
        let scope = &event.scope;
        let session = scope.session_id.as_ref().map(|s| s.as_str().to_owned());
        let turn = scope.turn_id.as_ref().map(|t| t.as_str().to_owned());
        let call = scope.call_id.as_ref().map(|c| c.as_str().to_owned());
        if let (Some(turn), EventKind::TurnStart { parent_turn_id, .. }) = (&turn, &event.kind) {
            let row = (
                turn.clone(),
                session.clone(),
                parent_turn_id.as_ref().map(|p| p.as_str().to_owned()),
                ts,
                seq,
            );
            match self.started_at.get(turn) {
                Some(&i) => self.started[i] = row,
                None => {
                    self.started_at.insert(turn.clone(), self.started.len());
                    self.started.push(row);
                }
            }
            self.turns_ended.remove(turn);
        }
        if let (Some(turn), Some(call)) = (&turn, &call) {
            let ran = matches!(event.kind, EventKind::ToolStart { .. });
            let key = (turn.clone(), call.clone());
            match self.call_at.get(&key) {
                Some(&i) => self.calls[i].5 |= ran,
                None => {
                    self.call_at.insert(key.clone(), self.calls.len());
                    self.calls.push((
                        turn.clone(),
                        call.clone(),
                        session.clone(),
                        scope.tool.as_deref().map(str::to_owned),
                        ts,
                        ran,
                    ));
                }
            }
            if let EventKind::ToolResult { result, .. } = &event.kind {
                let outcome = &result.outcome;
                self.ended.insert(
                    key,
                    (
                        outcome.status.name().to_owned(),
                        ts,
                        outcome.duration_ms as i64,
                        i64::from(outcome.attempts),
                    ),
                );
            }
        }
        if let (Some(turn), EventKind::TurnEnd { outcome, .. }) = (&turn, &event.kind) {
            self.turns_ended
                .insert(turn.clone(), (outcome.to_string(), ts, seq));
        }
        self.seq.push(seq);
        self.ts.push(ts);
        self.kind.push(event.kind.name());
        self.session.push(session);
        self.turn.push(turn);
        self.call.push(call);
        self.body.push(item.body.clone());
    }
}

/// Writes `items` in one transaction.
fn write_batch(
    client: &mut Client,
    statements: &Statements,
    replica: &str,
    items: &[Prepared<'_>],
) -> Result<(), postgres::Error> {
    let mut cols = Columns::default();
    for item in items {
        cols.add(item);
    }
    let mut tx = client.transaction()?;
    tx.execute(&statements.lock, &[])?;
    if !cols.started.is_empty() {
        let (mut tid, mut sid, mut parent, mut ts, mut seq) =
            (vec![], vec![], vec![], vec![], vec![]);
        for (t, s, p, at, n) in cols.started {
            tid.push(t);
            sid.push(s);
            parent.push(p);
            ts.push(at);
            seq.push(n);
        }
        tx.execute(
            &statements.turns_started,
            &[&replica, &tid, &sid, &parent, &ts, &seq],
        )?;
    }
    if !cols.calls.is_empty() {
        let (mut tid, mut cid, mut sid, mut tool, mut ts, mut ran) =
            (vec![], vec![], vec![], vec![], vec![], vec![]);
        for (t, c, s, tl, at, r) in cols.calls {
            tid.push(t);
            cid.push(c);
            sid.push(s);
            tool.push(tl);
            ts.push(at);
            ran.push(r);
        }
        tx.execute(
            &statements.calls,
            &[&replica, &tid, &cid, &sid, &tool, &ts, &ran],
        )?;
    }
    if !cols.ended.is_empty() {
        let (mut tid, mut cid, mut status, mut ts, mut dur, mut attempts) =
            (vec![], vec![], vec![], vec![], vec![], vec![]);
        for ((t, c), (st, at, d, a)) in cols.ended {
            tid.push(t);
            cid.push(c);
            status.push(st);
            ts.push(at);
            dur.push(d);
            attempts.push(a);
        }
        tx.execute(
            &statements.calls_ended,
            &[&tid, &cid, &status, &ts, &dur, &attempts],
        )?;
    }
    if !cols.turns_ended.is_empty() {
        let (mut tid, mut outcome, mut ts, mut seq) = (vec![], vec![], vec![], vec![]);
        for (t, (o, at, n)) in cols.turns_ended {
            tid.push(t);
            outcome.push(o);
            ts.push(at);
            seq.push(n);
        }
        tx.execute(
            &statements.turns_ended,
            &[&replica, &tid, &outcome, &ts, &seq],
        )?;
    }
    tx.execute(
        &statements.events,
        &[
            &replica,
            &cols.seq,
            &cols.ts,
            &cols.kind,
            &cols.session,
            &cols.turn,
            &cols.call,
            &cols.body,
        ],
    )?;
    tx.commit()
}
