//! Writing to PostgreSQL: one transaction per batch, written by one statement whatever the
//! batch's size — a call of `toolwarden_write_batch` (schema.rs, migration 4) with the batch
//! column by column, which puts every event in with one `INSERT … SELECT FROM unnest(…)`, and so
//! the turns and calls they start and end — so a commit costs one round trip for one call or for
//! hundreds.
//!
//! Writers of several replicas take turns to insert events and commit (a transaction-scoped
//! advisory lock, taken inside the function after the turns and calls are written), so that
//! `pos`, the trail's order over every replica, is also the order in which events became
//! visible: a reader paging by `pos` never misses an event committed later with a smaller one.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use postgres::{Client, Statement};
use toolwarden_protocol::{EventKind, TaskRecord, Timestamp};

use super::connect::{Connector, describe};
use super::liveness::Fence;
use crate::redact::RedactedEvent;
use crate::writer::TrailBackend;

/// Rows deleted per statement when pruning.
const PRUNE_CHUNK: i64 = 5000;

/// A batch, written by one call of the function migration 4 made (schema.rs): turns started,
/// calls touched, calls ended, turns ended, then — under the commit-order lock — the events.
const WRITE_BATCH: &str = "SELECT toolwarden_write_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, \
    $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, \
    $28, $29, $30, $31, $32)";

/// The writer's session setting, made on every connection before its statement is prepared:
/// **commits not flushed to disk one by one** (`synchronous_commit = off`), unless the server,
/// the database, the role or the URL set `synchronous_commit` (then that setting is kept). A
/// commit is then in the server when it returns: it survives toolwarden dying, as SQLite's
/// `synchronous = NORMAL` commit does, and only a crash of the database server can lose the last
/// ones (those of its last few hundred milliseconds). Flushing every commit would cost a disk
/// flush per call waiting for its `tool_start` (several milliseconds on an ordinary disk).
const SESSION: &str = "
    SELECT set_config('synchronous_commit', 'off', false) FROM pg_settings
        WHERE name = 'synchronous_commit' AND source = 'default'";

/// The statement of a batch, prepared once per connection.
struct Statements {
    write_batch: Statement,
}

impl Statements {
    fn prepare(client: &mut Client) -> Result<Self, postgres::Error> {
        client.batch_execute(SESSION)?;
        Ok(Statements {
            write_batch: client.prepare(WRITE_BATCH)?,
        })
    }
}

/// The PostgreSQL writer: a connection, made again after it is lost — under this replica's
/// current lease (liveness.rs), so a replica declared dead writes nothing until it rejoins.
pub(crate) struct PgWriter {
    connector: Connector,
    fence: Arc<Fence>,
    conn: Option<(Client, Statements)>,
    /// Whether the last batch was written: a replica that stops with events it could not write
    /// is not marked stopped, so that a survivor records what it left open.
    written: bool,
}

impl PgWriter {
    /// A writer over `client` (already connected, holding this replica's lock, registered as
    /// its writer by `fence`).
    pub(crate) fn new(
        connector: Connector,
        fence: Arc<Fence>,
        mut client: Client,
    ) -> Result<Self, postgres::Error> {
        let statements = Statements::prepare(&mut client)?;
        Ok(PgWriter {
            connector,
            fence,
            conn: Some((client, statements)),
            written: true,
        })
    }

    fn conn(&mut self) -> Result<&mut (Client, Statements), String> {
        let conn = match self.conn.take() {
            Some((client, statements)) if !client.is_closed() => (client, statements),
            _ => {
                let mut client = self.connector.connect_writer()?;
                self.fence.claim_writer(&mut client)?;
                let statements = Statements::prepare(&mut client).map_err(|e| describe(&e))?;
                tracing::info!("reconnected to the PostgreSQL audit trail");
                (client, statements)
            }
        };
        Ok(self.conn.insert(conn))
    }
}

