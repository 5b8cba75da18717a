//! Writing events: each event is one row of `events`, and keeps `turns` and `calls` (one row per
//! turn and per call, with its outcome) up to date, so that filtered reads never scan events.

use std::collections::HashMap;

use rusqlite::{CachedStatement, Connection, OptionalExtension as _, params};
use toolwarden_protocol::{Event, EventKind};

/// What the writer remembers between events: the rows of running turns and calls (looked up in
/// the database when not here — a late event of an ended call — so losing it loses nothing).
#[derive(Default)]
pub(crate) struct Rows {
    turns: HashMap<String, i64>,
    calls: HashMap<(i64, String), i64>,
    /// The minute of the last mark written.
    minute: i64,
    /// The highest row ids handed out.
    last_turn_row: i64,
    last_call_row: i64,
}

impl Rows {
    /// Forgets everything (after a rolled-back transaction: the rows it made are gone).
    pub(crate) fn clear(&mut self) {
        *self = Rows::default();
    }
}

/// What writing one event into `events`, `turns` and `calls` needs to know about it: read from a
/// live event ([`Fact::of`]) or from a record of the pending file (`pending.rs`), borrowing from
/// either.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Fact<'a> {
    pub(crate) seq: u64,
    /// Milliseconds since the Unix epoch.
    pub(crate) ts: i64,
    /// The event's `type`.
    pub(crate) kind: &'a str,
    pub(crate) turn_id: Option<&'a str>,
    pub(crate) call_id: Option<&'a str>,
    /// Who made the turn (`None`: an event about no call, or a record from before principals).
    pub(crate) principal: Option<&'a str>,
    pub(crate) session_id: Option<&'a str>,
    pub(crate) tool: Option<&'a str>,
    pub(crate) change: Change<'a>,
}

/// What an event changes in `turns` and `calls` beyond its own row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Change<'a> {
    /// A turn starts (under a parent turn, for a nested one).
    TurnStart { parent_turn_id: Option<&'a str> },
    /// A turn ends with this outcome.
    TurnEnd { outcome: &'a str },
    /// A call's backend is invoked.
    ToolStart,
    /// A call ends.
    ToolResult {
        status: &'a str,
        duration_ms: i64,
        attempts: i64,
    },
    /// Nothing beyond the event's row.
    None,
}

impl<'a> Fact<'a> {
    /// The principal to record: `local` for an event that names none.
    pub(crate) fn principal_or_local(&self) -> &'a str {
        self.principal
            .unwrap_or(toolwarden_protocol::LOCAL_PRINCIPAL)
    }

    pub(crate) fn of(event: &'a Event) -> Fact<'a> {
        let change = match &event.kind {
            EventKind::TurnStart { parent_turn_id, .. } => Change::TurnStart {
                parent_turn_id: parent_turn_id.as_ref().map(|p| p.as_str()),
            },
            EventKind::TurnEnd { outcome, .. } => Change::TurnEnd { outcome },
            EventKind::ToolStart { .. } => Change::ToolStart,
            EventKind::ToolResult { result, .. } => Change::ToolResult {
                status: result.outcome.status.name(),
                duration_ms: i64::try_from(result.outcome.duration_ms).unwrap_or(i64::MAX),
                attempts: i64::from(result.outcome.attempts),
            },
            _ => Change::None,
        };
        let scope = &event.scope;
        Fact {
            seq: event.seq,
            ts: event.ts.unix_millis(),
            kind: event.kind.name(),
            turn_id: scope.turn_id.as_ref().map(|t| t.as_str()),
            call_id: scope.call_id.as_ref().map(|c| c.as_str()),
            principal: scope.principal.as_deref(),
            session_id: scope.session_id.as_ref().map(|s| s.as_str()),
            tool: scope.tool.as_deref(),
            change,
        }
    }
}

/// The writes of one transaction, with its statements held from their first use to its end:
/// taken from the connection's cache once a batch, not once an event (the cache finds a
/// statement by hashing its whole text, and an event runs up to six of them).
pub(crate) struct Writes<'c> {
    conn: &'c Connection,
    held: Vec<(&'static str, CachedStatement<'c>)>,
}

