//! Recovery on PostgreSQL, scoped to one replica: when a replica starts, the turns and calls that
//! *it* left open (it died: crash, `kill -9`, a lost machine) get their `interrupted` outcomes.
//! The rows of other replicas are never touched: they may be running those calls right now. A
//! replica that died stays unrecovered until it starts again with the same replica id.

use postgres::Client;
use toolwarden_protocol::Timestamp;

use super::write::PgWriter;
use crate::apply::Prepared;
use crate::recover::{OpenCall, OpenTurn, close_turns, listed_calls, merge_calls, stored_result};
use crate::redact::Redactor;
use crate::writer::TrailBackend as _;

/// Records the outcome of every call and turn `replica` left open; returns how many calls were
/// interrupted and this replica's last `seq` afterwards.
pub(crate) fn recover(
    client: &mut Client,
    writer: &mut PgWriter,
    replica: &str,
    redactor: &Redactor,
    now: Timestamp,
) -> Result<(usize, u64), String> {
    let err = |e: postgres::Error| e.to_string();
    let mut seq = super::read::last_seq(client, replica)?;
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
    let (events, interrupted) = close_turns(&mut seq, now, open);
    if !events.is_empty() {
        let items: Vec<Prepared<'_>> = events
            .iter()
            .map(|event| Prepared {
                event,
                body: redactor.body(event),
            })
            .collect();
        writer.write(&items)?;
    }
    Ok((interrupted, seq))
}
