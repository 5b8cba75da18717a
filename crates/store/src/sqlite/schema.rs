//! The schema and its migrations. `PRAGMA user_version` is the schema's version; each migration
//! takes it one step up, in a transaction of its own, when a store opens. A database whose version
//! is newer than [`LATEST`] was written by a newer toolwarden and is refused untouched.

use rusqlite::Connection;

/// The schema version this build writes.
pub const LATEST: u32 = MIGRATIONS.len() as u32;

/// Migration `n` (from 1) takes the schema from version `n - 1` to `n`.
const MIGRATIONS: &[&str] = &[
    // 1: events, the turns and calls they belong to, and a time index by the minute.
    "
    CREATE TABLE turns (
        id INTEGER PRIMARY KEY,
        turn_id TEXT NOT NULL UNIQUE,
        session_id TEXT,
        parent_turn_id TEXT,
        started_at INTEGER NOT NULL,
        ended_at INTEGER,
        outcome TEXT,
        start_seq INTEGER,
        end_seq INTEGER
    );
    CREATE INDEX turns_session ON turns(session_id);
    CREATE INDEX turns_open ON turns(id) WHERE ended_at IS NULL;

    CREATE TABLE calls (
        id INTEGER PRIMARY KEY,
        turn_row INTEGER NOT NULL,
        turn_id TEXT NOT NULL,
        call_id TEXT NOT NULL,
        session_id TEXT,
        tool TEXT,
        status TEXT,
        started_at INTEGER NOT NULL,
        ended_at INTEGER,
        duration_ms INTEGER,
        attempts INTEGER,
        ran INTEGER NOT NULL DEFAULT 0
    );
    CREATE UNIQUE INDEX calls_of_turn ON calls(turn_row, call_id);
    CREATE INDEX calls_tool ON calls(tool, id);
    CREATE INDEX calls_status ON calls(status, id);

    CREATE TABLE events (
        seq INTEGER PRIMARY KEY,
        ts INTEGER NOT NULL,
        type TEXT NOT NULL,
        turn_row INTEGER,
        call_row INTEGER,
        body TEXT NOT NULL
    );
    CREATE INDEX events_turn ON events(turn_row) WHERE turn_row IS NOT NULL;
    CREATE INDEX events_call ON events(call_row) WHERE call_row IS NOT NULL;

    -- The first event, call and turn of each minute: `since` and retention find their place
    -- here instead of in an index on every event's time.
    CREATE TABLE marks (
        minute INTEGER PRIMARY KEY,
        seq INTEGER NOT NULL,
        call_row INTEGER NOT NULL,
        turn_row INTEGER NOT NULL
    );
    ",
    // 2: tasks toward MCP clients: a call answered with a task id; its status is its turn's.
    "
    CREATE TABLE tasks (
        task_id TEXT PRIMARY KEY,
        turn_id TEXT NOT NULL,
        call_id TEXT NOT NULL,
        session_id TEXT,
        tool TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        ttl_ms INTEGER NOT NULL,
        poll_interval_ms INTEGER NOT NULL
    );
    CREATE INDEX tasks_turn ON tasks(turn_id);
    ",
    // 3: who made each turn, call and task; records made before principals existed are
    // `local`'s (adding a column with a constant default rewrites no row).
    "
    ALTER TABLE turns ADD COLUMN principal TEXT NOT NULL DEFAULT 'local';
    ALTER TABLE calls ADD COLUMN principal TEXT NOT NULL DEFAULT 'local';
    ALTER TABLE tasks ADD COLUMN principal TEXT NOT NULL DEFAULT 'local';
    CREATE INDEX turns_principal ON turns(principal, id);
    CREATE INDEX calls_principal ON calls(principal, id);
    ",
];

/// Why the schema cannot be used.
#[derive(Debug)]
pub(crate) enum SqliteSchemaError {
    /// Written by a newer toolwarden.
    Newer(u32),
    /// Tables of something else, not a toolwarden audit trail.
    Foreign,
    /// SQLite failed.
    Sqlite(rusqlite::Error),
}

impl From<rusqlite::Error> for SqliteSchemaError {
    fn from(e: rusqlite::Error) -> Self {
        SqliteSchemaError::Sqlite(e)
    }
}

/// The schema's version; refuses a newer one and a database of something else. Writes nothing.
pub(crate) fn check(conn: &Connection) -> Result<u32, SqliteSchemaError> {
    let version: u32 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version > LATEST {
        return Err(SqliteSchemaError::Newer(version));
    }
    if version == 0 {
        let tables: u32 = conn.query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'",
            [],
            |r| r.get(0),
        )?;
        if tables > 0 {
            return Err(SqliteSchemaError::Foreign);
        }
    }
    Ok(version)
}

/// Runs the migrations from `version` up to [`LATEST`].
pub(crate) fn migrate(conn: &mut Connection, version: u32) -> Result<(), rusqlite::Error> {
    for (n, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", n as u32 + 1)?;
        tx.commit()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AuditReader, TrailReader};

    /// A trail written before principals (schema 2) is migrated when read, and its rows are
    /// `local`'s.
    #[test]
    fn a_trail_from_before_principals_reads_as_local() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.db");
        let mut conn = Connection::open(&path).unwrap();
        for sql in &MIGRATIONS[..2] {
            conn.execute_batch(sql).unwrap();
        }
        conn.pragma_update(None, "user_version", 2).unwrap();
        let tx = conn.transaction().unwrap();
        tx.execute_batch(
            "INSERT INTO turns (id, turn_id, session_id, started_at, ended_at, outcome) \
             VALUES (1, 't_old', 's1', 1000, 2000, 'ok');
             INSERT INTO calls (id, turn_row, turn_id, call_id, session_id, tool, status, \
             started_at, ended_at, duration_ms, attempts, ran) \
             VALUES (1, 1, 't_old', 'c1', 's1', 'echo', 'ok', 1000, 2000, 1000, 1, 1);
             INSERT INTO events (seq, ts, type, turn_row, call_row, body) \
             VALUES (1, 1000, 'turn_start', 1, NULL, '{\"type\":\"turn_start\"}');
             INSERT INTO tasks (task_id, turn_id, call_id, session_id, tool, created_at, \
             ttl_ms, poll_interval_ms) VALUES ('k1', 't_old', 'c1', 's1', 'echo', 1000, 60000, 1000);",
        )
        .unwrap();
        tx.commit().unwrap();
        drop(conn);

        crate::assert_reads_as_local(&TrailReader::Sqlite(AuditReader::open(&path).unwrap()));

        let conn = Connection::open(&path).unwrap();
        let version: u32 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, LATEST);
        let task: String = conn
            .query_row(
                "SELECT principal FROM tasks WHERE task_id = 'k1'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(task, "local");
    }
}