impl<'c> Writes<'c> {
    /// The writes of the transaction open on `conn` (a `Transaction` derefs to it); drop them
    /// before it commits.
    pub(crate) fn new(conn: &'c Connection) -> Self {
        Writes {
            conn,
            held: Vec::new(),
        }
    }

    /// The statement of `sql`, prepared (or taken from the cache) at its first use.
    fn prepare_cached(&mut self, sql: &'static str) -> rusqlite::Result<&mut CachedStatement<'c>> {
        // Each statement is one literal of this file: its address names it.
        let at = match self
            .held
            .iter()
            .position(|(held, _)| std::ptr::eq(*held, sql))
        {
            Some(at) => at,
            None => {
                self.held.push((sql, self.conn.prepare_cached(sql)?));
                self.held.len() - 1
            }
        };
        Ok(&mut self.held[at].1)
    }

    fn last_insert_rowid(&self) -> i64 {
        self.conn.last_insert_rowid()
    }
}

/// Writes one event (`fact`, its serialized and redacted `body`) and what it changes in `turns`
/// and `calls`.
pub(crate) fn apply(
    tx: &mut Writes<'_>,
    rows: &mut Rows,
    fact: &Fact<'_>,
    body: &str,
) -> rusqlite::Result<()> {
    let ts = fact.ts;
    let turn_row = match fact.turn_id {
        Some(turn_id) => Some(turn_row(tx, rows, fact, turn_id)?),
        None => None,
    };
    let call_row = match (fact.call_id, turn_row) {
        (Some(call_id), Some(turn_row)) => Some(call_row(tx, rows, fact, turn_row, call_id)?),
        _ => None,
    };
    match &fact.change {
        Change::TurnEnd { outcome } => {
            if let Some(row) = turn_row {
                tx.prepare_cached(
                    "UPDATE turns SET ended_at = ?1, outcome = ?2, end_seq = ?3 WHERE id = ?4",
                )?
                .execute(params![ts, outcome, fact.seq as i64, row])?;
            }
            if let Some(turn_id) = fact.turn_id {
                rows.turns.remove(turn_id);
            }
        }
        Change::ToolResult {
            status,
            duration_ms,
            attempts,
        } => {
            if let Some(row) = call_row {
                tx.prepare_cached(
                    "UPDATE calls SET status = ?1, ended_at = ?2, duration_ms = ?3, attempts = ?4 \
                     WHERE id = ?5",
                )?
                .execute(params![status, ts, duration_ms, attempts, row])?;
                if let (Some(turn_row), Some(call_id)) = (turn_row, fact.call_id) {
                    rows.calls.remove(&(turn_row, call_id.to_owned()));
                }
            }
        }
        _ => {}
    }
    let minute = ts.div_euclid(60_000);
    if minute != rows.minute {
        rows.minute = minute;
        tx.prepare_cached(
            "INSERT OR IGNORE INTO marks (minute, seq, call_row, turn_row) VALUES (?1, ?2, ?3, ?4)",
        )?
        .execute(params![
            minute,
            fact.seq as i64,
            call_row.unwrap_or(rows.last_call_row + 1),
            turn_row.unwrap_or(rows.last_turn_row + 1)
        ])?;
    }
    // A `seq` is written once (one process writes a store at a time); should one come again,
    // the first record stays.
    tx.prepare_cached(
        "INSERT OR IGNORE INTO events (seq, ts, type, turn_row, call_row, body) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params![
        fact.seq as i64,
        ts,
        fact.kind,
        turn_row,
        call_row,
        body
    ])?;
    Ok(())
}

