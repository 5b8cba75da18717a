//! The SQLite writer behind the shared writer thread (`crate::writer`): commits go to the pending
//! files, and from there into the database; pruning by age.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rusqlite::Connection;
use toolwarden_protocol::{TaskRecord, Timestamp};

use super::apply::{Fact, Rows, Writes, apply_batch};
use super::pending::{PendingFile, PendingLog, Unapplied};
use crate::redact::RedactedEvent;
use crate::writer::TrailBackend;

/// Rows deleted per transaction when pruning (so that commits of new events are not held up).
const PRUNE_CHUNK: i64 = 5000;

/// The SQLite writer: its connection, the rows it remembers, and the pending files its commits
/// go to (`pending.rs`).
pub(crate) struct SqliteWriter {
    pub(crate) conn: Connection,
    pub(crate) rows: Rows,
    pub(crate) log: Arc<Mutex<PendingLog>>,
    /// A file taken from the log whose records are being moved into the database (kept here
    /// while moving them fails).
    pub(crate) sealed: Option<PendingFile>,
}

impl SqliteWriter {
    /// Moves the sealed file's records into the database in one transaction and empties it;
    /// gives back the `seq` of its last record.
    fn apply_sealed(&mut self) -> Result<Option<u64>, String> {
        let Some(sealed) = &mut self.sealed else {
            return Ok(None);
        };
        let Some(last) = sealed.unapplied().map(|u| u.last_seq) else {
            return Ok(None);
        };
        let result = (|| {
            let tx = self.conn.transaction()?;
            let mut writes = Writes::new(&tx);
            let batch: Vec<(Fact<'_>, &str)> = sealed.records().collect();
            apply_batch(&mut writes, &mut self.rows, &batch)?;
            drop(writes);
            tx.commit()
        })();
        result.map_err(|e| {
            self.rows.clear();
            e.to_string()
        })?;
        // Should emptying the file fail, its records are in the database: moved again when the
        // store next opens, they are skipped by their `seq`.
        sealed
            .applied()
            .map_err(|e| format!("cannot empty {}: {e}", sealed.path().display()))?;
        Ok(Some(last))
    }

    /// The sealed file is empty again: it takes its turn in the log.
    fn free_sealed(&mut self) {
        if let Some(file) = self.sealed.take() {
            self.log.lock().free(file);
        }
    }
}

impl TrailBackend for SqliteWriter {
    fn write(&mut self, _items: &[RedactedEvent<'_>]) -> Result<(), String> {
        Err("this store commits to its pending files, not through the writer".to_owned())
    }

    fn unapplied(&self) -> Option<Unapplied> {
        match &self.sealed {
            Some(sealed) if sealed.unapplied().is_some() => sealed.unapplied(),
            _ => self.log.lock().unapplied(),
        }
    }

    fn apply_pending(&mut self) -> Result<Option<u64>, String> {
        // A file that failed before goes first; then the active one, sealed so that commits
        // go on in the other file while this one is moved.
        let mut readable = None;
        if self.sealed.is_some() {
            readable = self.apply_sealed()?;
            self.free_sealed();
        }
        self.sealed = self.log.lock().seal();
        if self.sealed.is_some() {
            readable = self.apply_sealed()?.or(readable);
            self.free_sealed();
        }
        Ok(readable)
    }

    fn prune(&mut self, retain: Duration, now: Timestamp) -> Result<(), String> {
        prune(&self.conn, retain, now).map_err(|e| e.to_string())
    }

    fn put_task(&mut self, task: &TaskRecord) -> Result<(), String> {
        super::tasks::write(&self.conn, task).map_err(|e| e.to_string())
    }

    fn close(&mut self) {
        // Nothing more is committed to the log; what is in it goes into the database.
        self.log.lock().close();
        if let Err(e) = self.apply_pending() {
            tracing::error!(error = %e, "the audit trail's pending events stay in its pending files until it next opens");
        }
        // Let readers see a clean database: checkpoint the WAL into it.
        let _ = self.conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);");
    }
}

/// Deletes tasks past their `ttl_ms`, and rows older than `retain` (events, ended calls and
/// turns, minute marks), in chunks.
pub(crate) fn prune(conn: &Connection, retain: Duration, now: Timestamp) -> rusqlite::Result<()> {
    super::tasks::prune(conn, now)?;
    if retain.is_zero() {
        return Ok(());
    }
    let cutoff = now.unix_millis() - retain.as_millis().min(i64::MAX as u128) as i64;
    let minute = cutoff.div_euclid(60_000);
    // The first event, call and turn at or after the cutoff's minute; everything before goes.
    let bound: Option<(i64, i64, i64)> = conn
        .query_row(
            "SELECT seq, call_row, turn_row FROM marks WHERE minute >= ?1 ORDER BY minute LIMIT 1",
            [minute],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .ok();
    let (seq, call_row, turn_row) = match bound {
        Some(b) => b,
        None => {
            // Nothing since the cutoff: every row is older, unless there are none.
            let newest: Option<i64> =
                conn.query_row("SELECT max(ts) FROM events", [], |r| r.get(0))?;
            if newest.is_none_or(|ts| ts >= cutoff) {
                return Ok(());
            }
            (i64::MAX, i64::MAX, i64::MAX)
        }
    };
    let chunked = |sql: &str, bound: i64| -> rusqlite::Result<()> {
        loop {
            let n = conn.execute(sql, rusqlite::params![bound, PRUNE_CHUNK])?;
            if n < PRUNE_CHUNK as usize {
                return Ok(());
            }
        }
    };
    chunked(
        "DELETE FROM events WHERE seq IN (SELECT seq FROM events WHERE seq < ?1 ORDER BY seq LIMIT ?2)",
        seq,
    )?;
    chunked(
        "DELETE FROM calls WHERE id IN (SELECT id FROM calls WHERE id < ?1 AND status IS NOT NULL \
         ORDER BY id LIMIT ?2)",
        call_row,
    )?;
    chunked(
        "DELETE FROM turns WHERE id IN (SELECT id FROM turns WHERE id < ?1 AND ended_at IS NOT NULL \
         ORDER BY id LIMIT ?2)",
        turn_row,
    )?;
    conn.execute("DELETE FROM marks WHERE minute < ?1", [minute])?;
    Ok(())
}
