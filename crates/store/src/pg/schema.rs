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

/// The batch function's parameters as migration 3 declared them (migration 4 adds the
/// principals after them).
macro_rules! batch_params {
    () => {
        "        p_replica TEXT,
        s_tid TEXT[], s_sid TEXT[], s_parent TEXT[], s_ts BIGINT[], s_seq BIGINT[],
        c_tid TEXT[], c_cid TEXT[], c_sid TEXT[], c_tool TEXT[], c_ts BIGINT[], c_ran BOOLEAN[],
        x_tid TEXT[], x_cid TEXT[], x_status TEXT[], x_ts BIGINT[], x_dur BIGINT[],
        x_attempts BIGINT[],
        t_tid TEXT[], t_outcome TEXT[], t_ts BIGINT[], t_seq BIGINT[],
        e_seq BIGINT[], e_ts BIGINT[], e_type TEXT[], e_sid TEXT[], e_tid TEXT[], e_cid TEXT[],
        e_body TEXT[]"
    };
}

/// The batch function's header after its parameters, to its body's first statement.
macro_rules! batch_start {
    () => {
        "    ) RETURNS void LANGUAGE plpgsql AS $fn$
    #variable_conflict use_column
    DECLARE
        v_tid TEXT;
        v_cid TEXT;
        v_seq BIGINT;
    BEGIN
"
    };
}

