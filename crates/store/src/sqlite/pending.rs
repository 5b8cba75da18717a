//! The pending files, `FILE.pending` and `FILE.pending.2` beside the database: where SQLite's
//! commits go.
//!
//! A batch of events is committed by appending its records to the active file in one write: from
//! then on it survives the process dying (the operating system has it), which is what a call with
//! `before_execution` waits for. The records are moved into the database later, many batches in
//! one transaction (every [`APPLY_EVENTS`] events, [`APPLY_BYTES`] bytes or `apply_after` —
//! [`crate::options::APPLY_AFTER`] unless the options say otherwise — whichever comes first, at
//! once when a read asks for them, and when the store closes). To move them the writer seals the active file
//! ([`PendingLog::seal`]): commits go on into the other one meanwhile, and the sealed file, once
//! its records are in the database, is emptied and waits for its next turn. A transaction that
//! carries thousands of events rewrites each B-tree's last pages once instead of once per small
//! commit; a call waits for one `write` instead of a transaction. When the store opens, records a
//! dead process left in either file are moved into the database before anything else, the file
//! whose records come first first (those whose `seq` the database already has are skipped: the
//! process died between the transaction and emptying the file).
//!
//! A record is the header `len: u32, check: u64` (little-endian; `check` is the XXH3 hash of the
//! payload) and the payload: `seq: u64`, `ts: i64`, a change tag (`u8`) and its numbers, then
//! strings, each `u32` length and UTF-8 bytes (`u32::MAX` for none); the principal, last, only when
//! the event names one (records written before principals existed end at the body). The file starts with
//! [`MAGIC`]. A record cut short at the end of the file (the process died during the write) was
//! never reported committed and is dropped; a damaged record before the end stops the replay
//! there and the file is kept beside the database as `FILE.pending.damaged` (or
//! `FILE.pending.2.damaged`).

use std::fs::File;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;

use super::apply::{Change, Fact};
use crate::redact::RedactedEvent;

/// The first bytes of a pending file (the format's version is its last digit).
pub(crate) const MAGIC: &[u8; 8] = b"TWPEND1\n";
/// Move pending events into the database once this many are waiting…
pub(crate) const APPLY_EVENTS: usize = 2048;
/// …or their records take this many bytes…
pub(crate) const APPLY_BYTES: usize = 8 << 20;

const HEADER: usize = 4 + 8;
const NONE: u32 = u32::MAX;

/// The pending file and, in memory, the same records (what is not in the database yet).
pub(crate) struct PendingFile {
    path: PathBuf,
    file: File,
    /// Every record in the file, [`MAGIC`] first; empty when the file is.
    buf: Vec<u8>,
    /// How much of `buf` is in the file.
    written: usize,
    events: usize,
    last_seq: u64,
    since: Option<Instant>,
}

/// Events committed to the pending file and not yet in the database.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Unapplied {
    pub(crate) events: usize,
    pub(crate) bytes: usize,
    /// When the oldest of them was committed.
    pub(crate) since: Instant,
    pub(crate) last_seq: u64,
}

impl Unapplied {
    /// Whether they should be moved into the database now, when none may wait past `after`.
    pub(crate) fn due(&self, now: Instant, after: Duration) -> bool {
        self.events >= APPLY_EVENTS
            || self.bytes >= APPLY_BYTES
            || now.saturating_duration_since(self.since) >= after
    }
}

/// The two pending files of the database `FILE`: `FILE.pending` and `FILE.pending.2`.
pub(crate) fn paths_for(db: &Path) -> [PathBuf; 2] {
    let mut first = db.as_os_str().to_owned();
    first.push(".pending");
    let mut second = first.clone();
    second.push(".2");
    [PathBuf::from(first), PathBuf::from(second)]
}

/// The two pending files, taking turns: commits are appended to the active one while the
/// writer thread moves the other one's records into the database, so that moving them never
/// holds up a commit. Whoever needs a commit holds this (behind its mutex) while appending.
pub(crate) struct PendingLog {
    active: PendingFile,
    /// The other file, empty; `None` while its records are being moved into the database.
    spare: Option<PendingFile>,
    /// The store has closed: nothing more is committed here.
    closed: bool,
}

