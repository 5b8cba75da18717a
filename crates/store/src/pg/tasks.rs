//! Tasks toward MCP clients in the PostgreSQL trail (as in SQLite: one row per task, naming the
//! turn that runs its call, deleted once that turn ended more than its `ttl_ms` ago). Any
//! replica reads any replica's task.

use postgres::Client;
use toolwarden_protocol::{CallId, SessionId, TaskRecord, Timestamp, TurnId};

/// Writes `task` (replacing a row of the same id).
pub(crate) fn write(
    client: &mut Client,
    replica: &str,
    task: &TaskRecord,
) -> Result<(), postgres::Error> {
    client.execute(
        "INSERT INTO toolwarden_tasks (task_id, replica, turn_id, call_id, session_id, tool, \
         created_at, ttl_ms, poll_interval_ms, principal) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
         ON CONFLICT (task_id) DO UPDATE SET replica = excluded.replica, \
         turn_id = excluded.turn_id, call_id = excluded.call_id, \
         session_id = excluded.session_id, tool = excluded.tool, \
         created_at = excluded.created_at, ttl_ms = excluded.ttl_ms, \
         poll_interval_ms = excluded.poll_interval_ms, principal = excluded.principal",
        &[
            &task.task_id,
            &replica,
            &task.turn_id.as_str(),
            &task.call_id.as_str(),
            &task.session_id.as_ref().map(SessionId::as_str),
            &task.tool,
            &task.created_at.unix_millis(),
            &i64::try_from(task.ttl_ms).unwrap_or(i64::MAX),
            &i64::try_from(task.poll_interval_ms).unwrap_or(i64::MAX),
            &task.principal,
        ],
    )?;
    Ok(())
}

/// The task of that id.
pub(crate) fn read(client: &mut Client, task_id: &str) -> Result<Option<TaskRecord>, String> {
    let row = client
        .query_opt(
            "SELECT task_id, turn_id, call_id, session_id, tool, created_at, ttl_ms, \
             poll_interval_ms, principal FROM toolwarden_tasks WHERE task_id = $1",
            &[&task_id],
        )
        .map_err(|e| e.to_string())?;
    Ok(row.map(|r| TaskRecord {
        task_id: r.get(0),
        turn_id: TurnId::from(r.get::<_, &str>(1)),
        call_id: CallId::from(r.get::<_, &str>(2)),
        session_id: r.get::<_, Option<&str>>(3).map(SessionId::from),
        tool: r.get(4),
        created_at: Timestamp::from_unix_millis(r.get(5)),
        ttl_ms: r.get::<_, i64>(6).max(0) as u64,
        poll_interval_ms: r.get::<_, i64>(7).max(0) as u64,
        principal: r.get(8),
    }))
}

/// Deletes the tasks whose turn ended `ttl_ms` or more before `now`.
pub(crate) fn prune(client: &mut Client, now: i64) -> Result<(), postgres::Error> {
    // As on SQLite (`sqlite::tasks::prune`): expired tasks, and those whose turn is not in the
    // trail a day after they would have expired.
    client.execute(
        "DELETE FROM toolwarden_tasks t WHERE EXISTS (SELECT 1 FROM toolwarden_turns u \
            WHERE u.turn_id = t.turn_id AND u.ended_at IS NOT NULL AND u.ended_at + t.ttl_ms <= $1) \
         OR (NOT EXISTS (SELECT 1 FROM toolwarden_turns u WHERE u.turn_id = t.turn_id) \
            AND t.created_at + t.ttl_ms + $2 <= $1)",
        &[&now, &crate::trail::ORPHAN_GRACE_MS],
    )?;
    Ok(())
}
