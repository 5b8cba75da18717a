//! Writing events: each event is one row of `events`, and keeps `turns` and `calls` (one row per
//! turn and per call, with its outcome) up to date, so that filtered reads never scan events.

use std::collections::HashMap;

use rusqlite::{CachedStatement, Connection, OptionalExtension as _, params};
use toolwarden_protocol::{Event, EventKind};

/// What the writer remembers between events: the rows of running turns and calls (looked up in
/// the database when not here — a late event of an ended call — so losing it loses nothing).
#[derive(Default)]
pub(crate) struct Rows {
    turns: HashMap<String, Row>,
    calls: HashMap<(i64, String), Row>,
    /// The minute of the last mark written.
    minute: i64,
    /// The highest row ids handed out.
    last_turn_row: i64,
    last_call_row: i64,
}

/// A running turn's or call's row, and whether it was written whole (with the end its batch
/// holds, [`Ends`]): the end then changes nothing, and a call's start (`ran`) neither.
#[derive(Clone, Copy)]
struct Row {
    id: i64,
    whole: bool,
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

/// What a batch holds of how its turns and calls end, read before any of it is written. A turn
/// that starts and ends once in the batch, and a call whose events in the batch end with one
/// result, are inserted whole at their first event: no `UPDATE` at their end, and no entry in
/// the index of open turns to make and take out again. Any other (a turn id used twice, two
/// results) is written at its start and changed at its end, as events come; so is a row the
/// insert finds there already (a call started in an earlier batch, a turn id used before):
/// only a row this batch inserts is ever whole. The rows come out the same either way, because
/// nothing in the transaction reads a row's end columns and `ran` is only ever raised.
struct Ends<'a> {
    turns: HashMap<&'a str, Plan<TurnEnd<'a>>>,
    calls: HashMap<(&'a str, &'a str), Plan<CallEnd<'a>>>,
}

/// What the batch holds of one turn or call, so far.
enum Plan<E> {
    /// Started (for a call: its first event in the batch came) and not ended; for a call,
    /// whether it `ran` (its `tool_start` came).
    Open { ran: bool },
    /// Started and ended once.
    Ends(E),
    /// Anything else: written as events come.
    Unfit,
}

#[derive(Clone, Copy)]
struct TurnEnd<'a> {
    ts: i64,
    seq: u64,
    outcome: &'a str,
}

#[derive(Clone, Copy)]
struct CallEnd<'a> {
    ts: i64,
    status: &'a str,
    duration_ms: i64,
    attempts: i64,
    ran: bool,
}

impl<'a> Ends<'a> {
    /// Reads the ends of a batch's facts, in the order they will be written.
    fn of<'f>(facts: impl IntoIterator<Item = &'f Fact<'a>>) -> Ends<'a>
    where
        'a: 'f,
    {
        let mut ends = Ends {
            turns: HashMap::new(),
            calls: HashMap::new(),
        };
        for fact in facts {
            let Some(turn_id) = fact.turn_id else {
                continue;
            };
            match fact.change {
                Change::TurnStart { .. } => {
                    ends.turns
                        .entry(turn_id)
                        .and_modify(|p| *p = Plan::Unfit)
                        .or_insert(Plan::Open { ran: false });
                }
                Change::TurnEnd { outcome } => {
                    let plan = ends.turns.entry(turn_id).or_insert(Plan::Unfit);
                    *plan = match plan {
                        Plan::Open { .. } => Plan::Ends(TurnEnd {
                            ts: fact.ts,
                            seq: fact.seq,
                            outcome,
                        }),
                        _ => Plan::Unfit,
                    };
                }
                _ => {}
            }
            let Some(call_id) = fact.call_id else {
                continue;
            };
            let plan = ends
                .calls
                .entry((turn_id, call_id))
                .or_insert(Plan::Open { ran: false });
            *plan = match (&*plan, &fact.change) {
                (Plan::Open { .. }, Change::ToolStart) => Plan::Open { ran: true },
                (
                    Plan::Open { ran },
                    Change::ToolResult {
                        status,
                        duration_ms,
                        attempts,
                    },
                ) => Plan::Ends(CallEnd {
                    ts: fact.ts,
                    status,
                    duration_ms: *duration_ms,
                    attempts: *attempts,
                    ran: *ran,
                }),
                // A start or a second result after the end: written as events come.
                (Plan::Ends(_), Change::ToolStart | Change::ToolResult { .. }) => Plan::Unfit,
                // Late events of an ended call (`tool_stopped`) change nothing in its row.
                (Plan::Ends(end), _) => Plan::Ends(*end),
                (Plan::Open { ran }, _) => Plan::Open { ran: *ran },
                (Plan::Unfit, _) => Plan::Unfit,
            };
        }
        ends
    }