impl PendingLog {
    /// Opens (creating) both files, which must be empty (see [`PendingFile::open`]).
    pub(crate) fn open([first, second]: [PathBuf; 2]) -> std::io::Result<PendingLog> {
        Ok(PendingLog {
            active: PendingFile::open(first)?,
            spare: Some(PendingFile::open(second)?),
            closed: false,
        })
    }

    /// The file commits are appended to.
    pub(crate) fn active(&mut self) -> &mut PendingFile {
        &mut self.active
    }

    /// What is committed to the active file and not in the database yet.
    pub(crate) fn unapplied(&self) -> Option<Unapplied> {
        self.active.unapplied()
    }

    /// Hands over the active file, when it holds records, for them to be moved into the
    /// database; commits go to the other file from now on. `None` when there is nothing to move
    /// (or the other file is still being moved, which only its mover can be waiting for).
    pub(crate) fn seal(&mut self) -> Option<PendingFile> {
        self.active.unapplied()?;
        let spare = self.spare.take()?;
        Some(std::mem::replace(&mut self.active, spare))
    }

    /// A sealed file whose records are in the database and which has been emptied: it takes its
    /// turn again.
    pub(crate) fn free(&mut self, file: PendingFile) {
        self.spare = Some(file);
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed
    }

    /// The store closes: later commits are refused.
    pub(crate) fn close(&mut self) {
        self.closed = true;
    }
}

impl PendingFile {
    /// Opens (creating) the pending file at `path`, which must be empty: what a dead process left
    /// there is replayed ([`replay`]) before.
    pub(crate) fn open(path: PathBuf) -> std::io::Result<PendingFile> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        file.set_len(0)?;
        Ok(PendingFile {
            path,
            file,
            buf: Vec::new(),
            written: 0,
            events: 0,
            last_seq: 0,
            since: None,
        })
    }

    /// The file's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Commits the events: their records are appended to the file in one write. On an error
    /// nothing of them counts (a retry writes them again over whatever part got through).
    pub(crate) fn append(&mut self, items: &[RedactedEvent<'_>]) -> std::io::Result<()> {
        self.append_facts(
            items
                .iter()
                .map(|item| (Fact::of(item.event), item.body.as_str())),
        )
    }

    /// Appends records of events (each its fact and stored body) in one write.
    fn append_facts<'a>(
        &mut self,
        items: impl Iterator<Item = (Fact<'a>, &'a str)>,
    ) -> std::io::Result<()> {
        let start = self.buf.len();
        if start == 0 {
            self.buf.extend_from_slice(MAGIC);
        }
        let mut n = 0;
        let mut last = self.last_seq;
        for (fact, body) in items {
            encode(&mut self.buf, &fact, body);
            last = fact.seq;
            n += 1;
        }
        if let Err(e) = self
            .file
            .write_all_at(&self.buf[self.written..], self.written as u64)
        {
            self.buf.truncate(start);
            return Err(e);
        }
        self.written = self.buf.len();
        self.events += n;
        self.last_seq = last;
        if n > 0 && self.since.is_none() {
            self.since = Some(Instant::now());
        }
        Ok(())
    }

    /// What is committed here and not in the database yet.
    pub(crate) fn unapplied(&self) -> Option<Unapplied> {
        Some(Unapplied {
            events: self.events,
            bytes: self.buf.len(),
            since: self.since?,
            last_seq: self.last_seq,
        })
    }

    /// The records not in the database yet, in order.
    pub(crate) fn records(&self) -> Records<'_> {
        Records::new(&self.buf)
    }

    /// The records are in the database: empties the file.
    pub(crate) fn applied(&mut self) -> std::io::Result<()> {
        self.file.set_len(0)?;
        self.buf.clear();
        self.written = 0;
        self.events = 0;
        self.since = None;
        Ok(())
    }
}

