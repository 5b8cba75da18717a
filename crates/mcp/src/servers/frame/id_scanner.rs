//! The id scanner: which request a broken or oversized line answers. A line that does not parse
//! cannot be asked for its `"id"`, so this reads the top-level one from the bytes as they come,
//! without buffering the message and without needing the rest of it.

use std::str::FromStr as _;

use rmcp::model::{NumberOrString, RequestId};

/// A UTF-8 byte order mark, which a line may start with.
pub(super) const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Finds the top-level `"id"` of a JSON object from its bytes, fed in pieces, without
/// buffering the message: works on truncated frames (if the id came before the cut) and on
/// oversized ones (wherever the id is).
#[derive(Default)]
pub(crate) struct IdScanner {
    started: bool,
    dead: bool,
    depth: u32,
    in_string: bool,
    escape: bool,
    expect_key: bool,
    capturing_key: bool,
    key_done: bool,
    key: Vec<u8>,
    value: Value_,
    found: Option<RequestId>,
}

#[derive(Default, PartialEq)]
enum Value_ {
    #[default]
    None,
    Start,
    Str(Vec<u8>),
    Num(Vec<u8>),
}

impl IdScanner {
    /// Scans one whole (possibly broken) frame.
    pub(crate) fn scan(bytes: &[u8]) -> Option<RequestId> {
        let mut s = Self::default();
        s.feed(bytes);
        s.finish()
    }

    /// Feeds the next bytes.
    pub(crate) fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.dead || self.found.is_some() {
                return;
            }
            self.step(b);
        }
    }

    /// The id, if one was found (a number cut off at the end of the input counts).
    pub(crate) fn finish(mut self) -> Option<RequestId> {
        if self.found.is_none()
            && let Value_::Num(digits) = &self.value
        {
            self.found = parse_number(digits);
        }
        self.found
    }

    fn step(&mut self, b: u8) {
        if !self.started {
            if b.is_ascii_whitespace() || BOM.contains(&b) {
                return;
            }
            if b == b'{' {
                self.started = true;
                self.depth = 1;
                self.expect_key = true;
            } else {
                self.dead = true;
            }
            return;
        }
        match &mut self.value {
            Value_::None => {}
            Value_::Start => {
                if b.is_ascii_whitespace() {
                    return;
                }
                if b == b'"' {
                    self.value = Value_::Str(Vec::new());
                } else if b == b'-' || b.is_ascii_digit() {
                    self.value = Value_::Num(vec![b]);
                } else {
                    // `null` or a structure: not an id we can route.
                    self.dead = true;
                }
                return;
            }
            Value_::Str(s) => {
                let byte = if self.escape {
                    self.escape = false;
                    // A `\uXXXX` escape is not decoded: no id of ours is written that way.
                    unescape(b)
                } else if b == b'\\' {
                    self.escape = true;
                    return;
                } else if b == b'"' {
                    self.found = std::str::from_utf8(s)
                        .ok()
                        .map(|s| NumberOrString::String(s.into()));
                    self.dead = self.found.is_none();
                    return;
                } else {
                    Some(b)
                };
                match byte {
                    Some(byte) if s.len() < 256 => s.push(byte),
                    _ => self.dead = true,
                }
                return;
            }
            Value_::Num(digits) => {
                if b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.' | b'e' | b'E') {
                    if digits.len() < 32 {
                        digits.push(b);
                    }
                } else {
                    self.found = parse_number(digits);
                    self.dead = self.found.is_none();
                }
                return;
            }
        }
        if self.in_string {
            if self.escape {
                self.escape = false;
                if self.capturing_key {
                    self.key.push(b);
                }
            } else if b == b'\\' {
                self.escape = true;
            } else if b == b'"' {
                self.in_string = false;
                if self.capturing_key {
                    self.capturing_key = false;
                    self.key_done = true;
                }
            } else if self.capturing_key && self.key.len() < 8 {
                self.key.push(b);
            }
            return;
        }
        match b {
            b'"' => {
                self.in_string = true;
                if self.depth == 1 && self.expect_key {
                    self.expect_key = false;
                    self.capturing_key = true;
                    self.key.clear();
                }
            }
            b':' if self.depth == 1 && self.key_done => {
                self.key_done = false;
                if self.key == b"id" {
                    self.value = Value_::Start;
                }
            }
            b',' if self.depth == 1 => {
                self.expect_key = true;
                self.key_done = false;
            }
            b'{' | b'[' => self.depth += 1,
            b'}' | b']' => {
                self.depth = self.depth.saturating_sub(1);
                if self.depth == 0 {
                    self.dead = true;
                }
            }
            _ => {}
        }
    }
}

