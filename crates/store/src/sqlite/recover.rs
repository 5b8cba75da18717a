//! Recovery of an SQLite trail when it opens: what a process that died left open gets its
//! `interrupted` outcomes (the rules, shared with PostgreSQL, are in `crate::recover`).

use rusqlite::{Connection, params};
use toolwarden_protocol::Timestamp;

use super::apply::{Fact, Rows, Writes, apply_batch};
use crate::recover::{
    Interruption, OpenCall, OpenTurn, close_turns, listed_calls, merge_calls, stored_result,
};
use crate::redact::Redactor;

/// Records the outcome of every call and turn a dead process left open; returns how many calls
/// were interrupted.
pub(crate) fn recover(
    conn: &mut Connection,
    redactor: &Redactor,
    now: Timestamp,
) -> rusqlite::Result<usize> {
    let mut seq = super::read::last_seq(conn)?;
    type Row = (i64, String, Option<String>, Option<i64>, String);
    let turns: Vec<Row> = conn
        .prepare(
            "SELECT id, turn_id, session_id, start_seq, principal FROM turns \
             WHERE ended_at IS NULL ORDER BY id",
        )?
        .query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    let mut open = Vec::with_capacity(turns.len());
    for (turn_row, turn_id, session_id, start_seq, principal) in turns {
        let start: Option<String> = match start_seq {
            Some(start) => conn
                .prepare_cached("SELECT body FROM events WHERE seq = ?1")?
                .query_row([start], |r| r.get(0))
                .ok(),
            None => None,
        };
        let calls = open_calls(conn, turn_row, start.as_deref())?;
        open.push(OpenTurn {
            turn_id,
            principal,
            session_id,
            calls,
        });
    }
    let (events, interrupted) = close_turns(&mut seq, now, open, &Interruption::Restart);
    if events.is_empty() {
        return Ok(0);
    }
    let tx = conn.transaction()?;
    let mut rows = Rows::default();
    let mut writes = Writes::new(&tx);
    let bodies: Vec<String> = events.iter().map(|event| redactor.body(event)).collect();
    let batch: Vec<(Fact<'_>, &str)> = events
        .iter()
        .zip(&bodies)
        .map(|(event, body)| (Fact::of(event), body.as_str()))
        .collect();
    apply_batch(&mut writes, &mut rows, &batch)?;
    drop(writes);
    tx.commit()?;
    Ok(interrupted)
}

/// The calls of an open turn: those its `turn_start` listed, in order, then any other the trail
/// has a row for.
fn open_calls(
    conn: &Connection,
    turn_row: i64,
    start: Option<&str>,
) -> rusqlite::Result<Vec<OpenCall>> {
    let rows: Vec<OpenCall> = conn
        .prepare_cached(
            "SELECT c.call_id, c.tool, c.status, c.started_at, c.attempts, c.ran, \
             (SELECT body FROM events e WHERE e.call_row = c.id AND e.type = 'tool_result' \
              ORDER BY e.seq LIMIT 1) \
             FROM calls c WHERE c.turn_row = ?1 ORDER BY c.id",
        )?
        .query_map(params![turn_row], |r| {
            let status: Option<String> = r.get(2)?;
            let body: Option<String> = r.get(6)?;
            Ok(OpenCall {
                call_id: r.get(0)?,
                tool: r.get(1)?,
                result: status.and(body).and_then(|b| stored_result(&b)),
                started_at: r.get(3)?,
                attempts: r.get(4)?,
                ran: r.get::<_, i64>(5)? != 0,
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    Ok(merge_calls(listed_calls(start), rows))
}
