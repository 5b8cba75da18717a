//! Tool pins (docs/RULES.md, "Tool pins"): each tool's definition — its description, input
//! schema and annotations — remembered the first time a server lists it, so that a server that
//! later rewrites a trusted tool ("rug pull", tool poisoning) is noticed.
//!
//! A pin is a SHA-256 over the definition's canonical JSON. Pins live in the audit trail as
//! `tool_accepted` events, each carrying the definition it pins: the first sight of a tool is
//! recorded as one (accepted by nobody), and so is every accepted change. At start the engine reads
//! them back ([`crate::Engine::load_pins`]); without a trail, pins last as long as the process.
//!
//! When a server lists a definition other than the pinned one, `tool_changed` says so with a
//! unified diff, and the tool's `on_tool_change` decides: `warn` (the tool runs; the pin stays),
//! `block` (its calls are denied until a person accepts the new definition), `accept` (the new
//! definition is pinned at once). A tool listed under a name another server had is a change too.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use serde_json::{Map, Value};
use toolwarden_protocol::{OnToolChange, ToolSpec};

use crate::canonical;

/// A tool's definition as it is pinned: its canonical JSON and its digest.
#[derive(Clone, Debug, PartialEq)]
pub struct Definition {
    /// `{"annotations", "description", "inputSchema"}`, keys sorted at every level.
    pub value: Value,
    /// `sha256:` and the hex of the SHA-256 of its canonical bytes.
    pub digest: String,
}

impl Definition {
    /// The definition of `spec`.
    pub fn of(spec: &ToolSpec) -> Definition {
        let mut map = Map::new();
        map.insert(
            "annotations".into(),
            serde_json::to_value(&spec.annotations).unwrap_or(Value::Null),
        );
        if let Some(d) = &spec.description {
            map.insert("description".into(), Value::String(d.clone()));
        }
        map.insert("inputSchema".into(), spec.input_schema.clone());
        Definition::from_value(sorted(Value::Object(map)))
    }

    /// The definition a `tool_accepted` event carries.
    pub fn from_value(value: Value) -> Definition {
        let value = sorted(value);
        let digest = format!(
            "sha256:{}",
            toolwarden_protocol::hex::encode(&canonical::digest(&value))
        );
        Definition { value, digest }
    }

