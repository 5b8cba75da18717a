//! Reading the PostgreSQL trail: pages of events and calls, and a turn's record, over every
//! replica's rows. Events are ordered by `pos` (the trail's commit order) and paged by it; a
//! process resuming its own event stream reads its own rows by `seq` instead.

use postgres::GenericClient;
use postgres::types::ToSql;
use serde_json::value::RawValue;
use toolwarden_protocol::{
    AuditCall, AuditEvent, AuditPage, AuditQuery, CallsPage, Timestamp, TurnId, TurnRecord,
};

use crate::recover::{OpenCall, OpenTurn, listed_calls, merge_calls, stored_result};
use crate::trail::{RUNNING, TurnRow};

use super::connect::describe;

type Param = Box<dyn ToSql + Sync + Send>;

/// A query's text and its parameters, numbered as they are added.
#[derive(Default)]
struct Sql {
    text: String,
    args: Vec<Param>,
}

impl Sql {
    fn new(text: &str) -> Self {
        Sql {
            text: text.to_owned(),
            args: Vec::new(),
        }
    }

    /// Appends `text`, whose `?` is the next parameter, `value`.
    fn bind(&mut self, text: &str, value: impl ToSql + Sync + Send + 'static) {
        self.args.push(Box::new(value));
        self.text
            .push_str(&text.replacen('?', &format!("${}", self.args.len()), 1));
    }

    fn push(&mut self, text: &str) {
        self.text.push_str(text);
    }

    fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        self.args
            .iter()
            .map(|a| a.as_ref() as &(dyn ToSql + Sync))
            .collect()
    }
}

fn event(seq: i64, kind: String, body: String) -> Result<AuditEvent, String> {
    let body =
        RawValue::from_string(body).map_err(|e| format!("a stored event is not JSON: {e}"))?;
    Ok(AuditEvent {
        seq: seq as u64,
        kind,
        body,
    })
}

/// The call filters as a condition on `toolwarden_calls` (alias `c`).
fn call_conditions(q: &AuditQuery, sql: &mut Sql) {
    if let Some(turn) = &q.turn {
        sql.bind(" AND c.turn_id = ?", turn.as_str().to_owned());
    }
    if let Some(call) = &q.call {
        sql.bind(" AND c.call_id = ?", call.as_str().to_owned());
    }
    if let Some(tool) = &q.tool {
        sql.bind(" AND c.tool = ?", tool.clone());
    }
    match q.status.as_deref() {
        Some(RUNNING) => sql.push(" AND c.status IS NULL"),
        Some(status) => sql.bind(" AND c.status = ?", status.to_owned()),
        None => {}
    }
}

/// A page of events: over every replica by `pos`, or (`q.own`) this replica's by `seq`.
pub(crate) fn events(
    client: &mut impl GenericClient,
    replica: &str,
    q: &AuditQuery,
) -> Result<AuditPage, String> {
    let limit = q.page_size();
    let order = if q.own { "seq" } else { "pos" };
    let mut sql = Sql::new(&format!(
        "SELECT {order}, seq, type, body FROM toolwarden_events WHERE {order} > "
    ));
    sql.bind("?", q.after.unwrap_or(0) as i64);
    if q.own {
        sql.bind(" AND replica = ?", replica.to_owned());
    }
    if let Some(turn) = &q.turn {
        sql.bind(" AND turn_id = ?", turn.as_str().to_owned());
    }
    if let Some(principal) = &q.principal {
        // Events written before principals existed name none: they are their turn's, whose
        // principal the migration made `local`.
        sql.bind(" AND (principal = ?", principal.clone());
        sql.bind(
            " OR (principal IS NULL AND turn_id IN \
             (SELECT turn_id FROM toolwarden_turns WHERE principal = ?))",
            principal.clone(),
        );
        if q.with_unattributed {
            sql.push(" OR (principal IS NULL AND turn_id IS NULL)");
        }
        sql.push(")");
    }
    if let Some(session) = &q.session {
        sql.bind(" AND session_id = ?", session.as_str().to_owned());
    }
    if q.filters_calls() {
        sql.push(
            " AND (turn_id, call_id) IN (SELECT c.turn_id, c.call_id FROM toolwarden_calls c \
             WHERE true",
        );
        call_conditions(q, &mut sql);
        sql.push(")");
    }
    if let Some(kind) = &q.kind {
        sql.bind(" AND type = ?", kind.clone());
    }
    if let Some(since) = q.since {
        sql.bind(" AND ts >= ?", since.unix_millis());
    }
    sql.bind(&format!(" ORDER BY {order} LIMIT ?"), i64::from(limit) + 1);
    let rows = client
        .query(sql.text.as_str(), &sql.params())
        .map_err(|e| e.to_string())?;
    let more = rows.len() > limit as usize;
    let mut events = Vec::with_capacity(rows.len().min(limit as usize));
    let mut next = None;
    for row in rows.into_iter().take(limit as usize) {
        next = Some(row.get::<_, i64>(0) as u64);
        events.push(event(row.get(1), row.get(2), row.get(3))?);
    }
    Ok(AuditPage {
        events,
        next: if more { next } else { None },
    })
}