impl TrailBackend for PgWriter {
    fn write(&mut self, items: &[RedactedEvent<'_>]) -> Result<(), String> {
        let replica = self.connector.replica.clone();
        let fence = self.fence.clone();
        self.written = false;
        let (client, statements) = self.conn()?;
        let result = write_batch(client, statements, &replica, fence.keep(items));
        if result.is_ok() {
            fence.committed(items);
        }
        if result.is_err() && client.is_closed() {
            self.conn = None;
        }
        self.written = result.is_ok();
        result.map_err(|e| describe(&e))
    }

    fn prune(&mut self, retain: Duration, now: Timestamp) -> Result<(), String> {
        let (client, _) = self.conn()?;
        super::tasks::prune(client, now.unix_millis()).map_err(|e| describe(&e))?;
        if retain.is_zero() {
            return Ok(());
        }
        let cutoff = now.unix_millis() - retain.as_millis().min(i64::MAX as u128) as i64;
        prune(client, cutoff).map_err(|e| describe(&e))
    }

    fn put_task(&mut self, task: &TaskRecord) -> Result<(), String> {
        let replica = self.connector.replica.clone();
        let (client, _) = self.conn()?;
        let result = super::tasks::write(client, &replica, task);
        if result.is_err() && client.is_closed() {
            self.conn = None;
        }
        result.map_err(|e| describe(&e))
    }

    fn close(&mut self) {
        if let Some((client, _)) = self.conn.as_mut().filter(|(c, _)| !c.is_closed())
            && self.written
        {
            self.fence.stopped(client);
        }
        self.conn = None;
    }
}

/// Deletes events older than `cutoff` and calls and turns that ended before it, in chunks, and
/// the rows of replicas gone before it.
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
    // Replicas that stopped, or died and were taken over, before it.
    client.execute(
        "DELETE FROM toolwarden_replicas WHERE coalesce(stopped_at, taken_over_at) < $1",
        &[&cutoff],
    )?;
    Ok(())
}

/// A call touched: its turn, id, session, tool, time, whether its backend ran, and who made it.
type Touched = (
    String,
    String,
    Option<String>,
    Option<String>,
    i64,
    bool,
    String,
);
/// A turn started: its id, session, parent, time, `seq`, and who made it.
type Begun = (String, Option<String>, Option<String>, i64, i64, String);

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
    principal: Vec<Option<String>>,
    // Turns started: by turn id, the last start of the batch wins.
    started: Vec<Begun>,
    started_at: HashMap<String, usize>,
    // Calls touched, in the order first seen.
    calls: Vec<Touched>,
    call_at: HashMap<(String, String), usize>,
    // Calls ended: the last result of the batch wins.
    ended: HashMap<(String, String), (String, i64, i64, i64)>,
    // Turns ended.
    turns_ended: HashMap<String, (String, i64, i64)>,
}

