//! What the trail keeps of an event: its JSON as `/v1/events` sends it, with the values of keys
//! named like secrets masked and large payloads truncated (docs/AUDIT.md).
//!
//! Only payloads are touched — a call's input, its result's content, a turn's results, a hook's
//! arguments, an interaction's input and details — never the event's own fields. Most events carry no payload, or a small
//! one without any key that looks like a secret: those are written as they serialize, without
//! being parsed back. Whether any key looks like a secret is seen while the event is serialized
//! (`KeyWatch`): only the keys are looked at, as serde_json writes them.

use std::io;

use serde::Serialize;
use serde_json::ser::{CharEscape, CompactFormatter, Formatter};
use serde_json::{Map, Value};
use toolwarden_protocol::{Event, EventKind};

/// What a masked value is replaced with.
pub const MASKED: &str = "[MASKED]";

/// The default keys whose values are masked.
pub const DEFAULT_MASK_KEYS: [&str; 5] =
    ["password", "token", "secret", "api_key", "authorization"];

/// Masks and truncates events' payloads.
#[derive(Clone, Debug)]
pub struct Redactor {
    /// Lower-case words; a key containing one (ignoring case, `-` read as `_`) is masked.
    words: Vec<String>,
    /// Each word's bytes as a set (`byte_set`): a key can hold the word only if it holds them.
    sets: Vec<u64>,
    /// A word holds a character JSON escapes (`"`, `\`, a control character): it could then
    /// match across an escape in a key, which `KeyWatch` sees in pieces, so every payload is
    /// parsed and masked.
    escaped_words: bool,
    max_payload: usize,
}

/// The bytes of `text` as a set of 64, case and `-`/`_` folded the way words match them (two
/// bytes may share a place: the set can only tell that a byte is absent).
fn byte_set(text: &[u8]) -> u64 {
    text.iter()
        .fold(0, |set, b| set | BYTE_BIT[usize::from(*b)])
}

/// Each byte's place in a `byte_set`.
const BYTE_BIT: [u64; 256] = {
    let mut bits = [0; 256];
    let mut b = 0;
    while b < 256 {
        let folded = if b as u8 == b'-' {
            b'_'
        } else {
            (b as u8).to_ascii_lowercase()
        };
        bits[b] = 1 << (folded % 64);
        b += 1;
    }
    bits
};

/// Whether `word` is in `text` at `start`, ignoring case, a `_` in it matching `-` too.
fn word_at(text: &[u8], start: usize, word: &[u8]) -> bool {
    text.get(start..start + word.len()).is_some_and(|window| {
        window
            .iter()
            .zip(word)
            .all(|(a, b)| a.eq_ignore_ascii_case(b) || (*b == b'_' && *a == b'-'))
    })
}

