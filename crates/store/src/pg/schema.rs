//! The PostgreSQL schema and its migrations. `toolwarden_schema` holds the schema's version; each
//! migration takes it one step up, in one transaction, while holding a lock that makes replicas
//! starting together migrate one after another. A database whose version is newer than
//! [`LATEST`] was written by a newer toolwarden and is refused untouched.
//!
//! Every table's name starts with `toolwarden_`, so the trail can share a database (or a schema)
//! with other things.

use postgres::Client;

/// The schema version this build writes.
pub const LATEST: u32 = MIGRATIONS.len() as u32;

/// Migration `n` (from 1) takes the schema from version `n - 1` to `n`.
const MIGRATIONS: &[&str] = &[
    // 1: events, the turns and calls they belong to, each with the replica that wrote it.
    "
    CREATE TABLE toolwarden_turns (
        id BIGSERIAL PRIMARY KEY,
        replica TEXT NOT NULL,
        turn_id TEXT NOT NULL UNIQUE,
        session_id TEXT,
        parent_turn_id TEXT,
        started_at BIGINT NOT NULL,
        ended_at BIGINT,
        outcome TEXT,
        start_seq BIGINT,
        end_replica TEXT,
        end_seq BIGINT
    );
    CREATE INDEX toolwarden_turns_session ON toolwarden_turns (session_id);
    CREATE INDEX toolwarden_turns_open ON toolwarden_turns (replica, id) WHERE ended_at IS NULL;
    CREATE INDEX toolwarden_turns_ended ON toolwarden_turns (ended_at);

    CREATE TABLE toolwarden_calls (
        id BIGSERIAL PRIMARY KEY,
        replica TEXT NOT NULL,
        turn_id TEXT NOT NULL,
        call_id TEXT NOT NULL,
        session_id TEXT,
        tool TEXT,
        status TEXT,
        started_at BIGINT NOT NULL,
        ended_at BIGINT,
        duration_ms BIGINT,
        attempts BIGINT,
        ran BOOLEAN NOT NULL DEFAULT false,
        UNIQUE (turn_id, call_id)
    );
    CREATE INDEX toolwarden_calls_tool ON toolwarden_calls (tool, id);
    CREATE INDEX toolwarden_calls_status ON toolwarden_calls (status, id);
    CREATE INDEX toolwarden_calls_session ON toolwarden_calls (session_id, id);
    CREATE INDEX toolwarden_calls_started ON toolwarden_calls (started_at);
    CREATE INDEX toolwarden_calls_ended ON toolwarden_calls (ended_at);

    -- `pos` is the trail's order over every replica (commit order: writers take turns to
    -- commit); `seq` is the order within one replica, as its `/v1/events` numbers events.
    CREATE TABLE toolwarden_events (
        pos BIGSERIAL PRIMARY KEY,
        replica TEXT NOT NULL,
        seq BIGINT NOT NULL,
        ts BIGINT NOT NULL,
        type TEXT NOT NULL,
        session_id TEXT,
        turn_id TEXT,
        call_id TEXT,
        body TEXT NOT NULL,
        UNIQUE (replica, seq)
    );
    CREATE INDEX toolwarden_events_turn ON toolwarden_events (turn_id, call_id, pos);
    CREATE INDEX toolwarden_events_session ON toolwarden_events (session_id, pos);
    CREATE INDEX toolwarden_events_ts ON toolwarden_events (ts);
    ",
    // 2: tasks toward MCP clients: a call answered with a task id; its status is its turn's.
    "
    CREATE TABLE toolwarden_tasks (
        task_id TEXT PRIMARY KEY,
        replica TEXT NOT NULL,
        turn_id TEXT NOT NULL,
        call_id TEXT NOT NULL,
        session_id TEXT,
        tool TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        ttl_ms BIGINT NOT NULL,
        poll_interval_ms BIGINT NOT NULL
    );
    CREATE INDEX toolwarden_tasks_turn ON toolwarden_tasks (turn_id);
    ",
];

/// Why the schema cannot be used.
#[derive(Debug)]
pub(crate) enum SchemaError {
    /// Written by a newer toolwarden.
    Newer(u32),
    /// PostgreSQL failed.
    Postgres(postgres::Error),
}

impl From<postgres::Error> for SchemaError {
    fn from(e: postgres::Error) -> Self {
        SchemaError::Postgres(e)
    }
}

/// The schema's version (0: no trail here yet). Writes nothing.
pub(crate) fn check(client: &mut Client) -> Result<u32, SchemaError> {
    let exists: bool = client
        .query_one("SELECT to_regclass('toolwarden_schema') IS NOT NULL", &[])?
        .get(0);
    if !exists {
        return Ok(0);
    }
    let version: Option<i32> = client
        .query_opt("SELECT max(version) FROM toolwarden_schema", &[])?
        .and_then(|r| r.get(0));
    let version = version.unwrap_or(0).max(0) as u32;
    if version > LATEST {
        return Err(SchemaError::Newer(version));
    }
    Ok(version)
}

/// Runs the migrations up to [`LATEST`], one replica at a time; refuses a newer schema.
pub(crate) fn migrate(client: &mut Client) -> Result<(), SchemaError> {
    if check(client)? == LATEST {
        return Ok(());
    }
    let mut tx = client.transaction()?;
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtext('toolwarden.migrate:' || current_schema()))",
        &[],
    )?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS toolwarden_schema (version INTEGER NOT NULL)")?;
    let version: Option<i32> = tx
        .query_one("SELECT max(version) FROM toolwarden_schema", &[])?
        .get(0);
    let version = version.unwrap_or(0).max(0) as u32;
    if version > LATEST {
        return Err(SchemaError::Newer(version));
    }
    for (n, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        tx.batch_execute(sql)?;
        tx.execute("DELETE FROM toolwarden_schema", &[])?;
        tx.execute(
            "INSERT INTO toolwarden_schema (version) VALUES ($1)",
            &[&(n as i32 + 1)],
        )?;
    }
    tx.commit()?;
    Ok(())
}
