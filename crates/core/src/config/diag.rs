//! Diagnostics that point into the config file: key paths, line numbers, and the wording of
//! the TOML parser's errors.

use std::fmt;
use std::ops::Range;

use toml_edit::{Item, TableLike, Value};

/// A warning or error about the config, pointing at the file, the key and the line.
///
/// Displayed as `toolwarden.toml:12: servers.everything.timeout: invalid duration "10x": ...`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigDiagnostic {
    /// The file as the user named it (`toolwarden.toml`), or `environment` for an environment
    /// variable.
    pub file: String,
    /// The dotted key path (`servers.everything.timeout`, `servers.x.args[1]`), or the
    /// environment variable's name; empty when no key applies (a file that cannot be read).
    pub key: String,
    /// The 1-based line of the key in the file, when known.
    pub line: Option<usize>,
    /// What is wrong and what would be right.
    pub message: String,
}

impl fmt::Display for ConfigDiagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if !self.key.is_empty() {
            write!(f, ": {}", self.key)?;
        }
        write!(f, ": {}", self.message)
    }
}

/// What kind of mistake made the config unusable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConfigErrorKind {
    /// The file could not be read.
    Read,
    /// The file is not valid TOML.
    Syntax,
    /// A key that does not exist where it was written.
    UnknownKey,
    /// A value of the wrong type or out of range: a bad duration or size, an invalid choice
    /// (`approval = "maybe"`), a number too large.
    InvalidValue,
    /// `[tools."SERVER__TOOL"]` names a server that is not configured.
    UnknownServer,
    /// A server that is neither or both of `command` and `url`, or has a name that cannot work.
    InvalidServer,
    /// `[gateway] prefix = false` with more than one server.
    Prefix,
    /// A `${VAR}` that names an unset variable or is malformed.
    Variable,
    /// An environment override (`TOOLWARDEN_TOOL_TIMEOUT`) with a bad value.
    Environment,
}

/// A config that cannot be used. Its message names the file, the key and the line.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{diagnostic}")]
pub struct ConfigError {
    /// What kind of mistake it is.
    pub kind: ConfigErrorKind,
    /// Where it is and what would be right.
    pub diagnostic: ConfigDiagnostic,
}

/// One step of a key path: a table key or an array index.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Seg {
    Key(String),
    Index(usize),
}

/// Builds a key path from table keys.
pub(crate) fn path(keys: &[&str]) -> Vec<Seg> {
    keys.iter().map(|k| Seg::Key((*k).to_owned())).collect()
}

/// Formats a key path the way TOML would write it: `servers.x.timeout`, `tools."a.b".retries`,
/// `servers.x.args[1]`.
pub(crate) fn format_path(path: &[Seg]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                if is_bare_key(k) {
                    out.push_str(k);
                } else {
                    out.push_str(&format!("{k:?}"));
                }
            }
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