/// The batch function's calls inserted again (a call's row is made once), its updates of ended
/// calls and turns and its commit-order lock, alike in migrations 3 and 4.
macro_rules! batch_ends {
    () => {
        "            ON CONFLICT (turn_id, call_id) DO UPDATE SET ran = true
                WHERE excluded.ran AND NOT toolwarden_calls.ran;
        END IF;
        -- Ended calls and turns row by row, each found by its unique key: a plan that looks
        -- a row up by a unique key uses the key's index whatever the table's statistics say,
        -- so the plans made once on a new, nearly empty trail stay right as it grows.
        FOR i IN 1 .. coalesce(cardinality(x_tid), 0) LOOP
            v_tid := x_tid[i];
            v_cid := x_cid[i];
            UPDATE toolwarden_calls SET status = x_status[i], ended_at = x_ts[i],
                duration_ms = x_dur[i], attempts = x_attempts[i]
            WHERE turn_id = v_tid AND call_id = v_cid;
        END LOOP;
        FOR i IN 1 .. coalesce(cardinality(t_tid), 0) LOOP
            v_tid := t_tid[i];
            v_seq := t_seq[i];
            UPDATE toolwarden_turns SET ended_at = t_ts[i], outcome = t_outcome[i],
                end_seq = v_seq, end_replica = p_replica
            WHERE turn_id = v_tid
                AND (replica <> p_replica OR start_seq IS NULL OR start_seq < v_seq);
        END LOOP;
        PERFORM pg_advisory_xact_lock(hashtext('toolwarden.commit:' || current_schema()));
"
    };
}

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
    // 3: a batch written by one function call — one round trip per commit instead of one per
    // statement — taking the commit-order lock only around the events' insert (`pos` orders
    // events; turns and calls need no order), so replicas queue for it only as long as that
    // insert and the commit take, never for a round trip to a client. Its statements' plans are
    // made once per connection and kept (no planning per batch), so none may depend on the
    // tables' size: rows are updated one by one by their unique keys.
    concat!(
        "
    CREATE FUNCTION toolwarden_write_batch(
",
        batch_params!(),
        "
",
        batch_start!(),
        "        IF cardinality(s_tid) > 0 THEN
            INSERT INTO toolwarden_turns
                (replica, turn_id, session_id, parent_turn_id, started_at, start_seq)
            SELECT p_replica, u.tid, u.sid, u.parent, u.ts, u.seq
            FROM unnest(s_tid, s_sid, s_parent, s_ts, s_seq)
                WITH ORDINALITY AS u(tid, sid, parent, ts, seq, n)
            ORDER BY u.n
            ON CONFLICT (turn_id) DO UPDATE SET replica = excluded.replica, ended_at = NULL,
                outcome = NULL, end_seq = NULL, end_replica = NULL,
                start_seq = excluded.start_seq;
        END IF;
        IF cardinality(c_tid) > 0 THEN
            INSERT INTO toolwarden_calls
                (replica, turn_id, call_id, session_id, tool, started_at, ran)
            SELECT p_replica, u.tid, u.cid, u.sid, u.tool, u.ts, u.ran
            FROM unnest(c_tid, c_cid, c_sid, c_tool, c_ts, c_ran)
                WITH ORDINALITY AS u(tid, cid, sid, tool, ts, ran, n)
            ORDER BY u.n
",
        batch_ends!(),
        "        INSERT INTO toolwarden_events
            (replica, seq, ts, type, session_id, turn_id, call_id, body)
        SELECT p_replica, u.seq, u.ts, u.type, u.sid, u.tid, u.cid, u.body
        FROM unnest(e_seq, e_ts, e_type, e_sid, e_tid, e_cid, e_body)
            WITH ORDINALITY AS u(seq, ts, type, sid, tid, cid, body, n)
        ORDER BY u.n
        ON CONFLICT (replica, seq) DO NOTHING;
    END
    $fn$;
    ",
    ),
    // 4: who made each turn, call, task and event; records made before principals existed are
    // `local`'s (a column with a constant default rewrites no row). The batch function takes
    // the principals too: replaced, under its old signature's name.
    concat!(
        "
    ALTER TABLE toolwarden_turns ADD COLUMN principal TEXT NOT NULL DEFAULT 'local';
    ALTER TABLE toolwarden_calls ADD COLUMN principal TEXT NOT NULL DEFAULT 'local';
    ALTER TABLE toolwarden_tasks ADD COLUMN principal TEXT NOT NULL DEFAULT 'local';
    ALTER TABLE toolwarden_events ADD COLUMN principal TEXT;
    CREATE INDEX toolwarden_turns_principal ON toolwarden_turns (principal, id);
    CREATE INDEX toolwarden_calls_principal ON toolwarden_calls (principal, id);
    CREATE INDEX toolwarden_events_principal ON toolwarden_events (principal, pos);
    DROP FUNCTION toolwarden_write_batch(
        TEXT, TEXT[], TEXT[], TEXT[], BIGINT[], BIGINT[], TEXT[], TEXT[], TEXT[], TEXT[],
        BIGINT[], BOOLEAN[], TEXT[], TEXT[], TEXT[], BIGINT[], BIGINT[], BIGINT[], TEXT[],
        TEXT[], BIGINT[], BIGINT[], BIGINT[], BIGINT[], TEXT[], TEXT[], TEXT[], TEXT[], TEXT[]
    );
    CREATE FUNCTION toolwarden_write_batch(
",
        batch_params!(),
        ",
        s_principal TEXT[], c_principal TEXT[], e_principal TEXT[]
",
        batch_start!(),
        "        IF cardinality(s_tid) > 0 THEN
            INSERT INTO toolwarden_turns
                (replica, turn_id, session_id, parent_turn_id, started_at, start_seq, principal)
            SELECT p_replica, u.tid, u.sid, u.parent, u.ts, u.seq, u.who
            FROM unnest(s_tid, s_sid, s_parent, s_ts, s_seq, s_principal)
                WITH ORDINALITY AS u(tid, sid, parent, ts, seq, who, n)
            ORDER BY u.n
            ON CONFLICT (turn_id) DO UPDATE SET replica = excluded.replica, ended_at = NULL,
                outcome = NULL, end_seq = NULL, end_replica = NULL,
                start_seq = excluded.start_seq, principal = excluded.principal;
        END IF;
        IF cardinality(c_tid) > 0 THEN
            INSERT INTO toolwarden_calls
                (replica, turn_id, call_id, session_id, tool, started_at, ran, principal)
            SELECT p_replica, u.tid, u.cid, u.sid, u.tool, u.ts, u.ran, u.who
            FROM unnest(c_tid, c_cid, c_sid, c_tool, c_ts, c_ran, c_principal)
                WITH ORDINALITY AS u(tid, cid, sid, tool, ts, ran, who, n)
            ORDER BY u.n
",
        batch_ends!(),
        "        INSERT INTO toolwarden_events
            (replica, seq, ts, type, session_id, turn_id, call_id, body, principal)
        SELECT p_replica, u.seq, u.ts, u.type, u.sid, u.tid, u.cid, u.body, u.who
        FROM unnest(e_seq, e_ts, e_type, e_sid, e_tid, e_cid, e_body, e_principal)
            WITH ORDINALITY AS u(seq, ts, type, sid, tid, cid, body, who, n)
        ORDER BY u.n
        ON CONFLICT (replica, seq) DO NOTHING;
    END
    $fn$;
    ",
    ),
    // 5: the replicas sharing the trail, each with its lease (liveness.rs): renewed while it
    // lives; one that lets it run out is declared dead, and a survivor records its open calls.
    "
    CREATE TABLE toolwarden_replicas (
        replica TEXT PRIMARY KEY,
        name TEXT,
        generation BIGINT NOT NULL,
        started_at BIGINT NOT NULL,
        heartbeat_at BIGINT NOT NULL,
        lease_ms BIGINT NOT NULL,
        dead_at BIGINT,
        taken_over_by TEXT,
        taken_over_at BIGINT,
        interrupted BIGINT,
        stopped_at BIGINT
    );
    ",
];

/// Why the schema cannot be used.
#[derive(Debug)]
pub(crate) enum PgSchemaError {
    /// Written by a newer toolwarden.
    Newer(u32),
    /// PostgreSQL failed.
    Postgres(postgres::Error),
}

impl From<postgres::Error> for PgSchemaError {
    fn from(e: postgres::Error) -> Self {
        PgSchemaError::Postgres(e)
    }
}

/// The schema's version (0: no trail here yet). Writes nothing.
pub(crate) fn check(client: &mut Client) -> Result<u32, PgSchemaError> {
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
        return Err(PgSchemaError::Newer(version));
    }
    Ok(version)
}