fn put_str(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => {
            out.extend_from_slice(&(s.len() as u32).to_le_bytes());
            out.extend_from_slice(s.as_bytes());
        }
        None => out.extend_from_slice(&NONE.to_le_bytes()),
    }
}

/// Appends one record to `out`.
pub(crate) fn encode(out: &mut Vec<u8>, fact: &Fact<'_>, body: &str) {
    let at = out.len();
    out.extend_from_slice(&[0; HEADER]);
    out.extend_from_slice(&fact.seq.to_le_bytes());
    out.extend_from_slice(&fact.ts.to_le_bytes());
    let (tag, text) = match &fact.change {
        Change::None => (0u8, None),
        Change::TurnStart { parent_turn_id } => (1, *parent_turn_id),
        Change::TurnEnd { outcome } => (2, Some(*outcome)),
        Change::ToolStart => (3, None),
        Change::ToolResult { status, .. } => (4, Some(*status)),
    };
    out.push(tag);
    if let Change::ToolResult {
        duration_ms,
        attempts,
        ..
    } = fact.change
    {
        out.extend_from_slice(&duration_ms.to_le_bytes());
        out.extend_from_slice(&attempts.to_le_bytes());
    }
    put_str(out, text);
    put_str(out, Some(fact.kind));
    put_str(out, fact.turn_id);
    put_str(out, fact.call_id);
    put_str(out, fact.session_id);
    put_str(out, fact.tool);
    put_str(out, Some(body));
    // Last, so that a record written before principals existed reads back without it.
    if fact.principal.is_some() {
        put_str(out, fact.principal);
    }
    let payload = &out[at + HEADER..];
    let len = payload.len() as u32;
    let check = xxhash_rust::xxh3::xxh3_64(payload);
    out[at..at + 4].copy_from_slice(&len.to_le_bytes());
    out[at + 4..at + HEADER].copy_from_slice(&check.to_le_bytes());
}

/// Why the records stop before the end of the bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EarlyEnd {
    /// The last record is cut short: the process died while writing it (it was never reported
    /// committed).
    Torn { at: usize },
    /// A record that does not read back: the file is damaged from `at`.
    Damaged { at: usize, why: &'static str },
}

/// The records of a pending file's bytes, in order; [`Records::stop`] says why they ended early.
pub(crate) struct Records<'a> {
    bytes: &'a [u8],
    at: usize,
    stop: Option<EarlyEnd>,
}

impl<'a> Records<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Records<'a> {
        let mut records = Records {
            bytes,
            at: 0,
            stop: None,
        };
        if bytes.is_empty() {
            return records;
        }
        if bytes.len() < MAGIC.len() {
            records.stop = Some(EarlyEnd::Torn { at: 0 });
        } else if bytes[..MAGIC.len()] != MAGIC[..] {
            records.stop = Some(EarlyEnd::Damaged {
                at: 0,
                why: "it does not start like a toolwarden pending file",
            });
        }
        records.at = MAGIC.len();
        records
    }

    /// Why the records ended before the last byte, once they have been read to their end.
    pub(crate) fn stop(&self) -> Option<&EarlyEnd> {
        self.stop.as_ref()
    }
}

impl<'a> Iterator for Records<'a> {
    type Item = (Fact<'a>, &'a str);

