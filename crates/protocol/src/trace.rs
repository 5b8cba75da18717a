//! Trace context: W3C `traceparent` values and a turn's place in a trace (docs/OBSERVABILITY.md).
//!
//! A client may hand a turn its trace context (the `traceparent` header, or `_meta.traceparent`
//! in an MCP request); toolwarden's spans then hang under the client's span, and each MCP
//! request toolwarden sends carries the context of the attempt that sends it.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A trace's id: 16 bytes, never all zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TraceId(pub [u8; 16]);

/// A span's id: 8 bytes, never all zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SpanId(pub [u8; 8]);

/// A W3C trace context `traceparent`: `00-<trace id>-<parent span id>-<flags>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TraceParent {
    /// The trace.
    pub trace_id: TraceId,
    /// The span the receiver's spans are children of.
    pub parent_id: SpanId,
    /// Trace flags; bit 0 is `sampled`.
    pub flags: u8,
}

/// A turn's place in a trace, as `turn_start` carries it when toolwarden exports spans.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnTrace {
    /// The trace (the client's, or a new one).
    pub trace_id: TraceId,
    /// The turn's own span.
    pub span_id: SpanId,
    /// The span the turn's span is a child of: the client's, or the parent turn's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_span_id: Option<SpanId>,
    /// Whether the trace is sampled (the client's flag; spans of an unsampled turn are not
    /// exported).
    pub sampled: bool,
}

impl TraceParent {
    /// Whether bit 0 (`sampled`) of the flags is set.
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    /// Parses a `traceparent` value. Version `00` must be exactly four fields; a later version
    /// may add fields after the fourth (they are ignored). Version `ff`, ids of all zeros and
    /// upper-case hex are invalid.
    pub fn parse(value: &str) -> Option<Self> {
        let value = value.trim_matches([' ', '\t']);
        let bytes = value.as_bytes();
        if bytes.len() < 55 || bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
            return None;
        }
        let version = hex_byte(&bytes[0..2])?;
        if version == 0xff || (version == 0 && bytes.len() != 55) {
            return None;
        }
        if bytes.len() > 55 && bytes[55] != b'-' {
            return None;
        }
        let mut trace = [0u8; 16];
        for (i, b) in trace.iter_mut().enumerate() {
            *b = hex_byte(&bytes[3 + 2 * i..5 + 2 * i])?;
        }
        let mut span = [0u8; 8];
        for (i, b) in span.iter_mut().enumerate() {
            *b = hex_byte(&bytes[36 + 2 * i..38 + 2 * i])?;
        }
        let flags = hex_byte(&bytes[53..55])?;
        if trace == [0; 16] || span == [0; 8] {
            return None;
        }
        Some(Self {
            trace_id: TraceId(trace),
            parent_id: SpanId(span),
            flags,
        })
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{}-{}-{:02x}",
            self.trace_id, self.parent_id, self.flags
        )
    }
}

/// Two lower-case hex digits.
fn hex_byte(pair: &[u8]) -> Option<u8> {
    fn digit(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        }
    }
    Some(digit(pair[0])? << 4 | digit(pair[1])?)
}

fn write_hex(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    for b in bytes {
        write!(f, "{b:02x}")?;
    }
    Ok(())
}

fn parse_hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    let bytes = s.as_bytes();
    if bytes.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (i, b) in out.iter_mut().enumerate() {
        *b = hex_byte(&bytes[2 * i..2 * i + 2])?;
    }
    Some(out)
}

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, &self.0)
    }
}

impl fmt::Display for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, &self.0)
    }
}

impl Serialize for TraceId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl Serialize for SpanId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TraceId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        parse_hex(&s)
            .map(TraceId)
            .ok_or_else(|| serde::de::Error::custom("a trace id is 32 lower-case hex digits"))
    }
}

impl<'de> Deserialize<'de> for SpanId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        parse_hex(&s)
            .map(SpanId)
            .ok_or_else(|| serde::de::Error::custom("a span id is 16 lower-case hex digits"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_traceparent_parses_and_prints_back() {
        let tp = TraceParent::parse(GOOD).expect("valid");
        assert_eq!(tp.to_string(), GOOD);
        assert!(tp.sampled());
        assert_eq!(tp.parent_id.to_string(), "00f067aa0ba902b7");
    }

    #[test]
    fn invalid_traceparents_are_refused() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?}");
        }
        // A later version may carry more fields.
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-more";
        assert_eq!(TraceParent::parse(later).map(|t| t.sampled()), Some(false));
    }

    #[test]
    fn a_turn_trace_serializes_as_hex() {
        let t = TurnTrace {
            trace_id: TraceId([0xab; 16]),
            span_id: SpanId([1; 8]),
            parent_span_id: None,
            sampled: true,
        };
        let v = serde_json::to_value(t).expect("serializes");
        assert_eq!(
            v,
            serde_json::json!({"trace_id": "abababababababababababababababab",
                               "span_id": "0101010101010101", "sampled": true})
        );
        assert_eq!(serde_json::from_value::<TurnTrace>(v).expect("back"), t);
    }
}