/// Runs the migrations up to [`LATEST`], one replica at a time; refuses a newer schema.
pub(crate) fn migrate(client: &mut Client) -> Result<(), PgSchemaError> {
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
        return Err(PgSchemaError::Newer(version));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TrailReader;
    use crate::pg::PgReader;
    use toolwarden_testkit::pg::TestSchema;

    /// A trail written before principals (schema 3) is migrated when read, and its rows are
    /// `local`'s — its events too, though they name no principal.
    #[test]
    fn a_trail_from_before_principals_reads_as_local() {
        let schema = TestSchema::new();
        let url = schema.url().to_owned();
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut client = Client::connect(&url, postgres::NoTls).unwrap();
                let mut tx = client.transaction().unwrap();
                tx.batch_execute("CREATE TABLE toolwarden_schema (version INTEGER NOT NULL)")
                    .unwrap();
                for sql in &MIGRATIONS[..3] {
                    tx.batch_execute(sql).unwrap();
                }
                tx.batch_execute(
                    "INSERT INTO toolwarden_schema VALUES (3);
                     INSERT INTO toolwarden_turns (replica, turn_id, session_id, started_at, \
                     ended_at, outcome) VALUES ('a', 't_old', 's1', 1000, 2000, 'ok');
                     INSERT INTO toolwarden_calls (replica, turn_id, call_id, session_id, tool, \
                     status, started_at, ended_at, duration_ms, attempts, ran) \
                     VALUES ('a', 't_old', 'c1', 's1', 'echo', 'ok', 1000, 2000, 1000, 1, true);
                     INSERT INTO toolwarden_events (replica, seq, ts, type, session_id, turn_id, \
                     body) VALUES ('a', 1, 1000, 'turn_start', 's1', 't_old', '{}');",
                )
                .unwrap();
                tx.commit().unwrap();
            })
            .join()
            .unwrap();
        });

        crate::assert_reads_as_local(&TrailReader::Postgres(PgReader::open(&url).unwrap()));
        assert_eq!(
            schema.query("SELECT version::text FROM toolwarden_schema"),
            vec![Some(LATEST.to_string())]
        );
    }
}