    fn next(&mut self) -> Option<Self::Item> {
        if self.stop.is_some() || self.at >= self.bytes.len() {
            return None;
        }
        let rest = &self.bytes[self.at..];
        let at = self.at;
        if rest.len() < HEADER {
            self.stop = Some(EarlyEnd::Torn { at });
            return None;
        }
        let len = u32::from_le_bytes(rest[..4].try_into().unwrap_or_default()) as usize;
        let check = u64::from_le_bytes(rest[4..HEADER].try_into().unwrap_or_default());
        let end = HEADER.saturating_add(len);
        if rest.len() < end {
            self.stop = Some(EarlyEnd::Torn { at });
            return None;
        }
        let payload = &rest[HEADER..end];
        if xxhash_rust::xxh3::xxh3_64(payload) != check {
            // A bad last record is a write cut short; before the end, damage.
            self.stop = Some(if end == rest.len() {
                EarlyEnd::Torn { at }
            } else {
                EarlyEnd::Damaged {
                    at,
                    why: "a record's checksum does not match",
                }
            });
            return None;
        }
        match decode(payload) {
            Some(record) => {
                self.at += end;
                Some(record)
            }
            None => {
                self.stop = Some(EarlyEnd::Damaged {
                    at,
                    why: "a record does not read back",
                });
                None
            }
        }
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.bytes.len() < n {
            return None;
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Some(head)
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn i64(&mut self) -> Option<i64> {
        Some(i64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn str(&mut self) -> Option<Option<&'a str>> {
        let len = u32::from_le_bytes(self.take(4)?.try_into().ok()?);
        if len == NONE {
            return Some(None);
        }
        Some(Some(std::str::from_utf8(self.take(len as usize)?).ok()?))
    }
}

fn decode(payload: &[u8]) -> Option<(Fact<'_>, &str)> {
    let mut r = Reader { bytes: payload };
    let seq = r.u64()?;
    let ts = r.i64()?;
    let tag = r.take(1)?[0];
    let numbers = if tag == 4 {
        Some((r.i64()?, r.i64()?))
    } else {
        None
    };
    let text = r.str()?;
    let change = match (tag, text, numbers) {
        (0, None, _) => Change::None,
        (1, parent_turn_id, _) => Change::TurnStart { parent_turn_id },
        (2, Some(outcome), _) => Change::TurnEnd { outcome },
        (3, None, _) => Change::ToolStart,
        (4, Some(status), Some((duration_ms, attempts))) => Change::ToolResult {
            status,
            duration_ms,
            attempts,
        },
        _ => return None,
    };
    let kind = r.str()??;
    let fact = Fact {
        seq,
        ts,
        kind,
        turn_id: r.str()?,
        call_id: r.str()?,
        session_id: r.str()?,
        tool: r.str()?,
        change,
        principal: None,
    };
    let body = r.str()??;
    let principal = if r.bytes.is_empty() { None } else { r.str()? };
    r.bytes
        .is_empty()
        .then_some((Fact { principal, ..fact }, body))
}

/// What a dead process left in the pending file at `path`: its bytes (empty when there is no
/// file).
pub(crate) fn read_left(path: &Path) -> std::io::Result<Vec<u8>> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// `FILE.pending.damaged`, where a damaged pending file is kept.
pub(crate) fn damaged_path(pending: &Path) -> PathBuf {
    let mut name = pending.as_os_str().to_owned();
    name.push(".damaged");
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn fact<'a>(seq: u64, change: Change<'a>, strings: &[Option<&'a str>; 5]) -> Fact<'a> {
        Fact {
            seq,
            ts: (seq as i64).wrapping_mul(7).wrapping_sub(1000),
            kind: "tool_result",
            turn_id: strings[0],
            call_id: strings[1],
            session_id: strings[2],
            tool: strings[3],
            principal: strings[4],
            change,
        }
    }

    fn changes(text: &str) -> Vec<Change<'_>> {
        vec![
            Change::None,
            Change::TurnStart {
                parent_turn_id: None,
            },
            Change::TurnStart {
                parent_turn_id: Some(text),
            },
            Change::TurnEnd { outcome: text },
            Change::ToolStart,
            Change::ToolResult {
                status: text,
                duration_ms: -5,
                attempts: i64::MAX,
            },
        ]
    }

    proptest! {
        #[test]
        fn records_read_back_as_written(
            texts in proptest::collection::vec(proptest::option::of(".{0,40}"), 5),
            body in ".{0,300}",
            seq in any::<u64>(),
        ) {
            let strings: [Option<&str>; 5] = [
                texts[0].as_deref(), texts[1].as_deref(), texts[2].as_deref(), texts[3].as_deref(),
                texts[4].as_deref(),
            ];
            let text = texts[0].as_deref().unwrap_or("");
            let written: Vec<Fact<'_>> = changes(text)
                .into_iter()
                .enumerate()
                .map(|(i, change)| fact(seq.wrapping_add(i as u64), change, &strings))
                .collect();
            let mut bytes = MAGIC.to_vec();
            for f in &written {
                encode(&mut bytes, f, &body);
            }
            let mut records = Records::new(&bytes);
            let read: Vec<(Fact<'_>, &str)> = records.by_ref().collect();
            prop_assert_eq!(records.stop(), None);
            prop_assert_eq!(read.len(), written.len());
            for ((f, b), w) in read.iter().zip(&written) {
                prop_assert_eq!(f, w);
                prop_assert_eq!(*b, body.as_str());
            }
            // Cut anywhere inside the last record: the others read back, the last is torn.
            let last_start = {
                let mut one = MAGIC.to_vec();
                for f in &written[..written.len() - 1] {
                    encode(&mut one, f, &body);
                }
                one.len()
            };
            for cut in [last_start + 1, last_start + HEADER + 3, bytes.len() - 1] {
                let mut records = Records::new(&bytes[..cut]);
                prop_assert_eq!(records.by_ref().count(), written.len() - 1);
                prop_assert_eq!(records.stop(), Some(&EarlyEnd::Torn { at: last_start }));
            }
        }
    }

    #[test]
    fn a_damaged_record_before_the_end_stops_the_records_there() {
        let strings = [Some("t_1"), Some("c1"), None, Some("echo"), None];
        let mut bytes = MAGIC.to_vec();
        encode(&mut bytes, &fact(1, Change::ToolStart, &strings), "{}");
        let second = bytes.len();
        encode(&mut bytes, &fact(2, Change::None, &strings), "{\"a\":1}");
        encode(&mut bytes, &fact(3, Change::None, &strings), "{}");
        let mut damaged = bytes.clone();
        damaged[second + HEADER + 20] ^= 0x40;
        let mut records = Records::new(&damaged);
        assert_eq!(records.by_ref().count(), 1);
        assert_eq!(
            records.stop(),
            Some(&EarlyEnd::Damaged {
                at: second,
                why: "a record's checksum does not match"
            })
        );
        // The same damage in the last record is a write cut short.
        let mut records = Records::new(&damaged[..bytes.len() - (bytes.len() - second)]);
        assert_eq!(records.by_ref().count(), 1);
        assert_eq!(records.stop(), None);
        assert!(matches!(
            Records::new(b"SQLite format 3\0....").stop(),
            Some(EarlyEnd::Damaged { at: 0, .. })
        ));
    }

    #[test]
    fn appended_records_are_in_the_file_and_emptied_once_applied() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.db.pending");
        std::fs::write(&path, b"left over").unwrap();
        let mut pending = PendingFile::open(path.clone()).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"", "opened empty");
        assert!(pending.unapplied().is_none());
        let strings = [
            Some("t_1"),
            Some("c1"),
            Some("s_1"),
            Some("echo"),
            Some("bob"),
        ];
        pending
            .append_facts([(fact(5, Change::ToolStart, &strings), "{\"x\":1}")].into_iter())
            .unwrap();
        pending
            .append_facts([(fact(6, Change::None, &strings), "{}")].into_iter())
            .unwrap();
        let on_disk = std::fs::read(&path).unwrap();
        let seqs: Vec<u64> = Records::new(&on_disk).map(|(f, _)| f.seq).collect();
        assert_eq!(seqs, [5, 6]);
        let u = pending.unapplied().unwrap();
        assert_eq!((u.events, u.last_seq, u.bytes), (2, 6, on_disk.len()));
        assert_eq!(pending.records().count(), 2);
        pending.applied().unwrap();
        assert!(pending.unapplied().is_none());
        assert_eq!(std::fs::read(&path).unwrap(), b"");
        pending
            .append_facts([(fact(7, Change::None, &strings), "{}")].into_iter())
            .unwrap();
        let on_disk = std::fs::read(&path).unwrap();
        assert_eq!(
            Records::new(&on_disk)
                .map(|(f, _)| f.seq)
                .collect::<Vec<_>>(),
            [7]
        );
    }
}