/// A page of calls of every replica, newest first, each with its events.
pub(crate) fn calls(client: &mut impl GenericClient, q: &AuditQuery) -> Result<CallsPage, String> {
    let limit = q.page_size();
    let mut sql = Sql::new(
        "SELECT c.id, c.call_id, c.turn_id, c.session_id, c.tool, c.status, c.started_at, \
         c.ended_at, c.duration_ms, c.attempts, c.principal FROM toolwarden_calls c WHERE true",
    );
    if let Some(cursor) = q.cursor {
        sql.bind(" AND c.id < ?", cursor as i64);
    }
    if let Some(principal) = &q.principal {
        sql.bind(" AND c.principal = ?", principal.clone());
    }
    if let Some(session) = &q.session {
        sql.bind(" AND c.session_id = ?", session.as_str().to_owned());
    }
    call_conditions(q, &mut sql);
    let of_call = " AND EXISTS (SELECT 1 FROM toolwarden_events e WHERE e.turn_id = c.turn_id \
                   AND e.call_id = c.call_id";
    if let Some(kind) = &q.kind {
        sql.push(of_call);
        sql.bind(" AND e.type = ?)", kind.clone());
    }
    if let Some(since) = q.since {
        sql.bind(" AND c.started_at >= ?", since.unix_millis());
    }
    if let Some(after) = q.after {
        // Calls whose events go on after this position: what a follower has not seen yet.
        sql.push(of_call);
        sql.bind(" AND e.pos > ?)", after as i64);
    }
    sql.bind(" ORDER BY c.id DESC LIMIT ?", i64::from(limit) + 1);
    let rows = client
        .query(sql.text.as_str(), &sql.params())
        .map_err(|e| e.to_string())?;
    let more = rows.len() > limit as usize;
    let of_call = client
        .prepare(
            "SELECT seq, type, body FROM toolwarden_events WHERE turn_id = $1 AND call_id = $2 \
             ORDER BY pos",
        )
        .map_err(|e| e.to_string())?;
    let mut calls = Vec::with_capacity(rows.len());
    let mut next = None;
    for row in rows.into_iter().take(limit as usize) {
        let id: i64 = row.get(0);
        let call_id: String = row.get(1);
        let turn_id: String = row.get(2);
        let events = client
            .query(&of_call, &[&turn_id, &call_id])
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|r| event(r.get(0), r.get(1), r.get(2)))
            .collect::<Result<Vec<_>, _>>()?;
        calls.push(AuditCall {
            call_id: call_id.into(),
            turn_id: turn_id.into(),
            principal: row.get(10),
            session_id: row.get::<_, Option<String>>(3).map(Into::into),
            tool: row.get(4),
            status: row.get(5),
            started_at: Timestamp::from_unix_millis(row.get(6)),
            ended_at: row
                .get::<_, Option<i64>>(7)
                .map(Timestamp::from_unix_millis),
            duration_ms: row.get::<_, Option<i64>>(8).map(|d| d as u64),
            attempts: row.get::<_, Option<i64>>(9).map(|a| a as u32),
            events,
        });
        next = Some(id as u64);
    }
    Ok(CallsPage {
        calls,
        next: if more { next } else { None },
    })
}

