//! What the trail keeps of an event: its JSON as `/v1/events` sends it, with the values of keys
//! named like secrets masked and large payloads truncated (docs/AUDIT.md).
//!
//! Only payloads are touched — a call's input, its result's content, a turn's results, an
//! interaction's input — never the event's own fields. Most events carry no payload, or a small
//! one without any key that looks like a secret: those are written as they serialize, without
//! being parsed back.

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
    /// The bytes a word starts with, in either case.
    firsts: [bool; 256],
    /// Each word with the letter it is looked for by; `None` when a word has none (it is all
    /// `_`), and texts are then scanned byte by byte.
    anchors: Option<Vec<Anchor>>,
    max_payload: usize,
}

/// A word and its rarest letter in JSON text: the letter is found with a vectorised search
/// (`memchr`), and the word compared only where it sits.
#[derive(Clone, Debug)]
struct Anchor {
    word: Vec<u8>,
    /// Where the letter is in the word.
    at: usize,
    lower: u8,
    upper: u8,
}

impl Anchor {
    /// Letters from the most to the least common in English, and so roughly in JSON keys;
    /// digits count as more common than any (numbers, times, digests).
    const COMMON: &'static [u8] = b"0123456789etaoinsrhldcumfpgwybvkxjqz";

    fn of(word: &str) -> Option<Anchor> {
        let rarity = |b: u8| match Self::COMMON.iter().position(|c| *c == b) {
            Some(rank) => rank,
            None => Self::COMMON.len(),
        };
        // `_` also matches `-`: never the letter searched for.
        let (at, &b) = word
            .as_bytes()
            .iter()
            .enumerate()
            .filter(|(_, b)| **b != b'_')
            .max_by_key(|(i, b)| (rarity(**b), std::cmp::Reverse(*i)))?;
        Some(Anchor {
            word: word.as_bytes().to_vec(),
            at,
            lower: b.to_ascii_lowercase(),
            upper: b.to_ascii_uppercase(),
        })
    }

    fn in_text(&self, text: &[u8]) -> bool {
        memchr::memchr2_iter(self.lower, self.upper, text)
            .any(|p| p >= self.at && word_at(text, p - self.at, &self.word))
    }
}

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
        let mut firsts = [false; 256];
        for w in &words {
            if let Some(&b) = w.as_bytes().first() {
                firsts[usize::from(b.to_ascii_lowercase())] = true;
                firsts[usize::from(b.to_ascii_uppercase())] = true;
                if b == b'_' {
                    // `_` in a word also matches `-` in the text, its first letter too.
                    firsts[usize::from(b'-')] = true;
                }
            }
        }
        let anchors = words.iter().map(|w| Anchor::of(w)).collect();
        Self {
            words,
            firsts,
            anchors,
            max_payload,
        }
    }

    /// The event's JSON as the trail stores it.
    pub fn body(&self, event: &Event) -> String {
        let text = serde_json::to_string(event).unwrap_or_else(|_| "{}".to_owned());
        let payloads: &[&[&str]] = match &event.kind {
            EventKind::ToolStart { .. } => &[&["input"]],
            EventKind::ToolResult { .. } => &[&["content"], &["structured_content"]],
            EventKind::TurnEnd { .. } => &[&["results"]],
            EventKind::HookDecision { .. } => &[&["original_args"], &["args"]],
            EventKind::InteractionRequested { .. } => {
                &[&["interaction", "input"], &["interaction", "details"]]
            }
            _ => return text,
        };
        if text.len() <= self.max_payload && !self.mentions_a_word(&text) {
            return text;
        }
        let Ok(mut value) = serde_json::from_str::<Value>(&text) else {
            return text;
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
        serde_json::to_string(&value).unwrap_or(text)
    }

    /// Whether `text` contains any mask word (ignoring case): a cheap test before parsing. Each
    /// word's rarest letter is searched for, and the word compared where it is; a word without
    /// a letter makes it one pass over the text, comparing the words where one's first letter
    /// is.
    fn mentions_a_word(&self, text: &str) -> bool {
        let bytes = text.as_bytes();
        match &self.anchors {
            Some(anchors) => anchors.iter().any(|a| a.in_text(bytes)),
            None => bytes.iter().enumerate().any(|(i, b)| {
                self.firsts[usize::from(*b)]
                    && self.words.iter().any(|w| word_at(bytes, i, w.as_bytes()))
            }),
        }
    }

    fn masks(&self, key: &str) -> bool {
        let key = key.to_ascii_lowercase().replace('-', "_");
        self.words.iter().any(|w| key.contains(w.as_str()))
    }

    /// Replaces the values of secret-like keys, at any depth.
    fn mask(&self, value: &mut Value) {
        match value {
            Value::Object(map) => {
                for (key, v) in map.iter_mut() {
                    if self.masks(key) {
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

    #[test]
    fn a_text_mentions_a_word_whatever_its_case_and_dashes() {
        let words: Vec<String> = ["password", "api_key", "_x"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        let r = Redactor::new(&words, 1000);
        for text in [
            r#"{"PassWord":1}"#,
            r#"{"x-api-KEY":1}"#,
            r#"{"api_key":1}"#,
            "a-X",
        ] {
            assert!(r.mentions_a_word(text), "{text}");
        }
        for text in [
            r#"{"key":1,"api":2,"pass":3}"#,
            r#"{"api key":1}"#,
            "ax",
            "",
        ] {
            assert!(!r.mentions_a_word(text), "{text}");
        }
    }

    #[test]
    fn the_anchored_search_finds_what_a_scan_of_every_place_finds() {
        let words: Vec<String> = ["password", "api_key", "_x", "token", "a_b_"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        let r = Redactor::new(&words, 1000);
        assert!(r.anchors.is_some());
        let everywhere = |text: &[u8]| {
            (0..text.len()).any(|i| r.words.iter().any(|w| word_at(text, i, w.as_bytes())))
        };
        // Texts drawn from the words' own letters, both cases, `_` and `-`.
        let alphabet = b"pasSwWordDapiIKkeyY_-xXtToOkKnNbB";
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let (mut found, mut missed) = (0, 0);
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let len = (seed % 12) as usize;
            let text: Vec<u8> = (0..len)
                .map(|k| alphabet[((seed >> (4 * k % 60)) as usize + k) % alphabet.len()])
                .collect();
            let expected = everywhere(&text);
            let text = String::from_utf8(text).unwrap();
            assert_eq!(r.mentions_a_word(&text), expected, "{text:?}");
            if expected { found += 1 } else { missed += 1 }
        }
        assert!(found > 100 && missed > 100, "{found} found, {missed} not");
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