impl Columns {
    fn add(&mut self, item: &RedactedEvent<'_>) {
        let event = item.event;
        let ts = event.ts.unix_millis();
        let seq = event.seq as i64;
        let scope = &event.scope;
        let session = scope.session_id.as_ref().map(|s| s.as_str().to_owned());
        let turn = scope.turn_id.as_ref().map(|t| t.as_str().to_owned());
        let call = scope.call_id.as_ref().map(|c| c.as_str().to_owned());
        let principal = scope.principal.as_deref().map(str::to_owned);
        let recorded = || {
            principal
                .clone()
                .unwrap_or_else(|| toolwarden_protocol::LOCAL_PRINCIPAL.to_owned())
        };
        if let (Some(turn), EventKind::TurnStart { parent_turn_id, .. }) = (&turn, &event.kind) {
            let row = (
                turn.clone(),
                session.clone(),
                parent_turn_id.as_ref().map(|p| p.as_str().to_owned()),
                ts,
                seq,
                recorded(),
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
                        recorded(),
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
        self.principal.push(principal);
    }
}

/// Writes `items` in one transaction: one statement, one round trip.
fn write_batch(
    client: &mut Client,
    statements: &Statements,
    replica: &str,
    items: Vec<&RedactedEvent<'_>>,
) -> Result<(), postgres::Error> {
    if items.is_empty() {
        return Ok(());
    }
    let mut cols = Columns::default();
    for item in items {
        cols.add(item);
    }
    let (mut s_tid, mut s_sid, mut s_parent, mut s_ts, mut s_seq, mut s_who) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for (t, s, p, at, n, who) in cols.started {
        s_who.push(who);
        s_tid.push(t);
        s_sid.push(s);
        s_parent.push(p);
        s_ts.push(at);
        s_seq.push(n);
    }
    let (mut c_tid, mut c_cid, mut c_sid, mut c_tool, mut c_ts, mut c_ran, mut c_who) =
        (vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
    for (t, c, s, tl, at, r, who) in cols.calls {
        c_who.push(who);
        c_tid.push(t);
        c_cid.push(c);
        c_sid.push(s);
        c_tool.push(tl);
        c_ts.push(at);
        c_ran.push(r);
    }
    let (mut x_tid, mut x_cid, mut x_status, mut x_ts, mut x_dur, mut x_attempts) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for ((t, c), (st, at, d, a)) in cols.ended {
        x_tid.push(t);
        x_cid.push(c);
        x_status.push(st);
        x_ts.push(at);
        x_dur.push(d);
        x_attempts.push(a);
    }
    let (mut t_tid, mut t_outcome, mut t_ts, mut t_seq) = (vec![], vec![], vec![], vec![]);
    for (t, (o, at, n)) in cols.turns_ended {
        t_tid.push(t);
        t_outcome.push(o);
        t_ts.push(at);
        t_seq.push(n);
    }
    client.execute(
        &statements.write_batch,
        &[
            &replica,
            &s_tid,
            &s_sid,
            &s_parent,
            &s_ts,
            &s_seq,
            &c_tid,
            &c_cid,
            &c_sid,
            &c_tool,
            &c_ts,
            &c_ran,
            &x_tid,
            &x_cid,
            &x_status,
            &x_ts,
            &x_dur,
            &x_attempts,
            &t_tid,
            &t_outcome,
            &t_ts,
            &t_seq,
            &cols.seq,
            &cols.ts,
            &cols.kind,
            &cols.session,
            &cols.turn,
            &cols.call,
            &cols.body,
            &s_who,
            &c_who,
            &cols.principal,
        ],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use postgres::{Client, NoTls};
    use toolwarden_testkit::pg::TestSchema;

    use super::SESSION;

    /// `synchronous_commit` of a session at `url` once [`SESSION`] ran, and where the server's
    /// own `synchronous_commit` comes from.
    fn session(url: &str) -> (String, String) {
        let url = url.to_owned();
        std::thread::spawn(move || {
            let mut client = Client::connect(&url, NoTls).unwrap();
            let source: String = client
                .query_one(
                    "SELECT source FROM pg_settings WHERE name = 'synchronous_commit'",
                    &[],
                )
                .unwrap()
                .get(0);
            client.batch_execute(SESSION).unwrap();
            let commit: String = client
                .query_one("SHOW synchronous_commit", &[])
                .unwrap()
                .get(0);
            (commit, source)
        })
        .join()
        .unwrap()
    }

    #[test]
    fn the_writer_commits_without_a_flush_unless_synchronous_commit_was_set() {
        let schema = TestSchema::new();
        let (commit, source) = session(schema.url());
        if source == "default" {
            assert_eq!(commit, "off");
        }
        // Set in the URL: kept.
        let flushed = format!("{}%20-csynchronous_commit%3Don", schema.url());
        assert_eq!(session(&flushed), ("on".to_owned(), "client".to_owned()));
    }
}