    fn turn(&self, turn_id: &str) -> Option<TurnEnd<'a>> {
        match self.turns.get(turn_id) {
            Some(Plan::Ends(end)) => Some(*end),
            _ => None,
        }
    }

    fn call(&self, turn_id: &str, call_id: &str) -> Option<CallEnd<'a>> {
        match self.calls.get(&(turn_id, call_id)) {
            Some(Plan::Ends(end)) => Some(*end),
            _ => None,
        }
    }
}

/// Writes a batch of facts (each with its serialized and redacted body), in order, in the
/// transaction `tx` holds.
pub(crate) fn apply_batch<'a>(
    tx: &mut Writes<'_>,
    rows: &mut Rows,
    batch: &[(Fact<'a>, &str)],
) -> rusqlite::Result<()> {
    let ends = Ends::of(batch.iter().map(|(fact, _)| fact));
    for (fact, body) in batch {
        apply(tx, rows, &ends, fact, body)?;
    }
    Ok(())
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
fn apply(
    tx: &mut Writes<'_>,
    rows: &mut Rows,
    ends: &Ends<'_>,
    fact: &Fact<'_>,
    body: &str,
) -> rusqlite::Result<()> {
    let ts = fact.ts;
    let turn = match fact.turn_id {
        Some(turn_id) => Some(turn_row(tx, rows, ends, fact, turn_id)?),
        None => None,
    };
    let call = match (fact.call_id, turn) {
        (Some(call_id), Some(turn)) => Some(call_row(tx, rows, ends, fact, turn.id, call_id)?),
        _ => None,
    };
    let turn_row = turn.map(|t| t.id);
    let call_row = call.map(|c| c.id);
    match &fact.change {
        Change::TurnEnd { outcome } => {
            if let Some(Row {
                id: row,
                whole: false,
            }) = turn
            {
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
            if let Some(Row { id: row, whole }) = call {
                if !whole {
                    tx.prepare_cached(
                    "UPDATE calls SET status = ?1, ended_at = ?2, duration_ms = ?3, attempts = ?4 \
                     WHERE id = ?5",
                    )?
                    .execute(params![status, ts, duration_ms, attempts, row])?;
                }
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

/// The row `insert` (an `INSERT OR IGNORE`, of a row written `whole` or not) made, or, when its
/// key had a row already, the one `update` changed (its `RETURNING id`). A plain insert, not an
/// upsert returning the row: SQLite runs an upsert with a statement journal and its `RETURNING`
/// through a table of its own, at every turn.
fn insert_or_update(
    tx: &mut Writes<'_>,
    insert: &'static str,
    insert_params: impl rusqlite::Params,
    whole: bool,
    update: &'static str,
    update_params: impl rusqlite::Params,
) -> rusqlite::Result<Row> {
    if tx.prepare_cached(insert)?.execute(insert_params)? == 1 {
        return Ok(Row {
            id: tx.last_insert_rowid(),
            whole,
        });
    }
    let id = tx
        .prepare_cached(update)?
        .query_row(update_params, |r| r.get(0))?;
    Ok(Row { id, whole: false })
}

fn turn_row(
    tx: &mut Writes<'_>,
    rows: &mut Rows,
    ends: &Ends<'_>,
    fact: &Fact<'_>,
    turn_id: &str,
) -> rusqlite::Result<Row> {
    let ts = fact.ts;
    if let Change::TurnStart { parent_turn_id } = fact.change {
        let end = ends.turn(turn_id);
        // A turn id used again (a caller may choose its turn ids) continues the same row.
        let row = insert_or_update(
            tx,
            "INSERT OR IGNORE INTO turns (turn_id, session_id, parent_turn_id, started_at, \
             start_seq, principal, ended_at, outcome, end_seq) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            params![
                turn_id,
                fact.session_id,
                parent_turn_id,
                ts,
                fact.seq as i64,
                fact.principal_or_local(),
                end.map(|e| e.ts),
                end.map(|e| e.outcome),
                end.map(|e| e.seq as i64)
            ],
            end.is_some(),
            "UPDATE turns SET ended_at = NULL, outcome = NULL, end_seq = NULL, \
             start_seq = ?2 WHERE turn_id = ?1 RETURNING id",
            params![turn_id, fact.seq as i64],
        )?;
        rows.last_turn_row = rows.last_turn_row.max(row.id);
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
    if let Some(id) = found {
        return Ok(Row { id, whole: false });
    }
    // An event of a turn whose start the trail never saw (it was pruned): the turn starts here.
    let id: i64 = tx
        .prepare_cached(
            "INSERT INTO turns (turn_id, session_id, started_at, principal) VALUES (?1, ?2, ?3, ?4) \
             RETURNING id",
        )?
        .query_row(
            params![turn_id, fact.session_id, ts, fact.principal_or_local()],
            |r| r.get(0),
        )?;
    rows.last_turn_row = rows.last_turn_row.max(id);
    Ok(Row { id, whole: false })
}

fn call_row(
    tx: &mut Writes<'_>,
    rows: &mut Rows,
    ends: &Ends<'_>,
    fact: &Fact<'_>,
    turn_row: i64,
    call_id: &str,
) -> rusqlite::Result<Row> {
    let key = (turn_row, call_id.to_owned());
    let ran = fact.change == Change::ToolStart;
    if let Some(row) = rows.calls.get(&key) {
        if ran && !row.whole {
            tx.prepare_cached("UPDATE calls SET ran = 1 WHERE id = ?1")?
                .execute([row.id])?;
        }
        return Ok(*row);
    }
    let end = fact.turn_id.and_then(|turn_id| ends.call(turn_id, call_id));
    // A call there already is one of an ended call's turn and id (a late event), or of a turn
    // used again.
    let row = insert_or_update(
        tx,
        "INSERT OR IGNORE INTO calls (turn_row, turn_id, call_id, session_id, tool, \
         started_at, ran, principal, status, ended_at, duration_ms, attempts) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
        params![
            turn_row,
            fact.turn_id,
            call_id,
            fact.session_id,
            fact.tool,
            fact.ts,
            ran || end.is_some_and(|e| e.ran),
            fact.principal_or_local(),
            end.map(|e| e.status),
            end.map(|e| e.ts),
            end.map(|e| e.duration_ms),
            end.map(|e| e.attempts)
        ],
        end.is_some(),
        "UPDATE calls SET ran = max(ran, ?3) WHERE turn_row = ?1 AND call_id = ?2 RETURNING id",
        params![turn_row, call_id, ran],
    )?;
    rows.last_call_row = rows.last_call_row.max(row.id);
    // A call is forgotten at its result: a late event (`tool_stopped`) finds its row in the
    // database.
    if !matches!(fact.change, Change::ToolResult { .. }) {
        rows.calls.insert(key, row);
    }
    Ok(row)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used, clippy::unwrap_used, reason = "tests")]

    use proptest::prelude::*;
    use rusqlite::Connection;

    use super::*;

    const TURNS: [&str; 2] = ["t_a", "t_b"];
    const CALLS: [&str; 2] = ["1", "2"];
    const SESSIONS: [&str; 3] = ["s_1", "s_2", "s_3"];
    const TOOLS: [&str; 2] = ["echo", "fetch"];

    /// An event of the generated histories: (kind, turn, call), with turn and call picked from two
    /// ids each. Its session, principal and tool change from event to event, so that a row made
    /// from another event than the one that starts it shows; its time moves to a new minute every
    /// third event, so that minute marks are written.
    fn fact(seq: u64, (kind, turn, call): (u8, u8, u8)) -> Fact<'static> {
        let call_id = CALLS[usize::from(call % 2)];
        let (change, call) = match kind % 6 {
            0 => (
                Change::TurnStart {
                    parent_turn_id: seq.is_multiple_of(3).then_some("t_parent"),
                },
                None,
            ),
            1 => (
                Change::TurnEnd {
                    outcome: if seq.is_multiple_of(2) {
                        "completed"
                    } else {
                        "partial"
                    },
                },
                None,
            ),
            2 => (Change::ToolStart, Some(call_id)),
            3 => (
                Change::ToolResult {
                    status: if seq.is_multiple_of(2) { "ok" } else { "error" },
                    duration_ms: seq as i64,
                    attempts: 1 + (seq % 3) as i64,
                },
                Some(call_id),
            ),
            // An event of a call that changes nothing (`tool_progress`, `tool_stopped`).
            4 => (Change::None, Some(call_id)),
            _ => (Change::None, None),
        };
        let n = seq as usize;
        Fact {
            seq,
            ts: 1_000 + 20_000 * seq as i64,
            kind: ["a", "b", "c"][n % 3],
            turn_id: Some(TURNS[usize::from(turn % 2)]),
            call_id: call,
            principal: (!n.is_multiple_of(4)).then(|| ["alice", "bob"][n % 2]),
            session_id: Some(SESSIONS[n % 3]),
            tool: call.map(|_| TOOLS[n % 2]),
            change,
        }
    }

    fn store() -> Connection {
        let mut conn = Connection::open_in_memory().unwrap();
        super::super::schema::migrate(&mut conn, 0).unwrap();
        conn
    }

    /// How a history is written.
    enum Batches<'c> {
        /// Each event in a transaction of its own, and no turn or call written whole: what the
        /// writer did before it read batches ahead.
        AsEventsCome,
        /// In batches that end after each index of `cuts`; a batch whose index is in `fresh`
        /// starts with nothing remembered (as after a failed transaction, or when a store
        /// opens and replays its pending files).
        Cut {
            cuts: &'c [usize],
            fresh: &'c [usize],
        },
    }

    fn write(conn: &mut Connection, facts: &[Fact<'static>], how: &Batches<'_>) {
        let mut rows = Rows::default();
        let bodies: Vec<String> = facts
            .iter()
            .map(|f| format!("{{\"seq\":{}}}", f.seq))
            .collect();
        let batches: Vec<(usize, usize)> = match how {
            Batches::AsEventsCome => (0..facts.len()).map(|i| (i, i + 1)).collect(),
            Batches::Cut { cuts, .. } => {
                let mut from = 0;
                cuts.iter()
                    .copied()
                    .chain([facts.len()])
                    .map(|to| {
                        let to = to.clamp(from, facts.len());
                        let batch = (from, to);
                        from = to;
                        batch
                    })
                    .collect()
            }
        };
        for (n, (from, to)) in batches.into_iter().enumerate() {
            if let Batches::Cut { fresh, .. } = how
                && fresh.contains(&n)
            {
                rows = Rows::default();
            }
            let batch: Vec<(Fact<'_>, &str)> = facts[from..to]
                .iter()
                .zip(&bodies[from..to])
                .map(|(f, b)| (f.clone(), b.as_str()))
                .collect();
            let tx = conn.transaction().unwrap();
            let mut writes = Writes::new(&tx);
            match how {
                Batches::AsEventsCome => {
                    let none = Ends {
                        turns: HashMap::new(),
                        calls: HashMap::new(),
                    };
                    for (fact, body) in &batch {
                        apply(&mut writes, &mut rows, &none, fact, body).unwrap();
                    }
                }
                Batches::Cut { .. } => apply_batch(&mut writes, &mut rows, &batch).unwrap(),
            }
            drop(writes);
            tx.commit().unwrap();
        }
    }

    /// The rows of every table. `mark_rows`: with the row ids each minute's mark holds (a writer
    /// that starts with nothing remembered does not know the last row ids, and marks a minute
    /// whose first event has no call with row 1: a lower bound, which only makes pruning more
    /// cautious).
    fn tables(conn: &Connection, mark_rows: bool) -> Vec<String> {
        let mut out = Vec::new();
        let marks = if mark_rows {
            "SELECT minute, seq, call_row, turn_row FROM marks ORDER BY minute"
        } else {
            "SELECT minute, seq FROM marks ORDER BY minute"
        };
        for sql in [
            "SELECT id, turn_id, session_id, parent_turn_id, started_at, ended_at, outcome, \
             start_seq, end_seq, principal FROM turns ORDER BY id",
            "SELECT id, turn_row, turn_id, call_id, session_id, tool, status, started_at, \
             ended_at, duration_ms, attempts, ran, principal FROM calls ORDER BY id",
            "SELECT seq, ts, type, turn_row, call_row, body FROM events ORDER BY seq",
            marks,
            "SELECT turns.id FROM turns INDEXED BY turns_open WHERE ended_at IS NULL ORDER BY id",
        ] {
            out.push(format!("-- {sql}"));
            let mut statement = conn.prepare(sql).unwrap();
            let n = statement.column_count();
            let rows = statement
                .query_map([], |r| {
                    (0..n)
                        .map(|i| {
                            r.get::<_, rusqlite::types::Value>(i)
                                .map(|v| format!("{v:?}"))
                        })
                        .collect::<Result<Vec<_>, _>>()
                })
                .unwrap();
            for row in rows {
                out.push(row.unwrap().join("|"));
            }
        }
        out
    }

    proptest! {
        /// Whatever the batches, the rows are those of writing each event as it comes, with no
        /// turn or call written whole.
        #[test]
        fn rows_do_not_depend_on_how_events_are_batched(
            events in proptest::collection::vec((0u8..6, 0u8..2, 0u8..2), 1..40),
            cuts in proptest::collection::vec(0usize..40, 0..4),
            fresh in proptest::collection::vec(0usize..5, 0..3),
        ) {
            let facts: Vec<Fact<'static>> = events
                .iter()
                .enumerate()
                .map(|(i, e)| fact(i as u64 + 1, *e))
                .collect();
            let mut cuts = cuts;
            cuts.sort_unstable();
            let mut as_they_come = store();
            write(&mut as_they_come, &facts, &Batches::AsEventsCome);
            let mut batched = store();
            write(&mut batched, &facts, &Batches::Cut { cuts: &cuts, fresh: &fresh });
            let mark_rows = fresh.is_empty();
            prop_assert_eq!(tables(&batched, mark_rows), tables(&as_they_come, mark_rows));
        }
    }

    /// A turn of one call that starts and ends in one batch: its rows are written whole, with no
    /// `UPDATE` at their ends, and read as ended.
    #[test]
    fn a_turn_and_call_that_end_in_their_batch_are_written_whole() {
        let facts = [
            fact(1, (0, 0, 0)),
            fact(2, (2, 0, 0)),
            fact(3, (3, 0, 0)),
            fact(4, (1, 0, 0)),
        ];
        let mut conn = store();
        let before = conn.total_changes();
        write(
            &mut conn,
            &facts,
            &Batches::Cut {
                cuts: &[],
                fresh: &[],
            },
        );
        // A turn, a call, four events, and the mark of the second minute (the events' times are
        // 21, 41, 61 and 81 s).
        assert_eq!(conn.total_changes() - before, 7);
        let (ended, outcome): (Option<i64>, Option<String>) = conn
            .query_row("SELECT ended_at, outcome FROM turns", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .unwrap();
        assert_eq!(
            (ended, outcome.as_deref()),
            (Some(81_000), Some("completed"))
        );
        let (status, ran): (Option<String>, bool) = conn
            .query_row("SELECT status, ran FROM calls", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .unwrap();
        assert_eq!((status.as_deref(), ran), (Some("error"), true));
        // Written event by event, the same history changes two rows more (the two ends).
        let mut by_event = store();
        let before = by_event.total_changes();
        write(&mut by_event, &facts, &Batches::AsEventsCome);
        assert_eq!(by_event.total_changes() - before, 7 + 2);
    }
}
