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
                if self.escape {
                    self.escape = false;
                    s.push(b);
                } else if b == b'\\' {
                    self.escape = true;
                } else if b == b'"' {
                    self.found = std::str::from_utf8(s)
                        .ok()
                        .map(|s| NumberOrString::String(s.into()));
                    self.dead = self.found.is_none();
                } else if s.len() < 256 {
                    s.push(b);
                } else {
                    self.dead = true;
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
}