    fn lines(&self) -> Vec<String> {
        serde_json::to_string_pretty(&self.value)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

/// `value` with every object's keys in order, whatever the map type keeps.
fn sorted(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let ordered: BTreeMap<String, Value> =
                map.into_iter().map(|(k, v)| (k, sorted(v))).collect();
            Value::Object(ordered.into_iter().collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}

/// A change a server made to a pinned tool, not accepted yet.
#[derive(Clone, Debug, PartialEq)]
pub struct PendingChange {
    /// The server listing the new definition.
    pub server: String,
    /// The pinned definition's digest.
    pub old_digest: String,
    /// The new definition.
    pub new: Definition,
    /// A unified diff from the pinned definition to the new one.
    pub diff: String,
    /// Whether calls are held until it is accepted (`on_tool_change = "block"`).
    pub blocked: bool,
}

/// What [`Pins::observe`] found.
#[derive(Debug, PartialEq)]
pub enum Listed {
    /// Nothing to say: the pinned definition, or a change already announced.
    Same,
    /// First seen: pinned now.
    First(Definition),
    /// Changed: announce it (and, with `accept`, pin the new definition).
    Changed {
        /// The pinned definition's digest.
        old_digest: String,
        /// The new one.
        new: Definition,
        /// The diff.
        diff: String,
    },
}

#[derive(Clone, Debug)]
struct Pinned {
    server: String,
    definition: Definition,
}

#[derive(Debug, Default)]
struct PinTable {
    pinned: HashMap<String, Pinned>,
    changes: HashMap<String, PendingChange>,
}

impl PinTable {
    fn any_blocked(&self) -> bool {
        self.changes.values().any(|c| c.blocked)
    }
}

/// Why a change could not be accepted.
#[derive(Debug, PartialEq, Eq)]
pub enum AcceptError {
    /// No change of that tool waits.
    Nothing,
    /// The change waiting is not the one named: its digest (the server changed it again).
    Other(String),
}

/// Every pin of an engine, and the changes waiting to be accepted: one table under one lock, so
/// that a listing, an acceptance and the "any tool held" flag never see each other half done.
#[derive(Debug, Default)]
pub struct Pins {
    table: Mutex<PinTable>,
    /// Whether any tool is blocked: calls look no further when none is (written under the
    /// table's lock).
    any_blocked: AtomicBool,
    /// Set when the pins could not be read back: tools first seen are then pinned for this
    /// process only, not recorded (a definition changed meanwhile must not become the pin).
    unloaded: AtomicBool,
}

impl Pins {
    /// Pins `definition` for `tool` as read back from the trail (the last one read wins).
    pub fn restore(&self, tool: &str, server: &str, definition: Definition) {
        self.table.lock().pinned.insert(
            tool.to_owned(),
            Pinned {
                server: server.to_owned(),
                definition,
            },
        );
    }

    /// The pins could not be read back from the trail.
    pub fn set_unloaded(&self) {
        self.unloaded.store(true, Ordering::Release);
    }

    /// Whether a tool first seen is to be recorded as pinned (the pins were read back, or
    /// there is no trail to read them from).
    pub fn records_first(&self) -> bool {
        !self.unloaded.load(Ordering::Acquire)
    }

    /// A server lists `spec` as `tool`: compares it with the pin and records what `on_change`
    /// makes of a difference.
    pub fn observe(
        &self,
        tool: &str,
        server: &str,
        spec: &ToolSpec,
        on_change: OnToolChange,
    ) -> Listed {
        let new = Definition::of(spec);
        let mut table = self.table.lock();
        let Some(pin) = table.pinned.get(tool) else {
            table.pinned.insert(
                tool.to_owned(),
                Pinned {
                    server: server.to_owned(),
                    definition: new.clone(),
                },
            );
            return Listed::First(new);
        };
        if pin.definition.digest == new.digest && pin.server == server {
            // Listed as pinned again (a change was undone): nothing is waiting any more.
            if table.changes.remove(tool).is_some() {
                self.any_blocked
                    .store(table.any_blocked(), Ordering::Release);
            }
            return Listed::Same;
        }
        if table
            .changes
            .get(tool)
            .is_some_and(|c| c.new.digest == new.digest && c.server == server)
        {
            return Listed::Same;
        }
        let mut diff = unified_diff(&pin.definition.lines(), &new.lines());
        if pin.server != server {
            diff = format!("server: {:?} → {server:?}\n{diff}", pin.server);
        }
        let old_digest = pin.definition.digest.clone();
        if on_change == OnToolChange::Accept {
            table.pinned.insert(
                tool.to_owned(),
                Pinned {
                    server: server.to_owned(),
                    definition: new.clone(),
                },
            );
            table.changes.remove(tool);
        } else {
            table.changes.insert(
                tool.to_owned(),
                PendingChange {
                    server: server.to_owned(),
                    old_digest: old_digest.clone(),
                    new: new.clone(),
                    diff: diff.clone(),
                    blocked: on_change == OnToolChange::Block,
                },
            );
        }
        self.any_blocked
            .store(table.any_blocked(), Ordering::Release);
        Listed::Changed {
            old_digest,
            new,
            diff,
        }
    }

    /// Whether calls of `tool` are held until its change is accepted.
    pub fn blocked(&self, tool: &str) -> bool {
        self.any_blocked.load(Ordering::Acquire)
            && self
                .table
                .lock()
                .changes
                .get(tool)
                .is_some_and(|c| c.blocked)
    }

    /// The change of `tool` waiting to be accepted, if any.
    pub fn change(&self, tool: &str) -> Option<PendingChange> {
        self.table.lock().changes.get(tool).cloned()
    }

    /// Accepts the waiting change of `tool` — only if its new definition's digest is
    /// `expected`, when given (the one a person looked at) — and pins it.
    pub fn accept(&self, tool: &str, expected: Option<&str>) -> Result<PendingChange, AcceptError> {
        let mut table = self.table.lock();
        let waiting = table.changes.get(tool).ok_or(AcceptError::Nothing)?;
        if let Some(expected) = expected
            && waiting.new.digest != expected
        {
            return Err(AcceptError::Other(waiting.new.digest.clone()));
        }
        let change = table.changes.remove(tool).ok_or(AcceptError::Nothing)?;
        table.pinned.insert(
            tool.to_owned(),
            Pinned {
                server: change.server.clone(),
                definition: change.new.clone(),
            },
        );
        self.any_blocked
            .store(table.any_blocked(), Ordering::Release);
        Ok(change)
    }
}

/// Past this many cells (old lines × new lines) a diff is not searched for the fewest changes: it
/// shows every old line removed and every new one added (a server can list a definition of any
/// size; the table must not be its to grow).
const DIFF_CELLS: usize = 1_000_000;

/// A unified diff of two texts' lines (one hunk around each run of changes, three lines of
/// context).
pub fn unified_diff(old: &[String], new: &[String]) -> String {
    // Longest common subsequence, by table: definitions are small.
    let (n, m) = (old.len(), new.len());
    if (n + 1).saturating_mul(m + 1) > DIFF_CELLS {
        let mut out = format!("--- pinned\n+++ listed\n@@ -1,{n} +1,{m} @@\n");
        for line in old {
            let _ = writeln!(out, "-{line}");
        }
        for line in new {
            let _ = writeln!(out, "+{line}");
        }
        return out;
    }
    let mut lcs = vec![vec![0u32; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if old[i] == new[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    // The edit script: (' ' | '-' | '+', old index, new index, line).
    let mut ops: Vec<(char, usize, usize, &str)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < n || j < m {
        if i < n && j < m && old[i] == new[j] {
            ops.push((' ', i, j, &old[i]));
            i += 1;
            j += 1;
        } else if i < n && (j == m || lcs[i + 1][j] >= lcs[i][j + 1]) {
            // What goes before what comes, as diffs show a replaced line.
            ops.push(('-', i, j, &old[i]));
            i += 1;
        } else {
            ops.push(('+', i, j, &new[j]));
            j += 1;
        }
    }
    const CONTEXT: usize = 3;
    let mut out = String::from("--- pinned\n+++ listed\n");
    let mut k = 0;
    while k < ops.len() {
        if ops[k].0 == ' ' {
            k += 1;
            continue;
        }
        // A hunk: from CONTEXT lines before this change to CONTEXT lines after the last change
        // that is at most 2·CONTEXT lines from the next.
        let start = k.saturating_sub(CONTEXT);
        let mut end = k;
        let mut last_change = k;
        while end < ops.len() {
            if ops[end].0 != ' ' {
                last_change = end;
            } else if end - last_change > 2 * CONTEXT {
                break;
            }
            end += 1;
        }
        let end = (last_change + CONTEXT + 1).min(ops.len());
        let hunk = &ops[start..end];
        let old_len = hunk.iter().filter(|o| o.0 != '+').count();
        let new_len = hunk.iter().filter(|o| o.0 != '-').count();
        let _ = writeln!(
            out,
            "@@ -{},{old_len} +{},{new_len} @@",
            hunk[0].1 + 1,
            hunk[0].2 + 1
        );
        for (op, _, _, line) in hunk {
            let _ = writeln!(out, "{op}{line}");
        }
        k = end;
    }
    out
}

#[cfg(test)]
mod tests;