impl Redactor {
    /// Masks keys containing any of `words`; truncates payloads longer than `max_payload` bytes
    /// of JSON.
    pub fn new(words: &[String], max_payload: usize) -> Self {
        let words: Vec<String> = words
            .iter()
            .map(|w| w.to_ascii_lowercase().replace('-', "_"))
            .filter(|w| !w.is_empty())
            .collect();
        let escaped_words = words
            .iter()
            .any(|w| w.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20));
        let sets = words.iter().map(|w| byte_set(w.as_bytes())).collect();
        Self {
            words,
            sets,
            escaped_words,
            max_payload,
        }
    }

    /// The event's JSON as the trail stores it.
    pub fn body(&self, event: &Event) -> String {
        let payloads = payloads(&event.kind);
        let mut secret_like = self.escaped_words;
        // Sized for a call's usual events (200–600 bytes): no regrowth for most.
        let mut out = Vec::with_capacity(512);
        let watch = KeyWatch {
            redactor: (!payloads.is_empty() && !secret_like).then_some(self),
            key: Key::Outside,
            depth: 0,
            secret_like: &mut secret_like,
        };
        let written = event.serialize(&mut serde_json::Serializer::with_formatter(&mut out, watch));
        let text = match (written, String::from_utf8(out)) {
            (Ok(()), Ok(text)) => text,
            _ => return "{}".to_owned(),
        };
        if payloads.is_empty() || (text.len() <= self.max_payload && !secret_like) {
            return text;
        }
        self.masked(event, &text, payloads)
    }

    /// The body with its payloads masked and fitted: the event parsed back, changed, written
    /// again.
    fn masked(&self, event: &Event, text: &str, payloads: &[&[&str]]) -> String {
        let Ok(mut value) = serde_json::from_str::<Value>(text) else {
            return text.to_owned();
        };
        for path in payloads {
            let Some(payload) = pointer_mut(&mut value, path) else {
                continue;
            };
            self.mask(payload);
            if matches!(event.kind, EventKind::TurnEnd { .. }) {
                // Each result on its own: a turn of many small results keeps them all.
                if let Value::Array(results) = payload {
                    for result in results {
                        for field in ["content", "structured_content"] {
                            if let Some(v) = result.get_mut(field) {
                                self.fit(v);
                            }
                        }
                    }
                }
            } else {
                self.fit(payload);
            }
        }
        serde_json::to_string(&value).unwrap_or_else(|_| text.to_owned())
    }

    /// Whether a key (or an unescaped piece of one) contains a word. Most keys lack a byte of
    /// every word, which their byte sets show without a search.
    fn masks(&self, key: &[u8]) -> bool {
        let has = byte_set(key);
        (self.words.iter().zip(&self.sets)).any(|(w, set)| {
            *set & !has == 0 && (0..key.len()).any(|i| word_at(key, i, w.as_bytes()))
        })
    }

    /// Replaces the values of secret-like keys, at any depth.
    fn mask(&self, value: &mut Value) {
        match value {
            Value::Object(map) => {
                for (key, v) in map.iter_mut() {
                    if self.masks(key.as_bytes()) {
                        *v = Value::String(MASKED.to_owned());
                    } else {
                        self.mask(v);
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|v| self.mask(v)),
            _ => {}
        }
    }

    /// Replaces a payload longer than the limit by `{"truncated": true, "bytes": N, "head": ...}`:
    /// its size and the first `max_payload` bytes of its JSON.
    fn fit(&self, value: &mut Value) {
        let text = value.to_string();
        if text.len() <= self.max_payload {
            return;
        }
        let mut end = self.max_payload;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let mut marker = Map::new();
        marker.insert("truncated".into(), Value::Bool(true));
        marker.insert("bytes".into(), Value::from(text.len()));
        marker.insert("head".into(), Value::String(text[..end].to_owned()));
        *value = Value::Object(marker);
    }
}

/// Where an event's payloads sit in its JSON.
fn payloads(kind: &EventKind) -> &'static [&'static [&'static str]] {
    match kind {
        EventKind::ToolStart { .. } => &[&["input"]],
        EventKind::ToolResult { .. } => &[&["content"], &["structured_content"]],
        EventKind::TurnEnd { .. } => &[&["results"]],
        EventKind::HookDecision { .. } => &[&["original_args"], &["args"]],
        EventKind::InteractionRequested { .. } => {
            &[&["interaction", "input"], &["interaction", "details"]]
        }
        _ => &[],
    }
}

/// serde_json's compact form, watching the object keys as they are written: `secret_like` is
/// set when one contains a word.
///
/// A key written as a string comes as unescaped pieces, each followed by an escape or by the
/// key's end; no word holds an escaped character (else nothing is watched), so a word in such a
/// key lies within one piece. Anything else counts as secret-like, and the body is then parsed
/// and masked, which is never wrong, only slower: a key written in no piece (empty, or a
/// number), two pieces in a row (a key written by `Display`, in parts), raw JSON (which comes
/// with no keys at all).
struct KeyWatch<'a> {
    /// `None`: nothing to watch (an event without a payload, or every payload parsed anyway).
    redactor: Option<&'a Redactor>,
    key: Key,
    /// How many objects the writer is in. The event is one object (its scope and kind are
    /// flattened into it), so its own keys are at 1, and a payload's keys below.
    depth: u32,
    secret_like: &'a mut bool,
}

