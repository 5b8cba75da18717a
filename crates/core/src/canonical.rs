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

/// The canonical JSON bytes of `value`.
pub fn to_canonical(value: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    write_value(&mut out, value);
    out
}

/// SHA-256 of the canonical JSON of `value`.
pub fn digest(value: &Value) -> [u8; 32] {
    sha256(&to_canonical(value))
}

/// SHA-256 of some bytes.
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// `sha256:` followed by the lowercase hex of a digest.
pub fn digest_string(d: &[u8; 32]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(7 + 64);
    s.push_str("sha256:");
    for b in d {
        s.push(HEX[(b >> 4) as usize] as char);
        s.push(HEX[(b & 15) as usize] as char);
    }
    s
}

fn write_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                out.extend_from_slice(i.to_string().as_bytes());
            } else if let Some(u) = n.as_u64() {
                out.extend_from_slice(u.to_string().as_bytes());
            } else if let Some(f) = n.as_f64() {
                write_float(out, f);
            } else {
                // Only reachable with serde_json's arbitrary_precision: keep the text as is.
                out.extend_from_slice(n.to_string().as_bytes());
            }
        }
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(out, item);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            // JCS orders keys by their UTF-16 code units, not by UTF-8 bytes.
            entries.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            out.push(b'{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(out, k);
                out.push(b':');
                write_value(out, v);
            }
            out.push(b'}');
        }
    }
}

fn write_float(out: &mut Vec<u8>, f: f64) {
    if f == 0.0 {
        // -0 is written as 0.
        out.push(b'0');
        return;
    }
    let mut buf = ryu_js::Buffer::new();
    out.extend_from_slice(buf.format(f).as_bytes());
}

fn write_string(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    for &b in s.as_bytes() {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x09 => out.extend_from_slice(b"\\t"),
            0x0a => out.extend_from_slice(b"\\n"),
            0x0c => out.extend_from_slice(b"\\f"),
            0x0d => out.extend_from_slice(b"\\r"),
            0..=0x1f => {
                out.extend_from_slice(b"\\u00");
                out.push(HEX[(b >> 4) as usize]);
                out.push(HEX[(b & 15) as usize]);
            }
            _ => out.push(b),
        }
    }
    out.push(b'"');
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
    fn digest_string_format() {
        let d = digest(&json!({}));
        let s = digest_string(&d);
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
