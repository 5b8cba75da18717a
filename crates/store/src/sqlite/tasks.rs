//! Tasks toward MCP clients in the SQLite trail: one row per task, naming the turn that runs
//! its call (the turn's rows say how it went). A task is deleted once its turn ended more than
//! its `ttl_ms` ago.

use rusqlite::{Connection, OptionalExtension as _, params};
use toolwarden_protocol::{CallId, SessionId, TaskRecord, Timestamp, TurnId};

/// Writes `task` (replacing a row of the same id).
pub(crate) fn write(conn: &Connection, task: &TaskRecord) -> rusqlite::Result<()> {
    conn.execute(
        "INSERT OR REPLACE INTO tasks \
         (task_id, turn_id, call_id, session_id, tool, created_at, ttl_ms, poll_interval_ms, \
         principal) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        params![
            task.task_id,
            task.turn_id.as_str(),
            task.call_id.as_str(),
            task.session_id.as_ref().map(SessionId::as_str),
            task.tool,
            task.created_at.unix_millis(),
            i64::try_from(task.ttl_ms).unwrap_or(i64::MAX),
            i64::try_from(task.poll_interval_ms).unwrap_or(i64::MAX),
            task.principal,
        ],
    )?;
    Ok(())
}

/// The task of that id.
pub(crate) fn read(conn: &Connection, task_id: &str) -> rusqlite::Result<Option<TaskRecord>> {
    conn.prepare_cached(
        "SELECT task_id, turn_id, call_id, session_id, tool, created_at, ttl_ms, poll_interval_ms, \
         principal FROM tasks WHERE task_id = ?1",
    )?
    .query_row([task_id], |r| {
        Ok(TaskRecord {
            task_id: r.get(0)?,
            turn_id: TurnId::from(r.get::<_, String>(1)?.as_str()),
            call_id: CallId::from(r.get::<_, String>(2)?.as_str()),
            session_id: r
                .get::<_, Option<String>>(3)?
                .map(|s| SessionId::from(s.as_str())),
            tool: r.get(4)?,
            created_at: Timestamp::from_unix_millis(r.get(5)?),
            ttl_ms: r.get::<_, i64>(6)?.max(0) as u64,
            poll_interval_ms: r.get::<_, i64>(7)?.max(0) as u64,
            principal: r.get(8)?,
        })
    })
    .optional()
}

/// Deletes the tasks whose turn ended `ttl_ms` or more before `now`, and those whose turn is
/// not in the trail (pruned by `retain`, or never recorded) a day after they would have expired.
pub(crate) fn prune(conn: &Connection, now: Timestamp) -> rusqlite::Result<()> {
    conn.execute(
        "DELETE FROM tasks WHERE task_id IN (SELECT t.task_id FROM tasks t \
         LEFT JOIN turns u ON u.turn_id = t.turn_id \
         WHERE (u.ended_at IS NOT NULL AND u.ended_at + t.ttl_ms <= ?1) \
            OR (u.turn_id IS NULL AND t.created_at + t.ttl_ms + ?2 <= ?1))",
        [now.unix_millis(), crate::trail::ORPHAN_GRACE_MS],
    )?;
    Ok(())
}