/// The row `insert` (an `INSERT OR IGNORE`) made, or, when its key had a row already, the one
/// `update` changed (its `RETURNING id`). A plain insert, not an upsert returning the row: SQLite
/// runs an upsert with a statement journal and its `RETURNING` through a table of its own, at
/// every turn.
fn insert_or_update(
    tx: &mut Writes<'_>,
    insert: &'static str,
    insert_params: impl rusqlite::Params,
    update: &'static str,
    update_params: impl rusqlite::Params,
) -> rusqlite::Result<i64> {
    if tx.prepare_cached(insert)?.execute(insert_params)? == 1 {
        return Ok(tx.last_insert_rowid());
    }
    tx.prepare_cached(update)?
        .query_row(update_params, |r| r.get(0))
}

fn turn_row(
    tx: &mut Writes<'_>,
    rows: &mut Rows,
    fact: &Fact<'_>,
    turn_id: &str,
) -> rusqlite::Result<i64> {
    let ts = fact.ts;
    if let Change::TurnStart { parent_turn_id } = fact.change {
        // A turn id used again (a caller may choose its turn ids) continues the same row.
        let row = insert_or_update(
            tx,
            "INSERT OR IGNORE INTO turns (turn_id, session_id, parent_turn_id, started_at, \
             start_seq, principal) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                turn_id,
                fact.session_id,
                parent_turn_id,
                ts,
                fact.seq as i64,
                fact.principal_or_local()
            ],
            "UPDATE turns SET ended_at = NULL, outcome = NULL, end_seq = NULL, \
             start_seq = ?2 WHERE turn_id = ?1 RETURNING id",
            params![turn_id, fact.seq as i64],
        )?;
        rows.last_turn_row = rows.last_turn_row.max(row);
        rows.turns.insert(turn_id.to_owned(), row);
        return Ok(row);
    }
    if let Some(row) = rows.turns.get(turn_id) {
        return Ok(*row);
    }
    let found: Option<i64> = tx
        .prepare_cached("SELECT id FROM turns WHERE turn_id = ?1")?
        .query_row([turn_id], |r| r.get(0))
        .optional()?;
    if let Some(row) = found {
        return Ok(row);
    }
    // An event of a turn whose start the trail never saw (it was pruned): the turn starts here.
    let row: i64 = tx
        .prepare_cached(
            "INSERT INTO turns (turn_id, session_id, started_at, principal) VALUES (?1, ?2, ?3, ?4) \
             RETURNING id",
        )?
        .query_row(
            params![turn_id, fact.session_id, ts, fact.principal_or_local()],
            |r| r.get(0),
        )?;
    rows.last_turn_row = rows.last_turn_row.max(row);
    Ok(row)
}

fn call_row(
    tx: &mut Writes<'_>,
    rows: &mut Rows,
    fact: &Fact<'_>,
    turn_row: i64,
    call_id: &str,
) -> rusqlite::Result<i64> {
    let key = (turn_row, call_id.to_owned());
    let ran = fact.change == Change::ToolStart;
    if let Some(row) = rows.calls.get(&key) {
        if ran {
            tx.prepare_cached("UPDATE calls SET ran = 1 WHERE id = ?1")?
                .execute([*row])?;
        }
        return Ok(*row);
    }
    // A call there already is one of an ended call's turn and id (a late event), or of a turn
    // used again.
    let row = insert_or_update(
        tx,
        "INSERT OR IGNORE INTO calls (turn_row, turn_id, call_id, session_id, tool, \
         started_at, ran, principal) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![
            turn_row,
            fact.turn_id,
            call_id,
            fact.session_id,
            fact.tool,
            fact.ts,
            ran,
            fact.principal_or_local()
        ],
        "UPDATE calls SET ran = max(ran, ?3) WHERE turn_row = ?1 AND call_id = ?2 RETURNING id",
        params![turn_row, call_id, ran],
    )?;
    rows.last_call_row = rows.last_call_row.max(row);
    // Ended calls are not kept: their late events (`tool_stopped`) find them in the database.
    if !matches!(fact.change, Change::ToolResult { .. }) {
        rows.calls.insert(key, row);
    }
    Ok(row)
}
