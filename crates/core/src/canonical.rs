//! Canonical JSON (RFC 8785, JCS) and digests of it: the identity of a call's input for the cache
//! and the loop detector, and of a result for provenance.
//!
//! One deliberate deviation from RFC 8785: integers that serde_json holds exactly (`i64`/`u64`)
//! are written exactly. RFC 8785 formats every number as an IEEE double, which merges
//! `9007199254740993` with `9007199254740992` — two different ids would share a cache entry.
//! Floats are formatted as ECMAScript does (`ryu-js`), so `1.0` and `1` are the same key, as JCS
//! says they are.

use serde_json::Value;
use sha2::{Digest, Sha256};
use toolwarden_protocol::Content;

/// Where canonical bytes go: a buffer, or straight into a hasher.
trait Sink {
    fn put(&mut self, bytes: &[u8]);
    fn byte(&mut self, b: u8) {
        self.put(&[b]);
    }
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
    fn byte(&mut self, b: u8) {
        self.push(b);
    }
}

impl Sink for Sha256 {
    fn put(&mut self, bytes: &[u8]) {
        self.update(bytes);
    }
}

/// A hasher that also counts the bytes it was given.
struct Counted {
    hasher: Sha256,
    len: usize,
}

impl Sink for Counted {
    fn put(&mut self, bytes: &[u8]) {
        self.len += bytes.len();
        self.hasher.update(bytes);
    }
}

/// The length of the canonical JSON of a call's input, and the digest that identifies the call:
/// the SHA-256 of the tool's name, a NUL byte and that JSON (the cache's and the loop
/// detector's key: same tool, same canonical input).
pub fn measure_call(tool: &str, input: &Value) -> (usize, [u8; 32]) {
    let mut hasher = Sha256::new();
    hasher.update(tool.as_bytes());
    hasher.update([0u8]);
    measure_after(hasher, input)
}

/// The length and SHA-256 of the canonical JSON of `value`, without materializing it.
pub fn measure(value: &Value) -> (usize, [u8; 32]) {
    measure_after(Sha256::new(), value)
}

/// Feeds the canonical JSON of `value` to `hasher` (which may hold a prefix already): its length
/// and the final digest.
fn measure_after(hasher: Sha256, value: &Value) -> (usize, [u8; 32]) {
    let mut sink = Counted { hasher, len: 0 };
    write_value(&mut sink, value);
    (sink.len, sink.hasher.finalize().into())
}

/// The canonical JSON bytes of `value`.
pub fn to_canonical(value: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    write_value(&mut out, value);
    out
}

/// SHA-256 of the canonical JSON of `value`.
pub fn digest(value: &Value) -> [u8; 32] {
    let mut hasher = Sha256::new();
    write_value(&mut hasher, value);
    hasher.finalize().into()
}