/// A turn's record; `None` when the trail does not know it.
pub(crate) fn turn(
    client: &mut impl GenericClient,
    turn_id: &TurnId,
) -> Result<Option<TurnRecord>, String> {
    let found = client
        .query_opt(
            "SELECT t.session_id, t.started_at, t.ended_at, t.outcome, e.body, t.principal \
             FROM toolwarden_turns t LEFT JOIN toolwarden_events e \
             ON e.replica = t.end_replica AND e.seq = t.end_seq WHERE t.turn_id = $1",
            &[&turn_id.as_str()],
        )
        .map_err(|e| e.to_string())?;
    Ok(found.map(|row| {
        TurnRow {
            session_id: row.get(0),
            started_at: row.get(1),
            ended_at: row.get(2),
            outcome: row.get(3),
            end: row.get(4),
            principal: row.get(5),
        }
        .into_record(turn_id)
    }))
}

/// The highest `seq` this replica wrote (0 when none).
pub(crate) fn last_seq(client: &mut impl GenericClient, replica: &str) -> Result<u64, String> {
    client
        .query_one(
            "SELECT coalesce(max(seq), 0) FROM toolwarden_events WHERE replica = $1",
            &[&replica],
        )
        .map(|r| r.get::<_, i64>(0) as u64)
        .map_err(|e| e.to_string())
}

/// The trail's last position over every replica (0 when empty): where a follower goes on from.
pub(crate) fn last_pos(client: &mut impl GenericClient) -> Result<u64, String> {
    client
        .query_one("SELECT coalesce(max(pos), 0) FROM toolwarden_events", &[])
        .map(|r| r.get::<_, i64>(0) as u64)
        .map_err(|e| e.to_string())
}

/// The turns `replica` started and did not end, each with its calls (those with an outcome
/// carry it, for the turn's `turn_end`).
pub(crate) fn open_turns(
    client: &mut impl GenericClient,
    replica: &str,
) -> Result<Vec<OpenTurn>, String> {
    let err = |e: postgres::Error| describe(&e);
    let turns = client
        .query(
            "SELECT t.turn_id, t.session_id, e.body, t.principal FROM toolwarden_turns t \
             LEFT JOIN toolwarden_events e ON e.replica = t.replica AND e.seq = t.start_seq \
             WHERE t.replica = $1 AND t.ended_at IS NULL ORDER BY t.id",
            &[&replica],
        )
        .map_err(err)?;
    let of_turn = client
        .prepare(
            "SELECT c.call_id, c.tool, c.status, c.started_at, c.attempts, c.ran, \
             (SELECT body FROM toolwarden_events e WHERE e.turn_id = c.turn_id \
              AND e.call_id = c.call_id AND e.type = 'tool_result' ORDER BY e.pos LIMIT 1) \
             FROM toolwarden_calls c WHERE c.turn_id = $1 ORDER BY c.id",
        )
        .map_err(err)?;
    let mut open = Vec::with_capacity(turns.len());
    for turn in turns {
        let turn_id: String = turn.get(0);
        let start: Option<String> = turn.get(2);
        let rows = client
            .query(&of_turn, &[&turn_id])
            .map_err(err)?
            .into_iter()
            .map(|r| {
                let status: Option<String> = r.get(2);
                let body: Option<String> = r.get(6);
                OpenCall {
                    call_id: r.get(0),
                    tool: r.get(1),
                    result: status.and(body).and_then(|b| stored_result(&b)),
                    started_at: r.get(3),
                    attempts: r.get::<_, Option<i64>>(4).map(|a| a as u32),
                    ran: r.get(5),
                }
            })
            .collect();
        open.push(OpenTurn {
            turn_id,
            principal: turn.get(3),
            session_id: turn.get(1),
            calls: merge_calls(listed_calls(start.as_deref()), rows),
        });
    }
    Ok(open)
}
