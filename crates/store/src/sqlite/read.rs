//! Reading the trail: pages of events and calls, and a turn's record. Plain functions over a
//! connection, shared by the store's readers and by `toolwarden audit`, which opens the database
//! read-only.

use crate::trail::{RUNNING, TurnRow};
use rusqlite::types::Value as Sql;
use rusqlite::{Connection, OptionalExtension as _, params, params_from_iter};
use serde_json::value::RawValue;
use toolwarden_protocol::{
    AuditCall, AuditEvent, AuditPage, AuditQuery, CallsPage, Timestamp, TurnId, TurnRecord,
};

fn event(seq: i64, kind: String, body: String) -> rusqlite::Result<AuditEvent> {
    let body = RawValue::from_string(body).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(5, rusqlite::types::Type::Text, Box::new(e))
    })?;
    Ok(AuditEvent {
        seq: seq as u64,
        kind,
        body,
    })
}

/// The first `seq` that may be at or after `since` (from the minute marks).
fn seq_since(conn: &Connection, since: Timestamp) -> rusqlite::Result<(i64, i64)> {
    let minute = since.unix_millis().div_euclid(60_000);
    Ok(conn
        .prepare_cached(
            "SELECT seq, call_row FROM marks WHERE minute <= ?1 ORDER BY minute DESC LIMIT 1",
        )?
        .query_row([minute], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?
        .unwrap_or((0, 0)))
}

/// The call filters as a condition on `calls` (alias `c`), with their parameters.
fn call_conditions(q: &AuditQuery, sql: &mut String, args: &mut Vec<Sql>) {
    if let Some(turn) = &q.turn {
        // Through the turn's row: `calls` is indexed by it, not by the turn's id.
        sql.push_str(" AND c.turn_row = (SELECT id FROM turns WHERE turn_id = ?)");
        args.push(Sql::Text(turn.as_str().to_owned()));
    }
    if let Some(call) = &q.call {
        sql.push_str(" AND c.call_id = ?");
        args.push(Sql::Text(call.as_str().to_owned()));
    }
    if let Some(tool) = &q.tool {
        sql.push_str(" AND c.tool = ?");
        args.push(Sql::Text(tool.clone()));
    }
    match q.status.as_deref() {
        Some(RUNNING) => sql.push_str(" AND c.status IS NULL"),
        Some(status) => {
            sql.push_str(" AND c.status = ?");
            args.push(Sql::Text(status.to_owned()));
        }
        None => {}
    }
}

/// A page of events, ascending `seq`.
pub(crate) fn events(conn: &Connection, q: &AuditQuery) -> rusqlite::Result<AuditPage> {
    let limit = q.page_size();
    let mut sql = String::from("SELECT seq, type, body FROM events WHERE seq > ?");
    let mut args: Vec<Sql> = vec![Sql::Integer(q.after.unwrap_or(0) as i64)];
    if let Some(turn) = &q.turn {
        sql.push_str(" AND turn_row = (SELECT id FROM turns WHERE turn_id = ?)");
        args.push(Sql::Text(turn.as_str().to_owned()));
    }
    if let Some(session) = &q.session {
        sql.push_str(" AND turn_row IN (SELECT id FROM turns WHERE session_id = ?)");
        args.push(Sql::Text(session.as_str().to_owned()));
    }
    if let Some(principal) = &q.principal {
        sql.push_str(if q.with_unattributed {
            " AND (turn_row IS NULL OR turn_row IN (SELECT id FROM turns WHERE principal = ?))"
        } else {
            " AND turn_row IN (SELECT id FROM turns WHERE principal = ?)"
        });
        args.push(Sql::Text(principal.clone()));
    }
    if q.filters_calls() {
        sql.push_str(" AND call_row IN (SELECT c.id FROM calls c WHERE 1");
        call_conditions(q, &mut sql, &mut args);
        sql.push(')');
    }
    if let Some(kind) = &q.kind {
        sql.push_str(" AND type = ?");
        args.push(Sql::Text(kind.clone()));
    }
    if let Some(since) = q.since {
        let (seq, _) = seq_since(conn, since)?;
        sql.push_str(" AND seq >= ? AND ts >= ?");
        args.push(Sql::Integer(seq));
        args.push(Sql::Integer(since.unix_millis()));
    }
    sql.push_str(" ORDER BY seq LIMIT ?");
    args.push(Sql::Integer(i64::from(limit) + 1));
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut events = stmt
        .query_map(params_from_iter(args), |r| {
            event(r.get(0)?, r.get(1)?, r.get(2)?)
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let more = events.len() > limit as usize;
    events.truncate(limit as usize);
    let next = if more {
        events.last().map(|e| e.seq)
    } else {
        None
    };
    Ok(AuditPage { events, next })
}

/// A page of calls, newest first, each with its events.
pub(crate) fn calls(conn: &Connection, q: &AuditQuery) -> rusqlite::Result<CallsPage> {
    let limit = q.page_size();
    let mut sql = String::from(
        "SELECT c.id, c.call_id, c.turn_id, c.session_id, c.tool, c.status, c.started_at, \
         c.ended_at, c.duration_ms, c.attempts, c.principal FROM calls c WHERE 1",
    );
    let mut args: Vec<Sql> = Vec::new();
    if let Some(cursor) = q.cursor {
        sql.push_str(" AND c.id < ?");
        args.push(Sql::Integer(cursor as i64));
    }
    if let Some(session) = &q.session {
        sql.push_str(" AND c.turn_row IN (SELECT id FROM turns WHERE session_id = ?)");
        args.push(Sql::Text(session.as_str().to_owned()));
    }
    if let Some(principal) = &q.principal {
        sql.push_str(" AND c.principal = ?");
        args.push(Sql::Text(principal.clone()));
    }
    call_conditions(q, &mut sql, &mut args);
    if let Some(kind) = &q.kind {
        sql.push_str(" AND EXISTS (SELECT 1 FROM events e WHERE e.call_row = c.id AND e.type = ?)");
        args.push(Sql::Text(kind.clone()));
    }
    if let Some(since) = q.since {
        let (_, call_row) = seq_since(conn, since)?;
        sql.push_str(" AND c.id >= ? AND c.started_at >= ?");
        args.push(Sql::Integer(call_row));
        args.push(Sql::Integer(since.unix_millis()));
    }
    if let Some(after) = q.after {
        // Calls whose events go on after this seq: what a follower has not seen yet.
        sql.push_str(" AND EXISTS (SELECT 1 FROM events e WHERE e.call_row = c.id AND e.seq > ?)");
        args.push(Sql::Integer(after as i64));
    }
    sql.push_str(" ORDER BY c.id DESC LIMIT ?");
    args.push(Sql::Integer(i64::from(limit) + 1));
    let mut stmt = conn.prepare_cached(&sql)?;
    let rows = stmt
        .query_map(params_from_iter(args), |r| {
            Ok((
                r.get::<_, i64>(0)?,
                AuditCall {
                    call_id: r.get::<_, String>(1)?.into(),
                    turn_id: r.get::<_, String>(2)?.into(),
                    principal: r.get(10)?,
                    session_id: r.get::<_, Option<String>>(3)?.map(Into::into),
                    tool: r.get(4)?,
                    status: r.get(5)?,
                    started_at: Timestamp::from_unix_millis(r.get(6)?),
                    ended_at: r.get::<_, Option<i64>>(7)?.map(Timestamp::from_unix_millis),
                    duration_ms: r.get::<_, Option<i64>>(8)?.map(|d| d as u64),
                    attempts: r.get(9)?,
                    events: Vec::new(),
                },
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let more = rows.len() > limit as usize;
    let mut calls = Vec::with_capacity(rows.len());
    let mut next = None;
    let mut of_call =
        conn.prepare_cached("SELECT seq, type, body FROM events WHERE call_row = ?1 ORDER BY seq")?;
    for (row, mut call) in rows.into_iter().take(limit as usize) {
        call.events = of_call
            .query_map([row], |r| event(r.get(0)?, r.get(1)?, r.get(2)?))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        next = Some(row as u64);
        calls.push(call);
    }
    Ok(CallsPage {
        calls,
        next: if more { next } else { None },
    })
}

/// A turn's record; `None` when the trail does not know it.
pub(crate) fn turn(conn: &Connection, turn_id: &TurnId) -> rusqlite::Result<Option<TurnRecord>> {
    let found = conn
        .prepare_cached(
            "SELECT t.session_id, t.started_at, t.ended_at, t.outcome, e.body, t.principal \
             FROM turns t \
             LEFT JOIN events e ON e.seq = t.end_seq WHERE t.turn_id = ?1",
        )?
        .query_row([turn_id.as_str()], |r| {
            Ok(TurnRow {
                session_id: r.get(0)?,
                started_at: r.get(1)?,
                ended_at: r.get(2)?,
                outcome: r.get(3)?,
                end: r.get(4)?,
                principal: r.get(5)?,
            })
        })
        .optional()?;
    Ok(found.map(|row| row.into_record(turn_id)))
}

/// The highest `seq` stored (0 when empty).
pub(crate) fn last_seq(conn: &Connection) -> rusqlite::Result<u64> {
    conn.query_row("SELECT coalesce(max(seq), 0) FROM events", params![], |r| {
        r.get::<_, i64>(0)
    })
    .map(|s| s as u64)
}