/// SHA-256 of the canonical JSON of the object `{key: value, ...}`, without building it.
/// `entries` must be sorted by key as JCS orders them (plain ASCII keys sort bytewise).
pub fn digest_object(entries: &[(&str, ValueRef<'_>)]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.byte(b'{');
    for (i, (key, value)) in entries.iter().enumerate() {
        if i > 0 {
            hasher.byte(b',');
        }
        write_string(&mut hasher, key);
        hasher.byte(b':');
        match value {
            ValueRef::One(v) => write_value(&mut hasher, v),
            ValueRef::Contents(items) => {
                hasher.byte(b'[');
                for (j, item) in items.iter().enumerate() {
                    if j > 0 {
                        hasher.byte(b',');
                    }
                    match item {
                        // `{"text":...,"type":"text"}`: keys in canonical order.
                        Content::Text(text) => {
                            hasher.put(b"{\"text\":");
                            write_string(&mut hasher, text);
                            hasher.put(b",\"type\":\"text\"}");
                        }
                        Content::Other(value) => write_value(&mut hasher, value),
                    }
                }
                hasher.byte(b']');
            }
        }
    }
    hasher.byte(b'}');
    hasher.finalize().into()
}

/// A value of [`digest_object`]: one JSON value, or an array given as its items.
#[derive(Clone, Copy, Debug)]
pub enum ValueRef<'a> {
    /// One value.
    One(&'a Value),
    /// An array of content blocks, each as its JSON.
    Contents(&'a [Content]),
}

/// SHA-256 of some bytes.
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

fn write_value<S: Sink>(out: &mut S, value: &Value) {
    match value {
        Value::Null => out.put(b"null"),
        Value::Bool(true) => out.put(b"true"),
        Value::Bool(false) => out.put(b"false"),
        Value::Number(n) => {
            let mut digits = itoa::Buffer::new();
            if let Some(i) = n.as_i64() {
                out.put(digits.format(i).as_bytes());
            } else if let Some(u) = n.as_u64() {
                out.put(digits.format(u).as_bytes());
            } else if let Some(f) = n.as_f64() {
                write_float(out, f);
            } else {
                // Only reachable with serde_json's arbitrary_precision: keep the text as is.
                out.put(n.to_string().as_bytes());
            }
        }
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.byte(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.byte(b',');
                }
                write_value(out, item);
            }
            out.byte(b']');
        }
        Value::Object(map) => {
            // JCS orders keys by their UTF-16 code units, not by UTF-8 bytes. serde_json's map
            // usually iterates in byte order, which is the same unless keys mix characters above
            // U+FFFF with ones in U+E000..U+FFFF: write in place when already in order.
            let in_order = map
                .keys()
                .zip(map.keys().skip(1))
                .all(|(a, b)| a.encode_utf16().cmp(b.encode_utf16()).is_lt());
            out.byte(b'{');
            if in_order {
                for (i, (k, v)) in map.iter().enumerate() {
                    if i > 0 {
                        out.byte(b',');
                    }
                    write_string(out, k);
                    out.byte(b':');
                    write_value(out, v);
                }
            } else {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                entries.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
                for (i, (k, v)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.byte(b',');
                    }
                    write_string(out, k);
                    out.byte(b':');
                    write_value(out, v);
                }
            }
            out.byte(b'}');
        }
    }
}

fn write_float<S: Sink>(out: &mut S, f: f64) {
    if f == 0.0 {
        // -0 is written as 0.
        out.byte(b'0');
        return;
    }
    let mut buf = ryu_js::Buffer::new();
    out.put(buf.format(f).as_bytes());
}

fn write_string<S: Sink>(out: &mut S, s: &str) {
    let bytes = s.as_bytes();
    out.byte(b'"');
    // Copy runs that need no escaping in one piece.
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escaped: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            0x09 => b"\\t",
            0x0a => b"\\n",
            0x0c => b"\\f",
            0x0d => b"\\r",
            0..=0x1f => {
                let [high, low] = toolwarden_protocol::hex::byte(b);
                &[b'\\', b'u', b'0', b'0', high, low]
            }
            _ => continue,
        };
        out.put(&bytes[start..i]);
        out.put(escaped);
        start = i + 1;
    }
    out.put(&bytes[start..]);
    out.byte(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn check(input: Value, expected: &str) {
        assert_eq!(String::from_utf8(to_canonical(&input)).unwrap(), expected);
    }

    #[test]
    fn sorts_keys_and_drops_whitespace() {
        check(
            json!({"b": 1, "a": [true, null, "x"], "c": {"z": 0, "y": -1}}),
            r#"{"a":[true,null,"x"],"b":1,"c":{"y":-1,"z":0}}"#,
        );
    }

    #[test]
    fn orders_keys_by_utf16_code_units() {
        // U+1F600 is the surrogate pair D83D DE00 in UTF-16, so it sorts before U+E000 there,
        // while in UTF-8 (F0 9F 98 80 vs EE 80 80) it would sort after.
        check(
            json!({"\u{E000}": 2, "\u{1F600}": 1}),
            "{\"\u{1F600}\":1,\"\u{E000}\":2}",
        );
    }

    #[test]
    fn escapes_like_ecmascript() {
        check(
            json!("a\"b\\c\n\u{1}\u{7f}é/"),
            "\"a\\\"b\\\\c\\n\\u0001\u{7f}é/\"",
        );
    }

    #[test]
    fn numbers() {
        check(json!(1.0), "1");
        check(json!(-0.0), "0");
        check(json!(1e21), "1e+21");
        check(json!(0.000001), "0.000001");
        check(json!(1e-7), "1e-7");
        check(json!(123.456), "123.456");
        check(json!(u64::MAX), "18446744073709551615");
        check(json!(i64::MIN), "-9223372036854775808");
    }

    #[test]
    fn integers_beyond_2_pow_53_stay_distinct() {
        let a = json!({"id": 9_007_199_254_740_993u64});
        let b = json!({"id": 9_007_199_254_740_992u64});
        assert_ne!(digest(&a), digest(&b));
    }

    #[test]
    fn digest_object_equals_the_digest_of_the_built_object() {
        let items = [
            json!({"type": "text", "text": "hi \"there\"\n\u{E000}"}),
            json!({"type": "image", "data": "AA=="}),
            json!({"type": "text", "text": "annotated", "annotations": {"priority": 1}}),
        ];
        let structured = json!({"z": 1, "a": [1.5, "x"]});
        let contents: Vec<Content> = items.iter().cloned().map(Content::from_value).collect();
        assert!(
            matches!(contents[0], Content::Text(_)),
            "a plain text block"
        );
        let streamed = digest_object(&[
            ("content", ValueRef::Contents(&contents)),
            ("structuredContent", ValueRef::One(&structured)),
        ]);
        assert_eq!(
            streamed,
            digest(&json!({"content": items, "structuredContent": structured}))
        );
    }

    #[test]
    fn measure_agrees_with_the_bytes() {
        let v = json!({"b": [1, "two", {"\u{E000}": 2, "\u{1F600}": 1}], "a": null});
        let bytes = to_canonical(&v);
        assert_eq!(measure(&v), (bytes.len(), sha256(&bytes)));
        let mut named = b"search\0".to_vec();
        named.extend_from_slice(&bytes);
        assert_eq!(measure_call("search", &v), (bytes.len(), sha256(&named)));
        assert_ne!(measure_call("search", &v).1, measure_call("fetch", &v).1);
    }

    #[test]
    fn digests_are_written_sha256_and_hex() {
        let d = digest(&json!({}));
        let s = toolwarden_protocol::ContentDigest(d).to_string();
        assert!(s.starts_with("sha256:"));
        assert_eq!(s.len(), 7 + 64);
        // sha256("{}")
        assert_eq!(
            s,
            "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|i| json!(i)),
            any::<u64>().prop_map(|u| json!(u)),
            (-1e300f64..1e300).prop_map(|f| json!(f)),
            ".{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(".{0,6}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Canonical bytes are valid JSON that means the same value, and canonicalizing is idempotent.
        #[test]
        fn canonical_is_json_of_the_same_value(v in arb_json()) {
            let bytes = to_canonical(&v);
            let back: Value = serde_json::from_slice(&bytes).unwrap();
            prop_assert_eq!(to_canonical(&back), bytes);
        }

        /// Key order never changes the key.
        #[test]
        fn key_order_is_irrelevant(m in prop::collection::btree_map(".{0,6}", any::<i64>(), 0..8)) {
            let forward: serde_json::Map<String, Value> = m.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
            let reverse: serde_json::Map<String, Value> = m.iter().rev().map(|(k, v)| (k.clone(), json!(v))).collect();
            prop_assert_eq!(digest(&Value::Object(forward)), digest(&Value::Object(reverse)));
        }

        /// Distinct integers never share a key (the flaw of float-only canonicalization).
        #[test]
        fn distinct_integers_have_distinct_keys(a in any::<i64>(), b in any::<i64>()) {
            prop_assume!(a != b);
            prop_assert_ne!(digest(&json!({"n": a})), digest(&json!({"n": b})));
        }

        #[test]
        fn distinct_unsigned_integers_have_distinct_keys(a in any::<u64>(), b in any::<u64>()) {
            prop_assume!(a != b);
            prop_assert_ne!(digest(&json!([a])), digest(&json!([b])));
        }
    }
}