/// Where the writer is in a key that is watched.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Key {
    /// Not in one (or not watching).
    Outside,
    /// At its start.
    Started,
    /// After an unescaped piece.
    AfterPiece,
    /// After an escape.
    AfterEscape,
}

impl Formatter for KeyWatch<'_> {
    fn begin_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.depth += 1;
        CompactFormatter.begin_object(w)
    }

    fn end_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.depth = self.depth.saturating_sub(1);
        CompactFormatter.end_object(w)
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if self.redactor.is_some() && self.depth > 1 {
            self.key = Key::Started;
        }
        CompactFormatter.begin_object_key(w, first)
    }

    fn end_object_key<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        if std::mem::replace(&mut self.key, Key::Outside) == Key::Started {
            *self.secret_like = true;
        }
        CompactFormatter.end_object_key(w)
    }

    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        piece: &str,
    ) -> io::Result<()> {
        if self.key != Key::Outside
            && let Some(redactor) = self.redactor
        {
            if self.key == Key::AfterPiece || redactor.masks(piece.as_bytes()) {
                *self.secret_like = true;
            }
            self.key = Key::AfterPiece;
        }
        w.write_all(piece.as_bytes())
    }

    fn write_char_escape<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        escape: CharEscape,
    ) -> io::Result<()> {
        if self.key != Key::Outside {
            self.key = Key::AfterEscape;
        }
        CompactFormatter.write_char_escape(w, escape)
    }

    fn write_raw_fragment<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        if self.redactor.is_some() {
            *self.secret_like = true;
        }
        CompactFormatter.write_raw_fragment(w, fragment)
    }
}

fn pointer_mut<'a>(value: &'a mut Value, path: &[&str]) -> Option<&'a mut Value> {
    path.iter().try_fold(value, |v, key| v.get_mut(*key))
}

