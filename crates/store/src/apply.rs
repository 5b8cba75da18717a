//! Writing events: each event is one row of `events`, and keeps `turns` and `calls` (one row per
//! turn and per call, with its outcome) up to date, so that filtered reads never scan events.

use std::collections::HashMap;

use rusqlite::{OptionalExtension as _, Transaction, params};
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

/// One event, serialized and redacted, ready to write.
pub(crate) struct Prepared<'a> {
    pub(crate) event: &'a Event,
    pub(crate) body: String,
}

/// Writes one event and what it changes in `turns` and `calls`.
pub(crate) fn apply(
    tx: &Transaction<'_>,
    rows: &mut Rows,
    item: &Prepared<'_>,
) -> rusqlite::Result<()> {
    let event = item.event;
    let ts = event.ts.unix_millis();
    let turn_row = match &event.scope.turn_id {
        Some(turn_id) => Some(turn_row(tx, rows, event, turn_id.as_str(), ts)?),
        None => None,
    };
    let call_row = match (&event.scope.call_id, turn_row) {
        (Some(call_id), Some(turn_row)) => {
            Some(call_row(tx, rows, event, turn_row, call_id.as_str(), ts)?)
        }
        _ => None,
    };
    match &event.kind {
        EventKind::TurnEnd { outcome, .. } => {
            if let Some(row) = turn_row {
                tx.prepare_cached(
                    "UPDATE turns SET ended_at = ?1, outcome = ?2, end_seq = ?3 WHERE id = ?4",
                )?
                .execute(params![ts, outcome.as_ref(), event.seq as i64, row])?;
            }
            if let Some(turn_id) = &event.scope.turn_id {
                rows.turns.remove(turn_id.as_str());
            }
        }
        EventKind::ToolResult { result, .. } => {
            if let Some(row) = call_row {
                let outcome = &result.outcome;
                tx.prepare_cached(
                    "UPDATE calls SET status = ?1, ended_at = ?2, duration_ms = ?3, attempts = ?4 \
                     WHERE id = ?5",
                )?
                .execute(params![
                    outcome.status.name(),
                    ts,
                    outcome.duration_ms as i64,
                    outcome.attempts,
                    row
                ])?;
                if let (Some(turn_row), Some(call_id)) = (turn_row, &event.scope.call_id) {
                    rows.calls.remove(&(turn_row, call_id.as_str().to_owned()));
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
            event.seq as i64,
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
        event.seq as i64,
        ts,
        event.kind.name(),
        turn_row,
        call_row,
        item.body
    ])?;
    Ok(())
}

fn turn_row(
    tx: &Transaction<'_>,
    rows: &mut Rows,
    event: &Event,
    turn_id: &str,
    ts: i64,
) -> rusqlite::Result<i64> {
    if let EventKind::TurnStart { parent_turn_id, .. } = &event.kind {
        // A plain insert, not an upsert returning the row: SQLite runs an upsert with a
        // statement journal and its `RETURNING` through a table of its own, at every turn.
        let inserted = tx
            .prepare_cached(
                "INSERT OR IGNORE INTO turns (turn_id, session_id, parent_turn_id, started_at, \
                 start_seq) VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute(params![
                turn_id,
                event.scope.session_id.as_ref().map(|s| s.as_str()),
                parent_turn_id.as_ref().map(|p| p.as_str()),
                ts,
                event.seq as i64
            ])?;
        let row: i64 = if inserted == 1 {
            tx.last_insert_rowid()
        } else {
            // A turn id used again (a caller may choose its turn ids) continues the same row.
            tx.prepare_cached(
                "UPDATE turns SET ended_at = NULL, outcome = NULL, end_seq = NULL, \
                 start_seq = ?2 WHERE turn_id = ?1 RETURNING id",
            )?
            .query_row(params![turn_id, event.seq as i64], |r| r.get(0))?
        };
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
            "INSERT INTO turns (turn_id, session_id, started_at) VALUES (?1, ?2, ?3) RETURNING id",
        )?
        .query_row(
            params![
                turn_id,
                event.scope.session_id.as_ref().map(|s| s.as_str()),
                ts
            ],
            |r| r.get(0),
        )?;
    rows.last_turn_row = rows.last_turn_row.max(row);
    Ok(row)
}

fn call_row(
    tx: &Transaction<'_>,
    rows: &mut Rows,
    event: &Event,
    turn_row: i64,
    call_id: &str,
    ts: i64,
) -> rusqlite::Result<i64> {
    let key = (turn_row, call_id.to_owned());
    let ran = matches!(event.kind, EventKind::ToolStart { .. });
    if let Some(row) = rows.calls.get(&key) {
        if ran {
            tx.prepare_cached("UPDATE calls SET ran = 1 WHERE id = ?1")?
                .execute([*row])?;
        }
        return Ok(*row);
    }
    let inserted = tx
        .prepare_cached(
            "INSERT OR IGNORE INTO calls (turn_row, turn_id, call_id, session_id, tool, \
             started_at, ran) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )?
        .execute(params![
            turn_row,
            event.scope.turn_id.as_ref().map(|t| t.as_str()),
            call_id,
            event.scope.session_id.as_ref().map(|s| s.as_str()),
            event.scope.tool.as_deref(),
            ts,
            ran
        ])?;
    let row: i64 = if inserted == 1 {
        tx.last_insert_rowid()
    } else {
        // A call of an ended call's turn and id (a late event), or of a turn used again.
        tx.prepare_cached(
            "UPDATE calls SET ran = max(ran, ?3) WHERE turn_row = ?1 AND call_id = ?2 RETURNING id",
        )?
        .query_row(params![turn_row, call_id, ran], |r| r.get(0))?
    };
    rows.last_call_row = rows.last_call_row.max(row);
    // Ended calls are not kept: their late events (`tool_stopped`) find them in the database.
    if !matches!(event.kind, EventKind::ToolResult { .. }) {
        rows.calls.insert(key, row);
    }
    Ok(row)
}