/// The byte a one-letter JSON string escape (`\n`, `\"`, ...) stands for.
fn unescape(letter: u8) -> Option<u8> {
    match letter {
        b'"' | b'\\' | b'/' => Some(letter),
        b'b' => Some(0x08),
        b'f' => Some(0x0C),
        b'n' => Some(b'\n'),
        b'r' => Some(b'\r'),
        b't' => Some(b'\t'),
        _ => None,
    }
}

fn parse_number(digits: &[u8]) -> Option<RequestId> {
    let s = std::str::from_utf8(digits).ok()?;
    i64::from_str(s).ok().map(NumberOrString::Number)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn num(n: i64) -> Option<RequestId> {
        Some(NumberOrString::Number(n))
    }

    fn string(s: &str) -> Option<RequestId> {
        Some(NumberOrString::String(s.into()))
    }

    #[test]
    fn scanner_finds_top_level_ids() {
        let cases: &[(&str, Option<RequestId>)] = &[
            (r#"{"jsonrpc":"2.0","id":5,"result":{}}"#, num(5)),
            (r#"{"result":{"id":9,"x":[1,{"id":3}]},"id":12}"#, num(12)),
            (r#"{"jsonrpc":"2.0","id":"abc","result":{"#, string("abc")),
            (
                r#"{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"te"#,
                num(7),
            ),
            (r#"{"jsonrpc":"2.0","id":42"#, num(42)),
            (r#"{"text":"has \"id\":3 inside","id":-4}"#, num(-4)),
            (r#"{"jsonrpc":"2.0","id":null,"error":{}}"#, None),
            (r#"{"jsonrpc":"2.0","result":{}}"#, None),
            ("this is not json", None),
            (r#"[{"id":1}]"#, None),
        ];
        for (input, want) in cases {
            assert_eq!(&IdScanner::scan(input.as_bytes()), want, "input {input}");
        }
    }

    #[test]
    fn scanner_works_across_pieces() {
        let frame = br#"{"jsonrpc":"2.0","result":{"content":"xxxx"},"id":123}"#;
        for split in 0..frame.len() {
            let mut s = IdScanner::default();
            s.feed(&frame[..split]);
            s.feed(&frame[split..]);
            assert_eq!(s.finish(), num(123), "split at {split}");
        }
    }

    /// The properties, over messages written the way a server's JSON library writes them.
    mod properties {
        use super::*;
        use proptest::prelude::*;
        use serde_json::Value;

        /// Text that a careless scanner could take for an id: quotes, backslashes, braces,
        /// `"id"` written inside, control characters, any Unicode.
        fn text() -> impl Strategy<Value = String> {
            prop_oneof![
                Just(r#""id":5"#.to_owned()),
                Just(r#"{"id":"x"}, "id": 7"#.to_owned()),
                "[a-z0-9\"\\\\/:,{}\\[\\] \n\t]{0,12}",
                ".{0,12}",
            ]
        }

        fn key() -> impl Strategy<Value = String> {
            prop_oneof![
                prop::sample::select(vec![
                    "jsonrpc", "method", "params", "result", "error", "id", "ID", "ids", "i",
                    "\"id\"", "id ", "_meta",
                ])
                .prop_map(str::to_owned),
                text(),
            ]
        }

        /// Any JSON value; objects may hold `"id"` keys of their own.
        fn value() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::Bool),
                any::<i64>().prop_map(Value::from),
                any::<u64>().prop_map(Value::from),
                (-1e300f64..1e300).prop_map(Value::from),
                text().prop_map(Value::String),
            ];
            leaf.prop_recursive(3, 24, 4, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                    prop::collection::btree_map(key(), inner, 0..4)
                        .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        /// What a top-level `"id"` may hold: mostly ids (integers, strings, long strings), and
        /// sometimes what is not one (a float, an integer beyond `i64`, null, a structure).
        fn id() -> impl Strategy<Value = Value> {
            prop_oneof![
                4 => any::<i64>().prop_map(Value::from),
                3 => text().prop_map(Value::String),
                1 => "[a-z]{250,260}".prop_map(Value::String),
                2 => value(),
            ]
        }

        /// A message: its bytes, and where its id's value starts and ends in them. Every token
        /// is what serde_json writes (compact or pretty), with whitespace between tokens.
        #[derive(Debug)]
        struct Message {
            bytes: Vec<u8>,
            id: Option<(usize, usize)>,
        }

        fn message() -> impl Strategy<Value = Message> {
            (
                prop::collection::btree_map(key(), value(), 0..5),
                prop::option::of(id()),
                any::<prop::sample::Index>(),
                prop::collection::vec("[ \t\r\n]{0,2}", 64),
                any::<bool>(),
            )
                .prop_map(|(members, id, at, spaces, pretty)| {
                    let mut members: Vec<(String, Value)> =
                        members.into_iter().filter(|(k, _)| k != "id").collect();
                    if let Some(id) = id {
                        let at = at.index(members.len() + 1);
                        members.insert(at, ("id".to_owned(), id));
                    }
                    let mut spaces = spaces.iter().cycle();
                    let mut out = Vec::new();
                    let mut space = |out: &mut Vec<u8>| {
                        out.extend_from_slice(spaces.next().map_or("", String::as_str).as_bytes())
                    };
                    let json = |v: &Value| {
                        if pretty {
                            serde_json::to_vec_pretty(v)
                        } else {
                            serde_json::to_vec(v)
                        }
                        .unwrap()
                    };
                    let mut id_at = None;
                    space(&mut out);
                    out.push(b'{');
                    for (i, (key, v)) in members.iter().enumerate() {
                        if i > 0 {
                            space(&mut out);
                            out.push(b',');
                        }
                        space(&mut out);
                        out.extend_from_slice(&serde_json::to_vec(key).unwrap());
                        space(&mut out);
                        out.push(b':');
                        space(&mut out);
                        let start = out.len();
                        out.extend_from_slice(&json(v));
                        if key == "id" {
                            id_at = Some((start, out.len()));
                        }
                    }
                    space(&mut out);
                    out.push(b'}');
                    space(&mut out);
                    Message {
                        bytes: out,
                        id: id_at,
                    }
                })
        }

        /// The id as serde_json reads the message, in the terms requests are routed by: an
        /// integer that fits an `i64`, or a string.
        fn parsed_id(bytes: &[u8]) -> Option<RequestId> {
            let message: Value = serde_json::from_slice(bytes).unwrap();
            match message.get("id")? {
                Value::Number(n) => n.as_i64().map(NumberOrString::Number),
                Value::String(s) => Some(NumberOrString::String(s.as_str().into())),
                _ => None,
            }
        }

        /// An id the scanner must find: an integer, or a string of at most 256 bytes with no
        /// `\uXXXX` escape (it does not decode those, and says it cannot).
        fn plain(id: &RequestId, written: &[u8]) -> bool {
            match id {
                NumberOrString::Number(_) => true,
                NumberOrString::String(s) => {
                    s.len() <= 256 && !written.windows(2).any(|w| w == br"\u")
                }
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(1024))]

            /// It finds the top-level id serde_json parses, or says it cannot; never another
            /// one (a nested `"id"`, one written inside a string). Plain ids it always finds.
            #[test]
            fn finds_the_id_serde_json_parses(m in message()) {
                let parsed = parsed_id(&m.bytes);
                let scanned = IdScanner::scan(&m.bytes);
                prop_assert!(scanned.is_none() || scanned == parsed,
                    "scanned {scanned:?}, serde_json parsed {parsed:?}");
                if let (Some(id), Some((start, end))) = (&parsed, m.id)
                    && plain(id, &m.bytes[start..end])
                {
                    prop_assert_eq!(scanned, parsed);
                }
            }

            /// Fed in two pieces, split anywhere, it finds what it finds in one.
            #[test]
            fn pieces_do_not_matter(m in message(), at in any::<prop::sample::Index>()) {
                let at = at.index(m.bytes.len() + 1);
                let mut scanner = IdScanner::default();
                scanner.feed(&m.bytes[..at]);
                scanner.feed(&m.bytes[at..]);
                prop_assert_eq!(scanner.finish(), IdScanner::scan(&m.bytes));
            }

            /// A frame cut after its id still names it; one cut before its id names nothing.
            #[test]
            fn truncated_frames_name_the_id_they_hold(
                m in message(),
                at in any::<prop::sample::Index>(),
            ) {
                let whole = IdScanner::scan(&m.bytes);
                let at = at.index(m.bytes.len() + 1);
                match m.id {
                    Some((_, end)) if at >= end => {
                        prop_assert_eq!(IdScanner::scan(&m.bytes[..at]), whole);
                    }
                    Some((start, _)) if at <= start => {
                        prop_assert_eq!(IdScanner::scan(&m.bytes[..at]), None);
                    }
                    Some(_) => {}
                    None => prop_assert_eq!(IdScanner::scan(&m.bytes[..at]), None),
                }
            }
        }
    }
}