/// One event, serialized and redacted, ready to write.
pub(crate) struct RedactedEvent<'a> {
    pub(crate) event: &'a Event,
    pub(crate) body: String,
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use pretty_assertions::assert_eq;
    use proptest::prelude::*;
    use serde_json::json;
    use toolwarden_protocol::{EventScope, Timestamp};

    use super::*;

    fn start(input: Value) -> Event {
        Event {
            seq: 1,
            ts: Timestamp::from_unix_millis(0),
            scope: Arc::new(EventScope::default()),
            kind: EventKind::ToolStart {
                input: Arc::new(input),
                timeout_ms: 1,
                idle_timeout_ms: 0,
            },
        }
    }

    fn check(redactor: &Redactor, input: Value, stored: Value) {
        let body: Value = serde_json::from_str(&redactor.body(&start(input))).unwrap();
        assert_eq!(body["input"], stored);
    }

    #[test]
    fn a_hooks_rewritten_arguments_are_masked_as_a_calls_input_is() {
        let words: Vec<String> = DEFAULT_MASK_KEYS.iter().map(|s| (*s).to_owned()).collect();
        let r = Redactor::new(&words, 1000);
        let event = Event {
            seq: 1,
            ts: Timestamp::from_unix_millis(0),
            scope: Arc::new(EventScope::default()),
            kind: EventKind::HookDecision {
                hook: "review".into(),
                decision: toolwarden_protocol::RuleDecision::Allow,
                duration_ms: 3,
                rewritten: true,
                reason: None,
                failed: false,
                original_args: Some(json!({"user": "a", "password": "hunter2"})),
                args: Some(json!({"user": "b", "api_key": "k"})),
            },
        };
        let body: Value = serde_json::from_str(&r.body(&event)).unwrap();
        assert_eq!(
            body["original_args"],
            json!({"user": "a", "password": MASKED})
        );
        assert_eq!(body["args"], json!({"user": "b", "api_key": MASKED}));
        assert_eq!(body["hook"], "review");
    }

    fn words(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_key_holds_a_word_whatever_its_case_and_dashes() {
        let r = Redactor::new(&words(&["password", "api_key", "_x"]), 1000);
        for key in ["PassWord", "x-api-KEY", "api_key", "a-X", "my_password2"] {
            assert!(r.masks(key.as_bytes()), "{key}");
        }
        for key in ["key", "api", "pass", "api key", "ax", ""] {
            assert!(!r.masks(key.as_bytes()), "{key}");
        }
    }

    /// A key: a few random characters, or a mask word (in random case, a `_` written `-` or
    /// not, now and then a character JSON escapes put inside it) between random characters.
    fn key() -> impl Strategy<Value = String> {
        let filler = "[a-zA-Z_\\-\"\\\\\u{1}é]{0,4}";
        let word = (
            prop::sample::select(vec!["password", "token", "api_key", "secret", "k", "_x"]),
            any::<u64>(),
            prop::option::of(0..8usize),
            prop::sample::select(vec!['"', '\\', '\u{1}', 'é']),
        )
            .prop_map(|(word, flips, at, inside)| {
                let flip = |i: usize| (flips >> (i % 64)) & 1 == 1;
                let mut out: String = (word.chars().enumerate())
                    .map(|(i, c)| match c {
                        '_' if flip(i) => '-',
                        c if flip(i) => c.to_ascii_uppercase(),
                        c => c,
                    })
                    .collect();
                if let Some(at) = at.filter(|at| *at <= out.len()) {
                    out.insert(at, inside);
                }
                out
            });
        prop_oneof![
            filler.prop_map(String::from),
            (filler, word, filler).prop_map(|(a, w, b)| format!("{a}{w}{b}")),
        ]
    }

    /// Values nested a few levels, with such keys.
    fn payload() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![Just(Value::Null), "[a-z]{0,4}".prop_map(Value::from)];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                prop::collection::vec((key(), inner), 0..4)
                    .prop_map(|entries| Value::Object(entries.into_iter().collect())),
            ]
        })
    }

    /// Every kind of event with a payload, each carrying `p` (or `q`) where its payload goes.
    fn events_carrying(p: &Value, q: &Value) -> Vec<Event> {
        let scope = json!({"session_id": "s", "turn_id": "t", "call_id": "c", "tool": "echo"});
        let outcome = json!({"status": "ok", "attempts": 1, "call_id": "c", "turn_id": "t",
                             "tool": "echo", "duration_ms": 0});
        let result = json!({"outcome": outcome, "content": [{"type": "text", "text": "hi"}],
                            "structured_content": p, "is_error": false});
        let mut tool_result = json!({"seq": 1, "ts": "2026-11-28T09:54:17.771Z",
                                     "type": "tool_result", "duration_ms": 0});
        let mut interaction = json!({"id": "i", "kind": "approval", "message": "may it?",
                                     "input": p, "details": q, "timeout_ms": 1,
                                     "created_at": "2026-11-28T09:54:17.771Z",
                                     "deadline": "2026-11-28T09:54:17.772Z"});
        for (key, value) in scope.as_object().unwrap() {
            tool_result[key] = value.clone();
            interaction[key] = value.clone();
        }
        for (key, value) in result.as_object().unwrap() {
            tool_result[key] = value.clone();
        }
        let read = |v: Value| serde_json::from_value::<Event>(v).unwrap();
        let hook = Event {
            kind: EventKind::HookDecision {
                hook: "h".into(),
                decision: toolwarden_protocol::RuleDecision::Allow,
                duration_ms: 1,
                rewritten: true,
                reason: None,
                failed: false,
                original_args: Some(p.clone()),
                args: Some(q.clone()),
            },
            ..start(Value::Null)
        };
        vec![
            start(p.clone()),
            hook,
            read(tool_result),
            read(
                json!({"seq": 2, "ts": "2026-11-28T09:54:17.771Z", "type": "turn_end",
                        "turn_id": "t", "outcome": "completed", "results": [result]}),
            ),
            read(json!({"seq": 3, "ts": "2026-11-28T09:54:17.771Z",
                        "type": "interaction_requested", "interaction": interaction})),
        ]
    }

    /// The body masking and fitting every payload gives, parsed.
    fn parsed_masked_always(r: &Redactor, event: &Event) -> Value {
        let text = serde_json::to_string(event).unwrap();
        serde_json::from_str(&r.masked(event, &text, payloads(&event.kind))).unwrap()
    }

    proptest! {
        /// Watching the keys as the event is written decides as parsing every body would:
        /// the stored body is the same either way.
        #[test]
        fn a_body_is_what_masking_every_payload_gives(
            p in payload(),
            q in payload(),
            word_set in 0..4usize,
            max_payload in prop_oneof![4 => Just(1usize << 20), 1 => 8..400usize],
        ) {
            let list: &[&str] = match word_set {
                0 => &["password", "token", "api_key", "secret"],
                1 => &["k", "-"],
                2 => &["_x", "ToKeN"],
                // A word with a character JSON escapes: every payload is parsed.
                _ => &["e\"x"],
            };
            let r = Redactor::new(&words(list), max_payload);
            for event in events_carrying(&p, &q) {
                let body: Value = serde_json::from_str(&r.body(&event)).unwrap();
                prop_assert_eq!(body, parsed_masked_always(&r, &event));
            }
        }
    }

    #[test]
    fn a_word_beside_an_escape_is_found_and_one_broken_by_it_is_not() {
        let r = Redactor::new(&words(&["password"]), 1 << 20);
        let body = |key: &str| {
            let input = Value::Object(Map::from_iter([(key.to_owned(), json!("v"))]));
            let body: Value = serde_json::from_str(&r.body(&start(input))).unwrap();
            body["input"][key].clone()
        };
        assert_eq!(body("x\"PassWord\n"), MASKED);
        assert_eq!(body("pass\"word"), "v");
        assert_eq!(body("pass\u{1}word"), "v");
    }

    #[test]
    fn an_event_without_a_payload_or_a_secret_is_stored_as_it_serializes() {
        let r = Redactor::new(&words(&DEFAULT_MASK_KEYS), 1000);
        let event = start(json!({"path": "a.txt", "n": {"deep": [1, 2]}}));
        assert_eq!(r.body(&event), serde_json::to_string(&event).unwrap());
    }

    #[test]
    fn secret_like_keys_are_masked_at_any_depth_and_large_payloads_truncated() {
        let words: Vec<String> = DEFAULT_MASK_KEYS.iter().map(|s| (*s).to_owned()).collect();
        let r = Redactor::new(&words, 1000);
        check(&r, json!({"path": "a.txt"}), json!({"path": "a.txt"}));
        check(
            &r,
            json!({"api_key": "sk-1", "headers": {"Authorization": "Bearer x", "X-Api-Key": 3},
                   "list": [{"db_password": "p"}], "note": "token"}),
            json!({"api_key": MASKED, "headers": {"Authorization": MASKED, "X-Api-Key": MASKED},
                   "list": [{"db_password": MASKED}], "note": "token"}),
        );
        let r = Redactor::new(&words, 64);
        let big = "x".repeat(100);
        let stored = format!("{{\"text\":\"{big}\"}}");
        check(
            &r,
            json!({"text": big}),
            json!({"truncated": true, "bytes": stored.len(), "head": &stored[..64]}),
        );
        // Masking comes first: a secret is never in a truncated head.
        let r = Redactor::new(&words, 16);
        let body = r.body(&start(json!({"token": "abcdefghijklmnopqrstuvwxyz"})));
        assert!(!body.contains("abcdefghij"), "{body}");
    }
}