fn is_bare_key(k: &str) -> bool {
    !k.is_empty()
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Where every key of the file is: built once from the parsed document, then looked up for
/// every error and warning.
#[derive(Clone, Debug, Default)]
pub(crate) struct SourceMap {
    entries: Vec<KeyPlace>,
    line_starts: Vec<usize>,
}

#[derive(Clone, Debug)]
struct KeyPlace {
    path: Vec<Seg>,
    key: Option<Range<usize>>,
    value: Option<Range<usize>>,
}

impl SourceMap {
    /// Indexes every key and array element of `doc`, parsed from `src`.
    pub(crate) fn new(src: &str, doc: &toml_edit::Document<String>) -> Self {
        let mut map = Self {
            entries: Vec::new(),
            line_starts: line_starts(src),
        };
        map.walk_table(doc.as_table(), &mut Vec::new());
        map
    }

    /// A map of no file: every line is unknown.
    pub(crate) fn empty() -> Self {
        Self::default()
    }

    fn walk_table(&mut self, table: &dyn TableLike, at: &mut Vec<Seg>) {
        for (name, item) in table.iter() {
            let key = table.get_key_value(name).and_then(|(k, _)| k.span());
            at.push(Seg::Key(name.to_owned()));
            self.entries.push(KeyPlace {
                path: at.clone(),
                key,
                value: item.span(),
            });
            self.walk_item(item, at);
            at.pop();
        }
    }

    fn walk_item(&mut self, item: &Item, at: &mut Vec<Seg>) {
        match item {
            Item::Table(t) => self.walk_table(t, at),
            Item::Value(v) => self.walk_value(v, at),
            Item::ArrayOfTables(a) => {
                for (i, t) in a.iter().enumerate() {
                    at.push(Seg::Index(i));
                    self.entries.push(KeyPlace {
                        path: at.clone(),
                        key: None,
                        value: t.span(),
                    });
                    self.walk_table(t, at);
                    at.pop();
                }
            }
            Item::None => {}
        }
    }

    fn walk_value(&mut self, value: &Value, at: &mut Vec<Seg>) {
        match value {
            Value::InlineTable(t) => self.walk_table(t, at),
            Value::Array(a) => {
                for (i, v) in a.iter().enumerate() {
                    at.push(Seg::Index(i));
                    self.entries.push(KeyPlace {
                        path: at.clone(),
                        key: None,
                        value: v.span(),
                    });
                    self.walk_value(v, at);
                    at.pop();
                }
            }
            _ => {}
        }
    }

    /// The 1-based line of a byte offset.
    pub(crate) fn line_of_offset(&self, offset: usize) -> Option<usize> {
        if self.line_starts.is_empty() {
            return None;
        }
        Some(self.line_starts.partition_point(|&start| start <= offset))
    }

    /// The line where `path` is written: its key, else its value; for a key that is not
    /// written, the line of its nearest written parent.
    pub(crate) fn line(&self, path: &[Seg]) -> Option<usize> {
        (1..=path.len()).rev().find_map(|n| {
            let entry = self.entries.iter().find(|e| e.path == path[..n])?;
            let span = entry.key.as_ref().or(entry.value.as_ref())?;
            self.line_of_offset(span.start)
        })
    }

    /// The innermost key whose key or value contains `offset` (of two with the same span, the
    /// outer one: an array of tables and its first table).
    pub(crate) fn path_at(&self, offset: usize) -> Option<&[Seg]> {
        let width = |s: &Option<Range<usize>>| {
            s.as_ref()
                .filter(|s| s.contains(&offset))
                .map(|s| s.end - s.start)
        };
        self.entries
            .iter()
            .filter_map(|e| {
                let w = match (width(&e.key), width(&e.value)) {
                    (Some(a), Some(b)) => a.min(b),
                    (a, b) => a.or(b)?,
                };
                Some((w, e.path.len(), e.path.as_slice()))
            })
            .min_by_key(|(w, depth, _)| (*w, *depth))
            .map(|(_, _, p)| p)
    }
}

fn line_starts(src: &str) -> Vec<usize> {
    std::iter::once(0)
        .chain(src.match_indices('\n').map(|(i, _)| i + 1))
        .collect()
}

/// The key a syntax error is at, guessed from the text (the document did not parse): the last
/// `[table]` header above the line, plus the key written on the line itself.
pub(crate) fn guess_key_at_line(src: &str, line: usize) -> String {
    let lines: Vec<&str> = src.lines().collect();
    let upto = line.min(lines.len());
    let header = lines[..upto.saturating_sub(1)]
        .iter()
        .rev()
        .map(|l| l.trim())
        .find(|l| l.starts_with('['))
        .map(|l| {
            l.trim_start_matches('[')
                .split(']')
                .next()
                .unwrap_or_default()
                .trim()
                .to_owned()
        });
    let here = lines.get(line.saturating_sub(1)).map(|l| l.trim());
    let key_here = here.and_then(|l| {
        if l.starts_with('[') {
            let inner = l.trim_start_matches('[').split(']').next()?.trim();
            return Some((inner.to_owned(), true));
        }
        let (k, _) = l.split_once('=')?;
        let k = k.trim();
        (!k.is_empty() && !k.starts_with('#')).then(|| (k.to_owned(), false))
    });
    match (header, key_here) {
        (_, Some((k, true))) => k,
        (Some(h), Some((k, false))) => format!("{h}.{k}"),
        (None, Some((k, false))) => k,
        (Some(h), None) => h,
        (None, None) => String::new(),
    }
}

/// Rewords a message of the TOML deserializer so that it says what would be right, in the
/// config's terms (keys, not fields; choices, not variants). Returns whether it is about an
/// unknown key.
pub(crate) fn reword(message: &str) -> (String, bool) {
    let message = message.trim().replace('\n', "; ");
    if let Some(rest) = message.strip_prefix("unknown field `") {
        let (name, tail) = rest.split_once('`').unwrap_or((rest, ""));
        let expected = backticked(tail);
        return (unknown_key_message(name, &expected), true);
    }
    if let Some(rest) = message.strip_prefix("unknown variant `") {
        let (name, tail) = rest.split_once('`').unwrap_or((rest, ""));
        let expected = backticked(tail);
        let choices = expected
            .iter()
            .map(|c| format!("{c:?}"))
            .collect::<Vec<_>>()
            .join(", ");
        return (
            format!("invalid value {name:?}: expected one of {choices}"),
            false,
        );
    }
    let message = message
        .replace("invalid type: sequence", "invalid type: array")
        .replace("invalid type: map", "invalid type: table")
        .replace("expected i64", "expected an integer")
        .replace("expected u64", "expected a non-negative integer")
        .replace("expected f64", "expected a number")
        .replace("expected a string", "expected a string (in quotes)")
        .replace("expected a sequence", "expected an array")
        .replace("expected a map", "expected a table")
        .replace("expected struct ", "expected a table: ");
    (message, false)
}

/// "unknown key": with the closest valid key when one is near, else every valid key.
pub(crate) fn unknown_key_message(name: &str, expected: &[String]) -> String {
    match closest(name, expected.iter().map(String::as_str)) {
        Some(near) => format!("unknown key {name:?}: did you mean {near:?}?"),
        None if expected.is_empty() => format!("unknown key {name:?}: no keys are allowed here"),
        None => format!(
            "unknown key {name:?}: expected one of {}",
            expected.join(", ")
        ),
    }
}

fn backticked(s: &str) -> Vec<String> {
    s.split('`').skip(1).step_by(2).map(str::to_owned).collect()
}

pub(crate) use crate::suggest::closest;
